"""Bad input to `kit up`: exit 2, one line naming file:line or the flag, the expected form,
and nothing changed on any lab host (nothing is even contacted)."""

import contextlib
import os
import re
import signal
import subprocess

import pytest

from harness import wait_for
from helpers import run_kit

pytestmark = pytest.mark.lab

H1, H2 = "10.231.77.11", "10.231.77.12"

# (hosts.txt, kit.yaml `cluster:` text or None, extra flags, expected first line (regex), word in the fix)
CASES = [
    ("", None, [], r"hosts\.txt: no hosts", "one host a line"),
    ("# nothing yet\n", None, [], r"hosts\.txt: no hosts", "host:slots"),
    (f"{H1}:0\n", None, [], r"hosts\.txt:1: slots must be a whole number from 1 to 1024, not '0'", "node-1:4"),
    (f"{H1}\n{H2} gpus=2\n", None, [], r"hosts\.txt:2: unknown option 'gpus=2'", "slots=N"),
    (f"{H1}\n{H2}\n{H1}:2\n", None, [], rf"hosts\.txt:3: {H1} is listed twice \(first on line 1\)", "once"),
    (f"{H1} primary\n{H2} primary\n", None, [], r"hosts\.txt:2: a second primary", "primary"),
    (f"{H1} port=99999\n", None, [], r"hosts\.txt:1: port must be a whole number from 1 to 65535", "port=N"),
    (f"{H1}\nnode_2\n", None, [], r"hosts\.txt:2: 'node_2' is not a host name or address", "host"),
    (f"Root@{H1}\n", None, [], r"hosts\.txt:1: 'Root' is not a user name", "user@host"),
    ("[::zz]:2\n", None, [], r"hosts\.txt:1: '\[::zz\]' is not an IPv6 address", "host"),
    (None, None, [], r"missing-hosts\.txt: cannot read the hosts file", "--hosts"),
    (f"{H1}\n", "cluster:\n  name: My Lab\n", [], r"kit\.yaml:2: cluster\.name: 'My Lab' is not a cluster name", "lower-case"),
    (f"{H1}\n", "cluster:\n  ssh_port: 22\n", [], r"kit\.yaml:2: cluster\.ssh_port: 22 is not a port from 1024", "free TCP port"),
    (f"{H1}\n", "cluster:\n  ssh_port: abc\n", [], r"kit\.yaml:2: cluster\.ssh_port: input should be a valid integer", "port"),
    (f"{H1}\n", "cluster:\n  workspace: data/ws\n", [], r"kit\.yaml:2: cluster\.workspace: 'data/ws' is not an absolute path", "absolute"),
    (f"{H1}\n", "cluster:\n  shm_size: lots\n", [], r"kit\.yaml:2: cluster\.shm_size: 'lots' is not a size", "8g"),
    (f"{H1}\n", "cluster:\n  gpus: -1\n", [], r"kit\.yaml:2: cluster\.gpus:", "GPUs"),
    (f"{H1}\n", "cluster:\n  conect_timeout: 5\n", [], r"kit\.yaml:2: cluster\.conect_timeout: unknown setting", "connect_timeout"),
    (f"{H1}\n", "clusters:\n  name: lab\n", [], r"kit\.yaml:1: unknown section 'clusters'", "build, cluster"),
    (f"{H1}\n", "cluster: [lab\n", [], r"kit\.yaml:\d+: not valid YAML", "YAML"),
    (f"{H1}\n", "cluster: lab\n", [], r"kit\.yaml:1: section 'cluster' must be a mapping", "indent"),
    (f"{H1}\n", "cluster:\n  image_tag: Not An Image\n", [], r"kit\.yaml:2: cluster\.image_tag: 'Not An Image' is not an image", "docker images"),
    (f"{H1}\n", "cluster:\n  connect_timeout: 0\n", [], r"kit\.yaml:2: cluster\.connect_timeout: 0 is not a number of seconds", "seconds"),
    (f"{H1}\n", None, ["--ssh-port", "80"], r"--ssh-port: 80 is not a port from 1024 to 65535", "free TCP port"),
    (f"{H1}\n", None, ["--name", "lab one"], r"--name: 'lab one' is not a cluster name", "lower-case"),
    (f"{H1}\n", None, ["--workspace", "ws"], r"--workspace: 'ws' is not an absolute path", "absolute"),
    (f"{H1}\n", None, ["--shm-size", "1x"], r"--shm-size: '1x' is not a size", "8g"),
    (f"{H1}\n", None, ["--image-tag", "kit-horovod:cpu-000000000000"],
     r"image kit-horovod:cpu-000000000000 is not on this machine", "kit build"),
    # Paths reach shells, /etc/exports, fstab and Ansible on every host, as root: an allow-list.
    (f"{H1}\n", "cluster:\n  workspace: /srv/my work\n", [], r"kit\.yaml:2: cluster\.workspace: '/srv/my work' is not "
     r"an absolute path of letters", "absolute folder"),
    (f"{H1}\n", "cluster:\n  workspace: \"/srv/{{ lookup('pipe','id') }}\"\n", [], r"kit\.yaml:2: cluster\.workspace: ",
     "letters, digits"),
    (f"{H1}\n", "cluster:\n  workspace: /etc/kit\n", [], r"kit\.yaml:2: cluster\.workspace: '/etc/kit' is a system "
     r"folder", "not a system folder"),
    (f"{H1}\n", None, ["--workspace", "/root"], r"--workspace: '/root' is a system folder", "not a system folder"),
    (f"{H1}\n", None, ["--workspace", "/var/lib/kit/other/ssh"], r"--workspace: '/var/lib/kit/other/ssh' is inside "
     r"kit's own folders", "of its own"),
    (f"{H1}\n", None, ["--workspace", "/srv/../etc"], r"--workspace: '/srv/\.\./etc' is not an absolute path", "absolute"),
    (f"{H1}\n", "cluster:\n  storage: tape\n", [], r"kit\.yaml:2: cluster\.storage: 'tape' is not allowed", "sshfs"),
    (f"{H1}\n", "cluster:\n  nfs_server: nas:/export/kit\n", [], r"kit\.yaml:2: cluster\.nfs_server: is only read with "
     r"storage: nfs", "server:/absolute/path"),
    (f"{H1}\n", "cluster:\n  nfs_server: nas export\n  storage: nfs\n", [], r"kit\.yaml:2: cluster\.nfs_server: "
     r"'nas export' is not server:/path", "server:/absolute/path"),
    (f"{H1}\n", "cluster:\n  name: -lab\n", [], r"kit\.yaml:2: cluster\.name: '-lab' is not a cluster name", "lower-case"),
    (f"{H1}\n{H2} slots=2 slots=3\n", None, [], r"hosts\.txt:2: ", "slots=N"),
    (f"{H1}\n".encode("ascii") + b"gpu-\xe9\n", None, [], r"hosts\.txt:2: the hosts file is not UTF-8 text "
     r"\(byte 0xe9\)", "UTF-8"),
    (f"{H1}\n", b"cluster:\n  name: caf\xe9\n", [], r"kit\.yaml:2: the config file is not UTF-8 text \(byte 0xe9\)",
     "UTF-8"),
]


