"""`kit up / status / down` on three lab hosts (network namespaces, each with its own sshd and dockerd)."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from harness import ClusterUpFailed, kit, lab_cluster
from helpers import run_kit

pytestmark = pytest.mark.lab
CONTAINER = "kit-lab"
PORT = 12345


def containers(h) -> list[dict]:
    out = h.docker("ps", "-a", "--filter", "label=io.kit.cluster", "--format", "{{json .}}").stdout
    return [json.loads(line) for line in out.splitlines()]


def started_at(h) -> str:
    return h.docker("inspect", "--format", "{{.Id}} {{.State.StartedAt}}", CONTAINER).stdout.strip()


def primary_exec(lab, *argv, check=False):
    return lab.hosts[0].docker("exec", CONTAINER, *argv, check=check)


def assert_nothing_on_hosts(lab, project):
    for h in lab.hosts:
        assert containers(h) == [], h.name
        assert h.kit_files() == [], h.name
        assert not h.listening(PORT), h.name
        assert h.processes(f"sshd .*-p {PORT}") == [], h.name
    assert not (lab.home / ".kit" / "lab").exists()


@pytest.fixture
def down_after(project, lab):
    yield
    r = kit(project, lab, "down")
    assert r.returncode == 0, r.stderr


def test_up_twice_then_down_twice(project, lab):
    r = kit(project, lab, "up", "--hosts", "hosts.txt", "--shm-size", "1g")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "✓ cluster lab is up on 3 hosts" in r.stdout
    assert "NCCL" not in r.stdout + r.stderr  # the NCCL path is the gpu flavor's alone to check and report
    for h in lab.hosts:
        (c,) = containers(h)
        assert c["Names"] == CONTAINER and c["State"] == "running", h.name
        assert any("loaded image" in line for line in r.stdout.splitlines() if line.strip().startswith(h.address))

    # From the primary's container, every container answers on the cluster port under strict checking,
    # and each is really a different host.
    for h in lab.hosts:
        s = primary_exec(lab, "ssh", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", h.address, "hostname")
        assert s.returncode == 0 and s.stdout.strip() == h.name, s.stderr
    check = primary_exec(lab, "horovodrun", "--check-build")
    assert "[X] PyTorch" in check.stdout and check.returncode == 0

    before = {h.name: started_at(h) for h in lab.hosts}
    again = kit(project, lab, "up", "--hosts", "hosts.txt")  # --shm-size left out: kept, not the default
    assert again.returncode == 0, again.stderr
    assert "cluster lab keeps the settings it was brought up with: shm_size 1g" in again.stdout
    assert "✓ cluster lab is up on 3 hosts: no change" in again.stdout
    assert "loaded image" not in again.stdout and "started container" not in again.stdout
    assert {h.name: started_at(h) for h in lab.hosts} == before

    # A forgotten --hosts brings the cluster up where it is, and says where; nothing is taken from its hosts.
    bare = kit(project, lab, "up")
    assert bare.returncode == 0, bare.stdout[-3000:] + bare.stderr[-3000:]
    used = ", ".join(h.address for h in lab.hosts)
    assert f"cluster lab was brought up on {used}: bringing it up there" in bare.stdout
    assert "✓ cluster lab is up on 3 hosts: no change" in bare.stdout and "removed" not in bare.stdout
    local = kit(project, lab, "up", "--local")
    assert local.returncode == 2 and "cluster lab runs on servers" in local.stderr, local.stderr
    assert {h.name: started_at(h) for h in lab.hosts} == before
    for h in lab.hosts:
        assert [c["State"] for c in containers(h)] == ["running"], h.name

    st = kit(project, lab, "status", "--json")
    assert st.returncode == 0, st.stderr
    rows = json.loads(st.stdout)["hosts"]
    assert [(r["address"], r["container"], r["image_matches"], r["port_listening"]) for r in rows] == \
           [(h.address, "running", True, True) for h in lab.hosts]

    gone = kit(project, lab, "down")
    assert gone.returncode == 0, gone.stderr
    assert_nothing_on_hosts(lab, project)
    twice = kit(project, lab, "down")
    assert twice.returncode == 0 and "nothing to remove" in twice.stdout


def test_changed_host_key_of_a_host_is_refused(project, lab):
    h2 = lab.hosts[1]
    lab.rekey(h2)
    try:
        r = kit(project, lab, "up", "--hosts", "hosts.txt")
        assert r.returncode == 1
        assert f"{h2.address}: the SSH host key of {h2.address} does not match your known_hosts" in r.stderr
        assert "ssh-keygen -R" in r.stderr
        assert_nothing_on_hosts(lab, project)
    finally:
        lab.trust(h2)


def test_unreachable_host_fails_preflight_naming_it_and_changes_nothing(project, lab):
    h3 = lab.hosts[2]
    lab.block(h3)
    try:
        r = kit(project, lab, "up", "--hosts", "hosts.txt", timeout=120)  # the bound: no hang
    finally:
        lab.unblock(h3)
    assert r.returncode == 1
    assert r.stderr.startswith(f"error: connecting failed on 1 host: {h3.address}")
    assert f"{h3.address}: no answer on SSH port 22 within 10 s" in r.stderr
    assert "firewall" in r.stderr
    assert_nothing_on_hosts(lab, project)


def test_image_load_killed_mid_way_is_named_and_a_rerun_completes(project, lab, down_after):
    h3 = lab.hosts[2]
    h3.docker("image", "rm", "-f", "kit-horovod", check=False)  # so that h3 must load it
    for tag in h3.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
        h3.docker("image", "rm", "-f", tag, check=False)
    killed: list[int] = []

    def kill_load() -> None:  # the load on h3 dies half-way, as if the host ran out of luck
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            pids = h3.processes(r"^docker load")
            if pids:
                time.sleep(1)
                for pid in pids:
                    os.kill(pid, 9)
                killed.extend(pids)
            time.sleep(0.2)

    killer = threading.Thread(target=kill_load)
    killer.start()
    r = kit(project, lab, "up", "--hosts", "hosts.txt")
    killer.join()
    assert killed, "the image load on h3 was never seen"
    assert r.returncode == 1
    assert re.search(rf"^  {re.escape(h3.address)}: loading image kit-horovod:cpu-\w+ failed \(exit 137\)",
                     r.stderr, re.M), r.stderr
    assert "command: docker load && echo loaded" in r.stderr
    assert "kit-horovod" not in h3.docker("images").stdout  # nothing of the cut load was kept
    again = kit(project, lab, "up", "--hosts", "hosts.txt")
    assert again.returncode == 0, again.stderr
    assert f"{h3.address}: loaded image" in again.stdout
    assert "✓ cluster lab is up on 3 hosts" in again.stdout


def test_dry_run_changes_nothing(project, lab):
    r = kit(project, lab, "up", "--hosts", "hosts.txt", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "dry run: nothing was changed" in r.stdout
    assert f"{lab.hosts[0].address}: docker run -d --name kit-lab" in r.stdout
    for h in lab.hosts:
        assert containers(h) == [] and h.kit_files() == []
    assert not (lab.home / ".kit" / "lab" / "state.json").exists()


def test_a_modules_cluster_whose_up_fails_half_way_leaves_nothing_on_any_host(project, lab):
    """The lab's cluster fixture when `kit up` stops at its last step (the SSH check from the primary's container,
    after keys, image, workspaces and containers are in place on every host): kit down removes it all, and the
    fixture raises the up failure itself, not a LeftBehind."""
    h3 = lab.hosts[2]
    drop = ["INPUT", "-p", "tcp", "--dport", str(PORT), "-j", "DROP"]  # h3's firewall drops the cluster port
    h3.run_in("iptables", "-I", *drop)
    try:
        with pytest.raises(ClusterUpFailed) as failed:
            with lab_cluster(lab, project, "lab", "--hosts", "hosts.txt"):
                pytest.fail("kit up succeeded although h3 drops the cluster port")
    finally:
        h3.run_in("iptables", "-D", *drop, check=False)
    assert f"SSH from the primary's container failed on 1 host: {h3.address}" in str(failed.value), failed.value
    assert lab.leftovers("lab") == {}
    assert_nothing_on_hosts(lab, project)


def test_down_force_forgets_a_host_that_is_gone_saying_what_may_remain(project, lab):
    assert kit(project, lab, "up", "--hosts", "hosts.txt").returncode == 0
    h3 = lab.hosts[2]
    lab.block(h3)
    try:
        r = kit(project, lab, "down", "--force", timeout=120)
    finally:
        lab.unblock(h3)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"forgot {h3.address} (no answer on SSH port 22 within 10 s): what kit made there may remain: " \
           "container kit-lab" in r.stderr
    assert not (lab.home / ".kit" / "lab").exists()
    assert [c["Names"] for c in containers(h3)] == ["kit-lab"]  # left, as said; the lab removes it
    lab.remove_cluster("lab")


def test_down_started_while_up_runs_is_refused_naming_the_up(project, lab):
    lock = lab.home / ".kit" / ".locks" / "lab"
    up = subprocess.Popen([sys.executable, "-m", "kit", "up", "--hosts", "hosts.txt"], cwd=project,
                          env={**os.environ, **lab.env, "COLUMNS": "200"}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (lock.exists() and lock.read_text()):
            time.sleep(0.1)
        down = kit(project, lab, "down")
        assert down.returncode == 1, down.stdout + down.stderr
        assert down.stderr.startswith(f"error: cluster lab is busy: `kit up --hosts hosts.txt` (pid {up.pid}, since ")
        out, err = up.communicate(timeout=600)
        assert up.returncode == 0, out[-3000:] + err[-3000:]  # the up went on undisturbed
        assert kit(project, lab, "status").returncode == 0
    finally:
        up.kill()
        assert kit(project, lab, "down").returncode == 0
    assert_nothing_on_hosts(lab, project)


def test_hosts_behind_a_jump_host_are_checked_and_reached_at_their_own_address(project, lab):
    """ProxyJump in the user's ssh config: every hop's host key is checked as the host's own, and each host's
    address is its own (the cluster's known_hosts, horovodrun's -H), not the jump host's."""
    h1, h2, h3 = lab.hosts
    config = lab.home / ".ssh" / "config"
    config.write_text(f"Host {h2.address} {h3.address}\n    ProxyJump root@{h1.address}\n")
    try:
        r = kit(project, lab, "up", "--hosts", "hosts.txt")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        state = json.loads((lab.home / ".kit" / "lab" / "state.json").read_text())
        assert [(h["name"], h["address"]) for h in state["hosts"]] == [(h.address, h.address) for h in lab.hosts]
        assert kit(project, lab, "down").returncode == 0
        lab.rekey(h1)  # the jump host now shows another key: nobody may pose as it on the way to h2 and h3
        r = kit(project, lab, "up", "--hosts", "hosts.txt")
        assert r.returncode == 1, r.stdout + r.stderr
        for h in (h2, h3):
            assert f"{h.address}: the SSH host key of {h1.address}, the jump host on the way to {h.address}, does " \
                   "not match your known_hosts" in r.stderr, r.stderr
        assert_nothing_on_hosts(lab, project)
    finally:
        config.unlink()
        lab.trust(h1)


