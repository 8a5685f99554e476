"""The facts parser on output captured from a lab host (tests/unit/data/facts_*.txt)."""

import http.server
import json
import socketserver
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from kit.image.build import connect
from kit.config.settings import ClusterConfig
from kit.errors import KitError
from kit.cluster.identity import Owner
from kit.config.hosts import Host
from kit.cluster.place import Place
from kit.cluster.steps import preflight
from kit.cluster.steps.facts import (CONTAINERD_HINT, CONTAINERD_STORE, ContainerFacts, facts_command, listening_ports,
                                     parse_facts)
from kit.cluster.steps.node import Node

DATA = Path(__file__).parent / "data"


def test_fresh_host():
    f = parse_facts(0, (DATA / "facts_fresh_host.txt").read_text())
    assert f.docker_version == "20.10.24+dfsg1"
    assert f.docker_root == "/var/lib/kitlab/kitlab-h1/docker" and f.free_bytes > 1 << 30
    assert f.listening == {22}
    assert ("eth0", "10.231.77.11", 24) in f.ipv4
    assert f.image_id is None and f.container is None
    assert f.kit_files == {} and not f.kit_dir_exists and not f.workspace_exists
    assert f.gpus == 0 and "runc" in f.runtimes and "nvidia" not in f.runtimes
    assert (f.memlock_kb, f.can_raise_limits, f.memlock) == (8192, False, "8388608:8388608")
    assert not f.containerd_store  # overlay2: Docker's own image store


