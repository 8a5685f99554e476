"""Is the cluster healthy and fast, and does it train over its fastest network? The hosts have two networks, as GPU
servers do: the hosts.txt network at 100 Mbit/s and a fabric at 1 Gbit/s that the workstation is not on, beside a
decoy docker0 with the same address on every host. `kit up` (with no setting) finds the fabric by measurement and
trains over it; `kit doctor` on the healthy cluster (sshfs storage, so the shared workspace is checked for real);
`kit bench net` with one host's fabric link slower than the others'; `kit bench allreduce` against the fabric's
rate; then each fault made for real on one lab host: doctor fails on that host's line, with the fix, and on no other
host's; last, one host's fabric port down."""

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from harness import lab_cluster, wait_for
from helpers import run_kit

pytestmark = [pytest.mark.lab, pytest.mark.alone]  # bandwidth against the links' rates: nothing else runs
NAME, CONTAINER, PORT = "doc", "kit-doc", 12345


HOSTS_RATE, FABRIC_RATE, FABRIC_GBITS = "100mbit", "1gbit", 1.0


def two_networks(lab) -> None:
    """The module's links: the hosts.txt network slow, the fabric ten times faster."""
    lab.unshape()
    lab.shape(HOSTS_RATE)
    lab.shape_fabric(FABRIC_RATE)


@pytest.fixture(scope="module")
def up(project, lab, tmp_path_factory):
    """The cluster, brought up on hosts with a fabric and decoys; (its folder, what kit up printed)."""
    folder = tmp_path_factory.mktemp("doctor")
    config = yaml.safe_load((project / "kit.yaml").read_text())
    config["cluster"] = {"name": NAME, "storage": "sshfs"}
    (folder / "kit.yaml").write_text(yaml.safe_dump(config))
    (folder / "hosts.txt").write_text((project / "hosts.txt").read_text())
    lab.fabric()
    try:
        two_networks(lab)
        with lab_cluster(lab, folder, NAME, "--hosts", "hosts.txt") as said:
            yield folder, said.stdout
    finally:
        lab.unshape()
        lab.no_fabric()


@pytest.fixture(scope="module")
def cluster(up):
    return up[0]


def test_kit_up_finds_the_fabric_by_measurement_and_trains_over_it(up, lab):
    """No setting: of the hosts.txt network and the fabric (both report 10 Gbit/s, as veths do), the probe finds the
    fabric ten times faster; docker0's shared address joins nothing. The choice is one line, and recorded."""
    folder, said = up
    hosts = [h.address for h in lab.hosts]
    assert re.search(r"training network: 10\.232\.0\.0/24 \(fabric0\), 0\.9\d Gbit/s measured, 3 of 3 hosts; ssh "
                     r"over 10\.231\.77\.0/24 \(measured, against 10\.231\.77\.0/24 0\.\d\d Gbit/s\)", said), said
    recorded = json.loads((lab.home / ".kit" / NAME / "state.json").read_text())["network"]
    decision = recorded["decision"]
    assert (decision["network"], decision["ssh"], recorded["setting"]) == ("10.232.0.0/24", False, "")
    assert {h: (m["iface"], m["address"]) for h, m in decision["members"].items()} == \
           {h.address: ("fabric0", h.fabric_address) for h in lab.hosts}
    assert "172.17.0.1 (docker0) on " + ", ".join(hosts) + ": an address several hosts have joins nothing " \
           "(as docker0's 172.17.0.1)" in decision["notes"]
    again = run_kit("up", cwd=folder, env=lab.env, timeout=600)
    assert again.returncode == 0 and "no change" in again.stdout, again.stdout + again.stderr
    assert re.search(r"training network: 10\.232\.0\.0/24 \(fabric0\), 0\.9\d Gbit/s measured before, 3 of 3 hosts",
                     again.stdout), again.stdout  # the hosts' networks read the same: no survey, the choice recorded


