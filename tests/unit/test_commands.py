"""Command lines kit runs on hosts, by exact equality."""

from kit.cluster import removal_commands
from kit.commands.docker import ContainerSpec, run_argv
from kit.config import ClusterConfig
from kit.identity import known_hosts_lines
from kit.state import ClusterState, HostState
from kit.steps.facts import ContainerFacts, HostFacts
from kit.steps.keys import write_command


def spec(**cluster) -> ContainerSpec:
    return ContainerSpec(ClusterConfig(name="lab", **cluster), "kit-horovod:cpu-0123456789ab", "sha256:abc", gpus=False)


def test_cpu_container():
    s = spec()
    assert run_argv(s) == [
        "docker", "run", "-d", "--name", "kit-lab", "--label", "io.kit.cluster=lab", "--label", f"io.kit.spec={s.digest}",
        "--net=host", "--ipc=host", "--ulimit", "memlock=-1:-1", "--restart", "unless-stopped",
        "-v", "/var/lib/kit/lab/ssh:/etc/kit/ssh:ro", "-v", "/var/lib/kit/lab/jobs:/var/lib/kit/lab/jobs",
        "-v", "/var/lib/kit/lab/workspace:/var/lib/kit/lab/workspace", "-w", "/var/lib/kit/lab/workspace",
        "-e", "KIT_SSH_PORT=12345", "-e", "KIT_CLUSTER=lab", "kit-horovod:cpu-0123456789ab"]


def test_gpu_container_with_sized_shm_and_own_port():
    s = ContainerSpec(ClusterConfig(name="lab", shm_size="8g", ssh_port=2222, workspace="/srv/ws"), "img:1", "sha256:abc",
                      gpus=True, memlock="8388608:8388608", add_hosts=(("gpu-1", "10.0.0.1"),))
    argv = run_argv(s)
    assert argv[argv.index("--net=host") + 1:argv.index("--restart")] == ["--shm-size=8g", "--ulimit",
                                                                          "memlock=8388608:8388608"]
    assert argv[-5:] == ["--add-host", "gpu-1:10.0.0.1", "--gpus", "all", "img:1"]
    assert "KIT_SSH_PORT=2222" in argv and "/srv/ws:/srv/ws" in argv


def test_spec_digest_follows_what_changes_the_container():
    assert spec().digest == spec().digest
    assert spec(ssh_port=2222).digest != spec().digest
    assert spec(shm_size="1g").digest != spec().digest
    other_image = ContainerSpec(ClusterConfig(name="lab"), "kit-horovod:cpu-0123456789ab", "sha256:def", gpus=False)
    assert other_image.digest != spec().digest


def test_known_hosts_pins_each_name_on_the_cluster_port():
    text = known_hosts_lines([(["node-1", "10.0.0.1"], "ssh-ed25519 AAAA1 kit-lab@node-1"),
                              (["10.0.0.2", "10.0.0.2"], "ssh-ed25519 AAAA2 kit-lab@10.0.0.2")], 12345)
    assert text == "[node-1]:12345,[10.0.0.1]:12345 ssh-ed25519 AAAA1\n[10.0.0.2]:12345 ssh-ed25519 AAAA2\n"


def test_secret_files_are_written_private_and_atomically():
    assert write_command("/var/lib/kit/lab/ssh", "id_ed25519", 0o600) == (
        "umask 077 && mkdir -p /var/lib/kit/lab/ssh && cat > /var/lib/kit/lab/ssh/.id_ed25519.tmp "
        "&& chmod 600 /var/lib/kit/lab/ssh/.id_ed25519.tmp && mv -f /var/lib/kit/lab/ssh/.id_ed25519.tmp "
        "/var/lib/kit/lab/ssh/id_ed25519")


STATE = ClusterState("lab", "img:1", "sha256:abc", 12345, "kit-lab", "/var/lib/kit/lab", "/var/lib/kit/lab/workspace")


def test_down_removes_what_up_made():
    facts = HostFacts(uid=0, docker_version="24.0", container=ContainerFacts("running", "sha256:abc", "x", "lab"),
                      kit_files={"config": "f"}, kit_dir_exists=True, workspace_exists=True)
    made = HostState("a", "10.0.0.1", made_workspace=True, made_kit_dir=True)
    assert [c for c, _ in removal_commands(facts, made, STATE)] == [
        "docker rm -f kit-lab",
        "rm -rf /var/lib/kit/lab/ssh /var/lib/kit/lab/jobs",
        "rmdir /var/lib/kit/lab/workspace 2>/dev/null || echo kept",
        "rmdir /var/lib/kit/lab 2>/dev/null; rmdir /var/lib/kit 2>/dev/null; true"]


def test_down_leaves_what_it_did_not_make():
    foreign = ContainerFacts("running", "sha256:abc", "x", "another-cluster")
    facts = HostFacts(uid=0, docker_version="24.0", container=foreign, kit_dir_exists=True, workspace_exists=True)
    kept = HostState("a", "10.0.0.1", made_workspace=False, made_kit_dir=False)
    assert removal_commands(facts, kept, STATE) == [("rm -rf /var/lib/kit/lab/ssh /var/lib/kit/lab/jobs",
                                                     "removed /var/lib/kit/lab/ssh and jobs")]
    assert removal_commands(HostFacts(uid=0, docker_version="24.0"), kept, STATE) == []


def test_slots_come_from_hosts_txt_then_gpus_then_one():
    from kit.inventory import Host
    from kit.steps.node import Node
    from kit.steps.preflight import slots

    def node(host_slots, gpus):
        n = Node(Host("a", slots=host_slots), runner=None)
        n.facts = HostFacts(uid=0, docker_version="24.0", gpus=gpus)
        return n
    assert slots(node(3, 8), ClusterConfig(), gpu=True) == 3
    assert slots(node(None, 8), ClusterConfig(), gpu=True) == 8
    assert slots(node(None, 8), ClusterConfig(gpus=2), gpu=True) == 2
    assert slots(node(None, 8), ClusterConfig(), gpu=False) == 1