CONTAINERD_INFO = {"Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]}


def test_a_host_whose_docker_keeps_images_in_containerd_is_refused_with_the_setting_that_changes_it():
    """What Docker 29 says on a new install (`docker info`). kit's image step loads docker save's format, with only
    the layers a host lacks, which containerd's importer refuses ("layer ... not found"), and compares image IDs,
    which that store gives as the manifest's digest: refused before anything changes, with the daemon.json line."""
    f = parse_facts(0, f"@@kit docker\n29.1.3\n@@kit driverstatus\n{json.dumps(CONTAINERD_INFO['DriverStatus'])}\n"
                       "@@kit end\n")
    assert f.containerd_store
    assert not parse_facts(0, "@@kit driverstatus\nnull\n@@kit end\n").containerd_store  # a Docker that says none
    node = Node(Host("gpu7"), None, Place("c", "/ws"), facts=replace(f, free_bytes=100 << 30))
    cfg = ClusterConfig()
    found = preflight.problems(node, cfg, "sha256:" + "a" * 64, 1 << 30, False, "10.0.0.1", Owner("me", "me"))
    assert found == [CONTAINERD_STORE]
    assert '"containerd-snapshotter": false' in preflight.hint_for(found) and "daemon.json" in preflight.hint_for(found)
    assert preflight.problems(replace(node, facts=replace(node.facts, containerd_store=False)), cfg,
                              "sha256:" + "a" * 64, 1 << 30, False, "10.0.0.1", Owner("me", "me")) == []


def test_a_node_of_kits_slurm_is_refused_unless_kit_yaml_says_its_users_trust_each_other():
    """A Slurm job's ports are kept to its user by the socket's uid, which a job of the Docker cluster, root in the
    host's network, can take on: kit up does not put the two on the same hosts unless kit.yaml says so. A local
    cluster has a network of its own."""
    f = replace(parse_facts(0, "@@kit docker\n29.1.3\n@@kit slurmjobports\nyes\n@@kit end\n"), free_bytes=100 << 30)
    assert f.slurm_job_ports and not parse_facts(0, "@@kit slurmjobports\n@@kit end\n").slurm_job_ports
    node = Node(Host("gpu7"), None, Place("c", "/ws"), facts=f)
    args = ("sha256:" + "a" * 64, 1 << 30, False, "10.0.0.1", Owner("me", "me"))
    found = preflight.problems(node, ClusterConfig(), *args)
    assert found == [preflight.SHARED_WITH_SLURM] and "share_hosts_with_slurm: true" in preflight.hint_for(found)
    assert preflight.problems(node, ClusterConfig(share_hosts_with_slurm=True), *args) == []
    private = Place("c", "/ws", network="kit-c", address="10.213.0.2", subnet="10.213.0.0/24")
    assert preflight.problems(replace(node, place=private), ClusterConfig(), *args) == []
    assert "test -e /etc/slurm/kit-job-ports-prolog" in facts_command("img", Place("c", "/ws"), "/ws", "c")


def test_this_machines_docker_in_containerd_s_image_store_is_refused_before_a_build(tmp_path, monkeypatch):
    """kit.image.build.connect through the docker SDK to an engine that answers as Docker 29 does on a new install."""
    sock = tmp_path / "docker.sock"

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"ApiVersion": "1.52", "Version": "29.1.3"} if self.path.endswith("/version")
                              else CONTAINERD_INFO).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self):
            return "engine"

        def log_message(self, *args):
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True
    server = Server(str(sock), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    try:
        with pytest.raises(KitError) as e:
            connect(timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert e.value.message == f"on this machine, {CONTAINERD_STORE}" and e.value.hint == CONTAINERD_HINT


def test_host_of_a_cluster():
    f = parse_facts(0, (DATA / "facts_cluster_host.txt").read_text())
    assert f.listening == {22, 12345}
    assert f.image_id.startswith("sha256:b560f363")
    assert f.container == ContainerFacts("running", f.image_id, "0123456789abcdef", "cap")
    assert f.kit_files == {"authorized_keys": "a7998f247bd965694ff227fa325c81169a07471a8b6808d3e002a486c4e65975"}
    assert f.kit_dir_exists and f.workspace_exists


def test_docker_that_does_not_answer():
    text = "@@kit docker\nCannot connect to the Docker daemon at unix:///var/run/docker.sock.\n@@kit limits\nunlimited\n"
    f = parse_facts(1000, text)
    assert f.docker_version is None and f.docker_error.startswith("Cannot connect")
    assert f.memlock == "-1:-1"  # an unlimited hard limit needs no capability


def test_listening_ignores_other_states():
    tcp = "  0: 00000000:3039 00000000:0000 0A 0\n  1: 0B4DE70A:0016 014DE70A:9A54 01 0\n"
    assert listening_ports(tcp) == {12345}


def test_facts_command_quotes_what_it_is_given():
    cmd = facts_command("img:1", Place("kit-a", "/var/lib/kit/a b"), "/w", "a")
    assert "cd '/var/lib/kit/a b/ssh'" in cmd and "docker image inspect --format '{{.Id}}' img:1" in cmd


def test_facts_script_asks_docker_info_once_and_measures_free_space_where_docker_keeps_its_data(tmp_path):
    """The script itself, in sh, with a `docker` that records its calls and answers `info` as Docker renders the
    script's template (the lab tests read the real engines' answers)."""
    import subprocess

    root = tmp_path / "docker root"
    root.mkdir()
    calls = tmp_path / "calls"
    (tmp_path / "docker").write_text(f"""#!/bin/sh
echo "$1" >> '{calls}'
case "$1" in
  version) echo 28.2.2 ;;
  info) printf '%s\\n' '{root}' '@@kit runtimes' '{{"runc":{{}},"nvidia":{{}}}}' '@@kit driverstatus' \\
          '[["driver-type","io.containerd.snapshotter.v1"]]' ;;
  *) exit 1 ;;
esac
""")
    (tmp_path / "df").write_text(f"""#!/bin/sh
echo "df $*" >> '{calls}'
exec /bin/df "$@"
""")
    for tool in ("docker", "df"):
        (tmp_path / tool).chmod(0o755)
    script = facts_command("img:1", Place("kit-a", str(tmp_path / "kit")), "/w", "a")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout
    f = parse_facts(0, out)
    assert calls.read_text().splitlines().count("info") == 1
    assert f"df -Pk {root}" in calls.read_text().splitlines()
    assert f.docker_root == str(root) and f.runtimes == {"runc", "nvidia"} and f.containerd_store
    assert f.free_bytes > 0


def test_facts_cut_short_are_an_error_naming_the_host_not_a_guess():
    """Half a facts script (a timeout, a killed shell) must not read as a host with nothing of the cluster."""
    import pytest

    from kit.config.settings import ClusterConfig
    from kit.errors import KitError
    from kit.config.hosts import Host
    from kit.runners.base import Result
    from kit.cluster.steps.node import Node
    from kit.cluster.steps.preflight import gather

    class CutShort:
        host, sudo = "h2", False

        def run(self, command, **kw):
            if command == "id -u":
                return Result("h2", command, 0, "0\n")
            return Result("h2", command, 124, "@@kit docker\n", "timed out")

        def peer_address(self):
            return "10.0.0.2"
    cfg = ClusterConfig(name="lab")
    node = Node(Host("h2"), CutShort(), cfg.host_place())
    with pytest.raises(KitError, match=r"h2: cannot read the host's facts \(exit 124\)"):
        gather(node, cfg, "img:1")


def test_a_cluster_of_the_same_name_is_anothers_by_its_owner_not_its_name():
    from kit.cluster.identity import Owner
    from kit.cluster.steps.facts import ContainerFacts, HostFacts, NetworkFacts
    me, alice = Owner("a" * 32, "me@ws"), Owner("b" * 32, "alice@ws-3")
    base = HostFacts(uid=0, docker_version="24.0")
    assert base.foreign("lab", me) is None
    mine = ContainerFacts("running", "sha256:1", "x", "lab", me)
    assert HostFacts(uid=0, docker_version="24.0", container=mine, kit_dir_owner=me).foreign("lab", me) is None
    hers = ContainerFacts("running", "sha256:1", "x", "lab", alice)
    assert HostFacts(uid=0, docker_version="24.0", container=hers).foreign("lab", me) == alice
    assert HostFacts(uid=0, docker_version="24.0", network=NetworkFacts("lab", (), alice)).foreign("lab", me) == alice
    assert HostFacts(uid=0, docker_version="24.0", kit_dir_owner=alice).foreign("lab", me) == alice
    unlabelled = ContainerFacts("running", "sha256:1", "x", "lab")
    assert HostFacts(uid=0, docker_version="24.0", container=unlabelled).foreign("lab", me).name.startswith("a kit")
    other_cluster = ContainerFacts("running", "sha256:1", "x", "other", alice)  # not this name: not this check's
    assert HostFacts(uid=0, docker_version="24.0", container=other_cluster).foreign("lab", me) is None
    text = "@@kit owner\n" + "b" * 32 + " alice@ws-3\n@@kit container\n" \
           '"running" "sha256:1" {"io.kit.cluster":"lab","io.kit.owner":"' + "b" * 32 + '","io.kit.owner-name":"alice@ws-3"}\n'
    f = parse_facts(0, text)
    assert f.kit_dir_owner == alice and f.container.owner == alice
