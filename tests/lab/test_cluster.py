"""`kit up / status / down` on three lab hosts (network namespaces, each with its own sshd and dockerd)."""

import json
import os
import re
import threading
import time

import pytest

from harness import ClusterUpFailed, lab_cluster
from helpers import run_kit

pytestmark = pytest.mark.lab
CONTAINER = "kit-lab"
PORT = 12345


def kit(project, lab, *args, timeout=900):
    return run_kit(*args, cwd=project, env=lab.env, timeout=timeout)


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
    r = kit(project, lab, "up", "--hosts", "hosts.txt")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "✓ cluster lab is up on 3 hosts" in r.stdout
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
    again = kit(project, lab, "up", "--hosts", "hosts.txt")
    assert again.returncode == 0, again.stderr
    assert "✓ cluster lab is up on 3 hosts: no change" in again.stdout
    assert "loaded image" not in again.stdout and "started container" not in again.stdout
    assert {h.name: started_at(h) for h in lab.hosts} == before

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


def test_secrets_are_private_and_never_printed(project, lab, down_after):
    r = kit(project, lab, "up", "--hosts", "hosts.txt")
    assert r.returncode == 0, r.stderr
    state = lab.home / ".kit" / "lab"
    secrets = [state / "client" / "id_ed25519"] + sorted((state / "hosts").glob("*/id_ed25519"))
    assert len(secrets) == 1 + len(lab.hosts)
    for path in secrets:
        assert path.stat().st_mode & 0o777 == 0o600, path
        body = path.read_text().splitlines()[1]
        assert body not in r.stdout + r.stderr
    for folder in [state, state / "client", state / "hosts"]:
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    for h in lab.hosts:
        modes = h.run_in("stat", "-c", "%a %U %n", "/var/lib/kit/lab/ssh", "/var/lib/kit/lab/ssh/id_ed25519",
                         "/var/lib/kit/lab/ssh/ssh_host_ed25519_key", "/var/lib/kit/lab/ssh/authorized_keys").stdout
        assert [line.split()[:2] for line in modes.splitlines()] == [["700", "root"]] + [["600", "root"]] * 3
    assert "PRIVATE KEY" not in r.stdout + r.stderr + kit(project, lab, "status").stdout


def test_container_sshd_refuses_passwords(project, lab, down_after):
    assert kit(project, lab, "up", "--hosts", "hosts.txt").returncode == 0
    target = lab.hosts[1].address
    r = primary_exec(lab, "ssh", "-o", "PubkeyAuthentication=no", "-o", "PasswordAuthentication=yes",
                     "-o", "KbdInteractiveAuthentication=yes", "-o", "BatchMode=yes", target, "true")
    assert r.returncode == 255
    assert "Permission denied (publickey)" in r.stderr  # the only method offered


def test_changed_container_host_key_is_refused_and_up_restores_it(project, lab, down_after):
    assert kit(project, lab, "up", "--hosts", "hosts.txt").returncode == 0
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
        known = lab.home / ".ssh" / "known_hosts"
        lines = [line for line in known.read_text().splitlines() if not line.startswith(h2.address + " ")]
        known.write_text("\n".join(lines + [f"{h2.address} {(h2.run / 'host_key.pub').read_text().strip()}"]) + "\n")


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
    assert "command: gunzip -c | docker load" in r.stderr
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


def test_changed_setting_replaces_only_the_containers(project, lab, down_after):
    assert kit(project, lab, "up", "--hosts", "hosts.txt").returncode == 0
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