def doctor(folder, lab, *args):
    r = run_kit("doctor", "--json", *args, cwd=folder, env=lab.env, timeout=300)
    return r.returncode, json.loads(r.stdout) if r.stdout.strip().startswith("{") else r


def test_a_healthy_cluster_is_all_ok(cluster, lab):
    r = run_kit("doctor", cwd=cluster, env={**lab.env, "COLUMNS": "200"}, timeout=300)
    assert r.returncode == 0 and "cluster doc is healthy" in r.stdout, r.stdout + r.stderr
    code, report = doctor(cluster, lab)
    assert code == 0 and report["failed"] == report["warnings"] == 0, [f for f in report["findings"] if f["level"] != "ok"]
    checks = {(f["host"], f["check"]) for f in report["findings"]}
    for h in lab.hosts:
        for check in ("ssh", "docker", "docker disk", "port", "listening", "container", "image", "shm", "memlock",
                      "workspace disk", "clock", "nic", "ssh mesh"):
            assert (h.address, check) in checks, (h.address, check, report)
    assert {(f["host"], f["check"]) for f in report["findings"] if f["check"] == "workspace"} == \
           {(h.address, "workspace") for h in lab.hosts[1:]}  # the primary wrote, the two others read
    before = run_kit("doctor", "--json", "--hosts", "hosts.txt", cwd=cluster, env=lab.env, timeout=300)
    assert before.returncode == 0, before.stdout + before.stderr  # the host-level checks, as before `kit up`
    assert "held by this cluster's container" in before.stdout


def test_bench_net_names_the_host_whose_link_is_slow(cluster, lab):
    """Over the training network: one host's fabric link at 100 Mbit/s, the others' at 1 Gbit/s."""
    lab.shape_fabric("100mbit", [lab.hosts[2]])
    try:
        r = run_kit("bench", "net", "--seconds", "2", "--json", cwd=cluster, env=lab.env, timeout=600)
        text = run_kit("bench", "net", "--seconds", "1", cwd=cluster, env={**lab.env, "COLUMNS": "200"}, timeout=600)
    finally:
        two_networks(lab)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    slow = lab.hosts[2].address
    assert data["slow_host"] == slow, data
    assert len(data["links"]) == 6 and {(l["source"], l["target"]) for l in data["slowest"]} == \
           {(slow, h.address) for h in lab.hosts[:2]} | {(h.address, slow) for h in lab.hosts[:2]}, data
    fast = [l["gbits"] for l in data["links"] if slow not in (l["source"], l["target"])]
    assert min(fast) > 3 * max(l["gbits"] for l in data["slowest"]), data  # 1 Gbit/s against 100 Mbit/s
    assert text.returncode == 0 and f"every link within 10% of it touches {slow}" in text.stdout, text.stdout
    assert data["network"] == "10.232.0.0/24 (fabric0), not the hosts.txt network", data
    assert "TCP throughput over 10.232.0.0/24 (fabric0)" in text.stdout, text.stdout


def saved(lab, kind):
    """The figures the last `kit bench KIND` saved in the cluster's folder."""
    return json.loads(sorted((lab.home / ".kit" / NAME / "bench").glob(f"{kind}-*.json"))[-1].read_text())