# One cluster for the checks below, in this order: each finds the cluster as the one before left it. They used to
# bring up and remove a cluster each (seven ups and downs); the ups that heal a host key, replace the containers and
# drop a host, and the down refused while Docker is stopped on a host, are still each their own real `kit up` or
# `kit down`, on this one cluster. They come last in the module, so that a check that fails leaves no cluster in
# the way of another test; the fixture's end removes what a failed check left.
@pytest.fixture(scope="module")
def up_once(project, lab):
    r = kit(project, lab, "up", "--hosts", "hosts.txt")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    yield r
    if (lab.home / ".kit" / "lab" / "state.json").exists():  # a check failed before the last one's kit down
        kit(project, lab, "down")


def test_secrets_are_private_and_never_printed(project, lab, up_once):
    state = lab.home / ".kit" / "lab"
    secrets = [state / "client" / "id_ed25519"] + sorted((state / "hosts").glob("*/id_ed25519"))
    assert len(secrets) == 1 + len(lab.hosts)
    for path in secrets:
        assert path.stat().st_mode & 0o777 == 0o600, path
        body = path.read_text().splitlines()[1]
        assert body not in up_once.stdout + up_once.stderr
    for folder in [state, state / "client", state / "hosts"]:
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    for h in lab.hosts:
        modes = h.run_in("stat", "-c", "%a %U %n", "/var/lib/kit/lab/ssh", "/var/lib/kit/lab/ssh/id_ed25519",
                         "/var/lib/kit/lab/ssh/ssh_host_ed25519_key", "/var/lib/kit/lab/ssh/authorized_keys").stdout
        assert [line.split()[:2] for line in modes.splitlines()] == [["700", "root"]] + [["600", "root"]] * 3
    assert "PRIVATE KEY" not in up_once.stdout + up_once.stderr + kit(project, lab, "status").stdout


