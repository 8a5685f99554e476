"""The facts parser on output captured from a lab host (tests/unit/data/facts_*.txt)."""

from pathlib import Path

from kit.place import Place
from kit.steps.facts import ContainerFacts, facts_command, listening_ports, parse_facts

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