def is_png(path):
    return Path(path).is_file() and Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_allreduce_gives_each_backends_bus_bandwidth_against_the_link(cluster, lab):
    """Over the fabric kit chose: at 64 MiB each backend's bus bandwidth reaches 0.85 of the fabric's 1 Gbit/s (over
    the hosts.txt network it could not pass 0.1 of it). Horovod over horovodrun, torch.distributed over torchrun."""
    r = run_kit("bench", "allreduce", "--min-size", "16M", "--max-size", "64M", "--seconds", "0.5", cwd=cluster,
                env={**lab.env, "COLUMNS": "200"}, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    data = saved(lab, "allreduce")
    assert data["link_from"] == "kit bench net" and data["link_gbits"] > 0.9 * FABRIC_GBITS, data
    assert data["network"] == "10.232.0.0/24 (fabric0), not the hosts.txt network", data
    sizes = [16 << 20, 64 << 20]
    assert [(x["backend"], x["transport"], x["bytes"]) for x in data["results"]] == \
           [(b, "gloo", s) for b in ("horovod", "torch") for s in sizes], data
    for x in data["results"]:
        assert x["ranks"] == 3 and x["iters"] >= 3 and x["seconds"] > 0, x
        assert x["busbw_gbits"] == pytest.approx(x["algbw_gbits"] * 4 / 3), x  # 2(n-1)/n, n = 3
        assert x["busbw_per_link"] == pytest.approx(x["busbw_gbits"] / data["link_gbits"]), x
    at_64 = {x["backend"]: x["busbw_gbits"] for x in data["results"] if x["bytes"] == 64 << 20}
    assert min(at_64.values()) >= 0.85 * FABRIC_GBITS, at_64
    assert data["headline_bytes"] == 64 << 20 and set(data["headline"]) == {"Horovod (gloo)",
                                                                            "torch.distributed (gloo)"}, data
    assert is_png(data["png"]), data
    for label, ratio in data["headline"].items():
        assert f"{label}: busbw / link at 64 MiB = {ratio:.2f}" in r.stdout, r.stdout
    assert "slowest `kit bench net` measured over 10.232.0.0/24 (fabric0)" in r.stdout
    assert "Horovod (gloo) allreduce, 3 ranks" in r.stdout
    given = run_kit("bench", "allreduce", "--backend", "horovod", "--max-size", "1K", "--link-gbits", "2", "--json",
                    cwd=cluster, env=lab.env, timeout=900)
    assert given.returncode == 0, given.stdout + given.stderr
    data = json.loads(given.stdout)
    assert data["link_from"] == "--link-gbits" and [x["bytes"] for x in data["results"]] == [1024], data


def test_bench_train_prints_the_scaling_table_and_draws_it(cluster, lab):
    r = run_kit("bench", "train", "--hosts", "1,3", "--epochs", "2", "--samples", "768", cwd=cluster,
                env={**lab.env, "COLUMNS": "200"}, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    data = saved(lab, "train")
    one, three = data["runs"]
    assert (one["hosts"], one["ranks"], three["hosts"], three["ranks"]) == (1, 1, 3, 3), data
    assert one["images_per_sec"] > 0 and three["images_per_sec"] > 0 and one["speedup"] == 1, data
    assert three["efficiency"] == pytest.approx(three["images_per_sec"] / one["images_per_sec"] / 3), data
    assert data["data"] == "generated" and is_png(data["png"]), data
    for row in data["runs"]:  # the table, as printed
        assert re.search(rf"│\s+{row['hosts']} │\s+{row['ranks']} │\s+{row['images_per_sec']:,.0f} │\s+"
                         rf"{row['speedup']:.2f}x │\s+{row['efficiency']:.0%} │ {row['job']} │", r.stdout), r.stdout
    jobs = [json.loads(line) for line in run_kit("jobs", "--json", cwd=cluster, env=lab.env).stdout.splitlines()]
    assert {(j["id"], j["state"]) for j in jobs} >= {(one["job"], "succeeded"), (three["job"], "succeeded")}, jobs


def test_a_fabric_port_down_leaves_the_fabric_out_and_a_setting_that_needs_it_is_refused(cluster, lab):
    """One host's fabric port goes down: kit up names the fabric as missing that host and trains over the hosts.txt
    network; doctor warns on that host; cluster.network naming the fabric is refused before anything changes, naming
    the host. With the port up again and no setting, kit up measures again and goes back to the fabric."""
    h = lab.hosts[1]
    config = cluster / "kit.yaml"
    plain = config.read_text()
    state = lab.home / ".kit" / NAME / "state.json"
    lab.fabric_link(h, False)
    try:
        r = run_kit("up", cwd=cluster, env=lab.env, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "training network: 10.231.77.0/24 (eth0), 10 Gbit/s, 3 of 3 hosts; the hosts.txt network" in r.stdout
        assert f"10.232.0.0/24 (fabric0) misses {h.address} (fabric0 is down there): not used" in r.stdout
        code, report = doctor(cluster, lab)
        warned = [f for f in report["findings"] if f["check"] == "network" and f["level"] != "ok"]
        assert [(f["host"], f["level"]) for f in warned] == [(h.address, "warn")], report
        assert "10.232.0.0/24 (fabric0) joins 2 other hosts but not this one: fabric0 is down there" in warned[0]["text"]
        config.write_text(yaml.safe_dump({**yaml.safe_load(plain), "cluster": {
            **yaml.safe_load(plain)["cluster"], "network": "10.232.0.0/24"}}))
        before = (state.read_text(), h.docker("inspect", "--format", "{{.State.StartedAt}}", CONTAINER).stdout)
        refused = run_kit("up", cwd=cluster, env=lab.env, timeout=600)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert re.search(rf"kit\.yaml:\d+: cluster\.network: 10\.232\.0\.0/24 does not join every host: it misses "
                         rf"{re.escape(h.address)} \(fabric0 is down there\)", refused.stderr), refused.stderr
        assert (state.read_text(), h.docker("inspect", "--format", "{{.State.StartedAt}}", CONTAINER).stdout) == before
    finally:
        config.write_text(plain)
        lab.fabric_link(h, True)
    back = run_kit("up", cwd=cluster, env=lab.env, timeout=600)
    assert back.returncode == 0 and "training network: 10.232.0.0/24 (fabric0)" in back.stdout, back.stdout


# A job is root in its container: it can replace what doctor runs there (nvidia-smi here) and name its processes.
# Each try puts another line break of str.splitlines (not a line feed) before a forged section that lists no socket.
FORGED = "".join(f"{brk}@@kit {name}" for brk in ("\x0b", "\r", "\x1c", "\u2028", "\x85", "\x0c")
                 for name in ("listen", "owners", "cpidns"))
FORGER = "#!/bin/sh\nprintf '%s\\n' " + shlex.quote("No devices were found" + FORGED) + "\n"
BACKDOOR = ("import ctypes, socket, time; ctypes.CDLL(None).prctl(15, b'\\x0b@@kit listen', 0, 0, 0); "
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('0.0.0.0', 23456)); s.listen(); time.sleep(600)")


def test_a_container_cannot_forge_a_doctor_section(cluster, lab):
    h = lab.hosts[1]
    h.docker("exec", CONTAINER, "sh", "-c", 'printf %s "$1" > /usr/local/bin/nvidia-smi && chmod +x "$0"',
             "/usr/local/bin/nvidia-smi", FORGER)
    h.docker("exec", "-d", CONTAINER, "sh", "-c", f"echo $$ > /tmp/backdoor.pid && exec python3 -c "
             f"{shlex.quote(BACKDOOR)}")
    try:
        wait_for("the backdoor's socket", lambda: h.listening(23456), timeout=30)
        said = h.docker("exec", CONTAINER, "nvidia-smi", "-L").stdout
        assert said.count("@@kit listen") == 6, repr(said)  # the forger is what doctor runs there
        code, report = doctor(cluster, lab)
    finally:
        h.docker("exec", CONTAINER, "sh", "-c", "kill $(cat /tmp/backdoor.pid); rm -f /usr/local/bin/nvidia-smi "
                 "/tmp/backdoor.pid", check=False)
    warned = [f for f in report["findings"] if f["level"] == "warn"]
    assert [(f["host"], f["check"]) for f in warned] == [(h.address, "listening")], report
    assert "kit?listen on 0.0.0.0 port 23456" in warned[0]["text"], warned  # its name, made harmless


@contextlib.contextmanager
def sshd_stopped(lab, h, folder):
    pid = int(h.docker("inspect", "--format", "{{.State.Pid}}", CONTAINER).stdout)
    os.kill(pid, signal.SIGSTOP)  # it still holds the port; connections get no answer
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def port_taken(lab, h, folder):
    h.docker("stop", CONTAINER)
    squatter = subprocess.Popen([*h.nsenter, "python3", "-c", "import socket, time; s = socket.socket(); "
                                 # as servers do: the SSH mesh doctor ran a moment ago leaves TIME_WAIT sockets
                                 "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                                 f"s.bind(('{h.address}', {PORT})); s.listen(); time.sleep(600)"])
    try:
        def up() -> bool:
            assert squatter.poll() is None, "the other program could not take the port (its error is above)"
            return h.listening(PORT)
        wait_for("the other program on the port", up, timeout=30)
        yield
    finally:
        squatter.kill()
        squatter.wait(timeout=30)
        h.docker("start", CONTAINER)
        wait_for("the container's sshd", lambda: h.listening(PORT), timeout=60)


@contextlib.contextmanager
def image_replaced(lab, h, folder):
    tag = json.loads(run_kit("status", "--json", cwd=folder, env=lab.env, timeout=300).stdout)["image"]
    old = h.docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    h.docker("commit", CONTAINER, tag)  # the tag now names another image; the container runs the old one
    try:
        yield
    finally:
        new = h.docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
        h.docker("tag", old, tag)
        h.docker("rmi", new)


@contextlib.contextmanager
def small_shm(lab, h, folder):
    h.run_in("mount", "-t", "tmpfs", "-o", "size=64m", "kitlab-shm", "/dev/shm")  # in this host's mount namespace
    try:
        h.docker("restart", CONTAINER)  # --ipc=host: the container gets the host's /dev/shm when it starts
        wait_for("the container's sshd", lambda: h.listening(PORT), timeout=60)
        yield
    finally:
        h.run_in("umount", "/dev/shm", check=False)
        h.docker("restart", CONTAINER)
        wait_for("the container's sshd", lambda: h.listening(PORT), timeout=60)


@contextlib.contextmanager
def clock_off(lab, h, folder):
    with lab.clock_off(h, "+10m"):
        yield


@contextlib.contextmanager
def workspace_unshared(lab, h, folder):
    for pid in h.processes(r"^sshfs "):  # the mount stays, dead: "Transport endpoint is not connected"
        os.kill(pid, signal.SIGKILL)
    yield  # left so: the last fault; kit down unmounts it and removes the folder


FAULTS = [  # (fault, the lab host it is made on, the check that fails there, words of its line, words of its fix)
    (sshd_stopped, 1, "ssh mesh", "fails from", "kit up"),
    (port_taken, 2, "port", "held by python3", "cluster.ssh_port"),
    (image_replaced, 2, "image", "the cluster's is", "loads the cluster's image"),
    (small_shm, 1, "shm", "is 64 MiB", "cluster.shm_size"),
    (clock_off, 2, "clock", "10.0 min ahead of the others", "NTP"),
    (workspace_unshared, 2, "workspace", "transport endpoint is not connected", "kit up"),
]


@pytest.mark.parametrize("fault, index, check, words, fix", FAULTS, ids=[f[0].__name__ for f in FAULTS])
def test_a_fault_on_one_host_is_a_fail_line_naming_it_with_the_fix(cluster, lab, fault, index, check, words, fix):
    h = lab.hosts[index]
    with fault(lab, h, cluster):
        code, report = doctor(cluster, lab)
    assert code == 1, report
    failed = [f for f in report["findings"] if f["level"] == "fail"]
    mine = [f for f in failed if f["host"] == h.address and f["check"] == check]
    assert mine and words in mine[0]["text"] and fix in mine[0]["fix"], failed
    assert not [f for f in failed if f["host"] != h.address], failed  # the other hosts are not blamed