def test_container_sshd_refuses_passwords(project, lab, up_once):
    target = lab.hosts[1].address
    r = primary_exec(lab, "ssh", "-o", "PubkeyAuthentication=no", "-o", "PasswordAuthentication=yes",
                     "-o", "KbdInteractiveAuthentication=yes", "-o", "BatchMode=yes", target, "true")
    assert r.returncode == 255
    assert "Permission denied (publickey)" in r.stderr  # the only method offered


def test_another_owners_cluster_of_the_same_name_is_left_alone(project, lab, up_once, tmp_path):
    """Two people (or control machines) who both call their cluster `lab` on one host: the second is refused
    before anything changes, named with the first's owner, and its down touches nothing of the first's."""
    first = (lab.home / ".kit" / ".owner").read_text().split()
    other = {**lab.env, "KIT_HOME": str(tmp_path / "other-kit")}  # the other user's kit, same hosts and name
    before = {h.name: started_at(h) for h in lab.hosts}
    r = run_kit("up", "--hosts", "hosts.txt", cwd=project, env=other, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    for h in lab.hosts:
        assert f"{h.address}: a cluster named lab of {first[1]} (kit id {first[0][:12]}) is here" in r.stderr
    assert "choose another cluster name" in r.stderr
    assert {h.name: started_at(h) for h in lab.hosts} == before  # nothing changed
    assert not (tmp_path / "other-kit" / "lab").exists()
    assert run_kit("down", cwd=project, env=other).stdout.startswith("nothing to remove")
    assert kit(project, lab, "status").returncode == 0
    assert {h.name: started_at(h) for h in lab.hosts} == before


def test_changed_container_host_key_is_refused_and_up_restores_it(project, lab, up_once):
    h3 = lab.hosts[2]
    # An impostor's key in place of the one kit pinned (sshd reads host keys per connection).
    h3.run_in("sh", "-c", "cd /var/lib/kit/lab/ssh && rm -f ssh_host_ed25519_key* "
                          "&& ssh-keygen -q -t ed25519 -N '' -f ssh_host_ed25519_key")
    r = primary_exec(lab, "ssh", h3.address, "true")
    assert r.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr
    healed = kit(project, lab, "up", "--hosts", "hosts.txt")
    assert healed.returncode == 0, healed.stderr
    assert f"{h3.address}: wrote ssh_host_ed25519_key, ssh_host_ed25519_key.pub in /var/lib/kit/lab/ssh" \
        in healed.stdout
    assert primary_exec(lab, "ssh", h3.address, "true").returncode == 0


def test_changed_setting_replaces_only_the_containers(project, lab, up_once):
    before = {h.name: started_at(h) for h in lab.hosts}
    r = kit(project, lab, "up", "--hosts", "hosts.txt", "--shm-size", "1g")
    assert r.returncode == 0, r.stderr
    assert "loaded image" not in r.stdout and " wrote " not in r.stdout
    assert r.stdout.count("removed container kit-lab (its image or settings changed)") == len(lab.hosts)
    for h in lab.hosts:
        assert started_at(h) != before[h.name]
        assert h.docker("inspect", "--format", "{{.HostConfig.ShmSize}}", CONTAINER).stdout.strip() == str(1 << 30)
    plan = kit(project, lab, "down", "--dry-run")
    assert plan.returncode == 0 and "dry run: nothing was removed" in plan.stdout
    assert f"{lab.hosts[0].address}: docker rm -f kit-lab" in plan.stdout
    assert all(len(containers(h)) == 1 for h in lab.hosts)


def test_a_host_that_leaves_hosts_txt_is_cleaned_by_the_next_up(project, lab, up_once, tmp_path):
    h3 = lab.hosts[2]
    two = lab.hosts_file(tmp_path / "two.txt", lab.hosts[:2])
    r = kit(project, lab, "up", "--hosts", str(two))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{h3.address} (no longer in hosts.txt): removed container kit-lab" in r.stdout
    assert containers(h3) == [] and h3.kit_files() == [] and not h3.listening(PORT)
    state = json.loads((lab.home / ".kit" / "lab" / "state.json").read_text())
    assert [h["name"] for h in state["hosts"]] == [h.address for h in lab.hosts[:2]]
    for h in lab.hosts[:2]:  # the cluster's known_hosts no longer trusts the host that left
        known = h.run_in("cat", "/var/lib/kit/lab/ssh/known_hosts").stdout
        assert h3.address not in known and lab.hosts[1].address in known


def test_down_with_docker_stopped_on_a_host_keeps_that_host_and_the_keys_and_names_it(project, lab, up_once):
    """kit must not forget a container it could not see: with Docker back, it would run on with the cluster's key.
    The cluster is on h1 and h2 here (h3 left it above)."""
    h2, state_file = lab.hosts[1], lab.home / ".kit" / "lab" / "state.json"
    assert [h["name"] for h in json.loads(state_file.read_text())["hosts"]] == [h.address for h in lab.hosts[:2]]
    lab.stop_dockerd(h2)
    try:
        r = kit(project, lab, "down")
    finally:
        lab.start_dockerd(h2)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{h2.address}: Docker does not answer" in r.stderr and "kit down --force" in r.stderr
    assert [h["name"] for h in json.loads(state_file.read_text())["hosts"]] == [h2.address]
    assert (lab.home / ".kit" / "lab" / "client" / "id_ed25519").exists()
    for h in (lab.hosts[0], lab.hosts[2]):
        assert containers(h) == [] and h.kit_files() == [], h.name
    deadline = time.monotonic() + 60  # the engine brings the container back: kit still knows it, and removes it
    while time.monotonic() < deadline and [c["State"] for c in containers(h2)] != ["running"]:
        time.sleep(1)
    assert [c["State"] for c in containers(h2)] == ["running"]
    again = kit(project, lab, "down")
    assert again.returncode == 0, again.stdout + again.stderr
    assert_nothing_on_hosts(lab, project)
