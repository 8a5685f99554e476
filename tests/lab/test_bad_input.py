"""Bad input to `kit up`: exit 2, one line naming file:line or the flag, the expected form,
and nothing changed on any lab host (nothing is even contacted)."""

import re

import pytest

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
]


@pytest.mark.parametrize("hosts,cluster,flags,first_line,fix", CASES, ids=[c[3][:50] for c in CASES])
def test_bad_input_exits_2_naming_where_and_changes_nothing(project, lab, tmp_path, hosts, cluster, flags,
                                                            first_line, fix):
    (tmp_path / "kit.yaml").write_text(cluster or "")  # kit's default build: the project's image
    hosts_file = "missing-hosts.txt" if hosts is None else "hosts.txt"
    if hosts is not None:
        (tmp_path / hosts_file).write_text(hosts)
    r = run_kit("up", "--hosts", hosts_file, *flags, cwd=tmp_path, env=lab.env, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert re.match("error: " + first_line, lines[0]), lines[0]
    assert len(lines) == 2 and lines[1].startswith("fix: ") and fix in lines[1], lines
    for h in lab.hosts:
        assert h.docker("ps", "-aq").stdout == "" and h.kit_files() == [], h.name
    assert sorted(p.name for p in (lab.home / ".kit").glob("*")) in ([], ["images"])