@pytest.mark.parametrize("hosts,cluster,flags,first_line,fix", CASES, ids=[f"{i}-{c[3][:40]}" for i, c in enumerate(CASES)])
def test_bad_input_exits_2_naming_where_and_changes_nothing(lab, tmp_path, hosts, cluster, flags, first_line, fix):
    # kit's default build, whose image need not be built: bad input is refused before it is looked for; bytes: a
    # file that is not UTF-8
    (tmp_path / "kit.yaml").write_bytes(cluster if isinstance(cluster, bytes) else (cluster or "").encode())
    hosts_file = "missing-hosts.txt" if hosts is None else "hosts.txt"
    if hosts is not None:
        (tmp_path / hosts_file).write_bytes(hosts if isinstance(hosts, bytes) else hosts.encode())
    r = run_kit("up", "--hosts", hosts_file, *flags, cwd=tmp_path, env=lab.env, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert re.match("error: " + first_line, lines[0]), lines[0]
    assert len(lines) == 2 and lines[1].startswith("fix: ") and fix in lines[1], lines
    for h in lab.hosts:
        assert h.docker("ps", "-aq").stdout == "" and h.kit_files() == [], h.name
    assert [p.name for p in (lab.home / ".kit").glob("*") if not p.name.startswith(".")] == []  # no cluster; kit's own bookkeeping (.owner, .locks) starts with a dot



# A cluster recorded on this machine (its state file, as `kit up` writes it) and a job folder: what `kit run`,
# `kit exec` and `kit up` refuse before they contact any host. (args, state text or None for kit's own, first line
# (regex), word in the fix)
RECORDED = [
    (["run", "job/train.py", "--launcher", "mpi"], None, r"--launcher: 'mpi' is not a launcher", "torchrun"),
    (["run", "job/train.py", "--launcher", "torchrun", "--np", "2"], None, r"--np is horovodrun's", "nproc-per-node"),
    (["run", "job/train.py", "--launcher", "tf", "--fusion-threshold-mb", "64"], None,
     r"--fusion-threshold-mb: Horovod's", "--launcher horovod"),
    (["run", "job/train.py", "--nproc-per-node", "2"], None, r"--nproc-per-node: 2 is not for --launcher horovod",
     "torchrun"),
    (["run", "job/train.py", "--launcher", "torchrun", "--nproc-per-node", "0"], None,
     r"--nproc-per-node: 0 is not from 1 to 256", "256"),
    (["run", "job/missing.py"], None, r"job/missing\.py: no such file", "training script"),
    (["run", "--workdir", "elsewhere", "job/train.py"], None, r"job/train\.py is not inside --workdir", "folder"),
    (["run", "job/train.py", "--np", "9"], None, r"--np: 9 processes, but the cluster has 3 slots", "1 to 3"),
    (["run", "job/train.py", "--launcher", "tf"], None, r"--launcher tf: cluster recorded runs", "--launcher horovod"),
    (["exec", "10.231.77.99", "--", "true"], None, r"10\.231\.77\.99 is not a host of cluster recorded", "use one of"),
    (["run", "job/train.py"], "{not json", r".*state\.json: kit's record of cluster recorded is damaged", "restore"),
    (["up", "--hosts", "hosts.txt"], "", r".*state\.json: kit's record of cluster recorded is damaged", "restore"),
    (["run", "job/train.py"], '{"cluster": "recorded"}', r".*state\.json: kit's record of cluster recorded is damaged",
     "restore"),
]


@pytest.mark.parametrize("args,state,first_line,fix", RECORDED, ids=[f"{i}-{c[2][:40]}" for i, c in enumerate(RECORDED)])
def test_bad_job_input_on_a_recorded_cluster_exits_2_and_contacts_no_host(lab, tmp_path, args, state, first_line, fix):
    import json
    (tmp_path / "kit.yaml").write_text("cluster:\n  name: recorded\n")
    lab.hosts_file(tmp_path / "hosts.txt")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text("print('never runs')\n")
    (tmp_path / "elsewhere").mkdir()
    folder = lab.home / ".kit" / "recorded"
    folder.mkdir(parents=True, exist_ok=True)
    place = {"container": "kit-recorded", "kit_dir": "/var/lib/kit/recorded", "network": "host", "subnet": "",
             "address": "", "hostname": ""}
    hosts = [{"name": h.address, "address": h.address, "place": place, "slots": 1, "primary": i == 0,
              "interfaces": [["eth0", h.address, 24]]} for i, h in enumerate(lab.hosts)]
    recorded = {"cluster": "recorded", "image": "kit-horovod:cpu-000000000000", "image_id": "sha256:0", "ssh_port": 12345,
                "workspace": "/var/lib/kit/recorded/workspace", "hosts": hosts, "flavor": "cpu"}
    (folder / "state.json").write_text(json.dumps(recorded) if state is None else state)
    try:
        r = run_kit(*args, cwd=tmp_path, env=lab.env, timeout=120)
        assert r.returncode == 2, r.stdout + r.stderr
        lines = r.stderr.splitlines()
        assert re.match("error: " + first_line, lines[0]), lines[0]
        assert len(lines) == 2 and lines[1].startswith("fix: ") and fix in lines[1], lines
        assert "Traceback" not in r.stdout + r.stderr
        for h in lab.hosts:
            assert h.docker("ps", "-aq").stdout == "" and h.kit_files() == [], h.name
    finally:
        import shutil
        shutil.rmtree(folder)


@contextlib.contextmanager
def sshd_on(h, port: int):
    """The host's own sshd (its host key, the lab user's key) also on another port: a server whose sshd listens off
    22, as ~/.ssh/config's Port says."""
    config = h.run / f"sshd_config-{port}"
    config.write_text((h.run / "sshd_config").read_text().replace("Port 22\n", f"Port {port}\n")
                      .replace(f"PidFile {h.run}/sshd.pid", f"PidFile {h.run}/sshd-{port}.pid"))
    proc = subprocess.Popen([*h.nsenter, "/usr/sbin/sshd", "-f", str(config), "-D", "-e"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(f"{h.name}'s sshd on port {port}", lambda: h.listening(port), timeout=30)
        yield
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        config.unlink()


def test_a_host_reached_through_an_ssh_config_alias_and_port_is_named_as_ssh_needs_it(lab, tmp_path):
    """hosts.txt names an alias of the user's ~/.ssh/config, whose HostName is a lab host and whose Port is its sshd's
    (2222): kit doctor names the alias and port, never "the jump host on the way" (there is none), and the fix is the
    ssh command that reaches it; with its key pinned, the host is reached; with another key, the fix names the
    known_hosts entry as ssh-keygen needs it. hosts.txt's own `port=` gets `ssh -p`."""
    h = lab.hosts[0]
    config, known = lab.home / ".ssh/config", lab.home / ".ssh/known_hosts"
    assert not config.exists()  # (the quickstart's is removed with its module)
    pinned = known.read_text()
    key = " ".join((h.run / "host_key.pub").read_text().split()[:2])
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    hosts = tmp_path / "hosts.txt"

    def doctor() -> str:
        r = run_kit("doctor", "--hosts", "hosts.txt", cwd=tmp_path, env=lab.env, timeout=300)
        out = " ".join((r.stdout + r.stderr).split())
        assert "Traceback" not in out and "jump host" not in out, out
        return out

    with sshd_on(h, 2222):
        config.write_text(f"Host lab-alias\n  HostName {h.address}\n  Port 2222\n  User root\n")
        try:
            hosts.write_text("lab-alias\n")
            out = doctor()
            assert f"the SSH host key of {h.address} (the HostName of lab-alias), port 2222, is not in your " \
                   "known_hosts" in out and "fix: run `ssh lab-alias` once" in out, out
            known.write_text(pinned + f"[{h.address}]:2222 {key}\n")
            out = doctor()
            assert "known_hosts" not in out and "cannot" not in out, out  # reached, as ssh lab-alias reaches it
            known.write_text(pinned + f"[{h.address}]:2222 {other.with_suffix('.pub').read_text()}")
            out = doctor()
            assert f"the SSH host key of {h.address} (the HostName of lab-alias), port 2222, does not match" in out
            assert f"`ssh-keygen -R '[{h.address}]:2222'` and `ssh lab-alias` once" in out, out
            known.write_text(pinned)
            hosts.write_text(f"root@{h.address} port=2222\n")
            assert f"fix: run `ssh -p 2222 root@{h.address}` once" in doctor()
        finally:
            config.unlink()
            known.write_text(pinned)
