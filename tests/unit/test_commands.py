"""Command lines kit runs on hosts, by exact equality."""

import re
from dataclasses import replace
from ipaddress import IPv4Network

from kit.cluster.lifecycle import removal_commands
from kit.jobs.commands.docker import ContainerSpec, network_create_argv, run_argv
from kit.config.settings import ClusterConfig
from kit.cluster.identity import known_hosts_lines
from kit.cluster.local import local_cluster
from kit.cluster.state import ClusterState, HostState
from kit.cluster.steps.facts import ContainerFacts, HostFacts, NetworkFacts
from kit.cluster.steps.keys import write_command


def spec(**cluster) -> ContainerSpec:
    cfg = ClusterConfig(name="lab", **cluster)
    return ContainerSpec(cfg, cfg.host_place(), "kit-horovod:cpu-0123456789ab", "sha256:abc", gpus=False)


LOCAL_CFG = ClusterConfig(name="demo")
LOCAL_HOSTS, LOCAL_PLACES = local_cluster(LOCAL_CFG, 3, IPv4Network("10.213.4.0/24"))


def test_cpu_container():
    s = spec()
    assert run_argv(s) == [
        "docker", "run", "-d", "--name", "kit-lab", "--label", "io.kit.cluster=lab", "--label", f"io.kit.spec={s.digest}",
        "--net=host", "--ipc=host", "--ulimit", "memlock=-1:-1", "--restart", "unless-stopped",
        "-v", "/var/lib/kit/lab/ssh:/etc/kit/ssh:ro", "-v", "/var/lib/kit/lab/jobs:/var/lib/kit/lab/jobs",
        "-v", "/var/lib/kit/lab/workspace:/var/lib/kit/lab/workspace", "-w", "/var/lib/kit/lab/workspace",
        "--tmpfs", "/run/kit:rw,nosuid,nodev,noexec,mode=0700,size=64m",
        "-e", "KIT_SSH_PORT=12345", "-e", "KIT_CLUSTER=lab", "kit-horovod:cpu-0123456789ab"]


def test_gpu_container_with_sized_shm_and_own_port():
    cfg = ClusterConfig(name="lab", shm_size="8g", ssh_port=2222, workspace="/srv/ws")
    s = ContainerSpec(cfg, cfg.host_place(), "img:1", "sha256:abc", gpus=True, memlock="8388608:8388608",
                      add_hosts=(("gpu-1", "10.0.0.1"),))
    argv = run_argv(s)
    assert argv[argv.index("--net=host") + 1:argv.index("--restart")] == ["--shm-size=8g", "--ulimit",
                                                                          "memlock=8388608:8388608"]
    assert argv[-5:] == ["--add-host", "gpu-1:10.0.0.1", "--gpus", "all", "img:1"]
    assert "KIT_SSH_PORT=2222" in argv and "/srv/ws:/srv/ws" in argv


def test_spec_digest_follows_what_changes_the_container():
    assert spec().digest == spec().digest
    assert spec(ssh_port=2222).digest != spec().digest
    assert spec(shm_size="1g").digest != spec().digest
    cfg = ClusterConfig(name="lab")
    other_image = ContainerSpec(cfg, cfg.host_place(), "kit-horovod:cpu-0123456789ab", "sha256:def", gpus=False)
    assert other_image.digest != spec().digest


def test_local_cluster_containers_have_own_names_folders_and_fixed_addresses():
    s = ContainerSpec(LOCAL_CFG, LOCAL_PLACES["local-2"], "img:1", "sha256:abc", gpus=False)
    assert run_argv(s) == [
        "docker", "run", "-d", "--name", "kit-demo-2", "--label", "io.kit.cluster=demo", "--label",
        f"io.kit.spec={s.digest}", "--network", "kit-demo", "--ip", "10.213.4.3", "--hostname", "local-2",
        "--ipc=host", "--ulimit", "memlock=-1:-1", "--restart", "unless-stopped",
        "-v", "/var/lib/kit/demo/local-2/ssh:/etc/kit/ssh:ro",
        "-v", "/var/lib/kit/demo/local-2/jobs:/var/lib/kit/demo/local-2/jobs",
        "-v", "/var/lib/kit/demo/workspace:/var/lib/kit/demo/workspace", "-w", "/var/lib/kit/demo/workspace",
        "--tmpfs", "/run/kit:rw,nosuid,nodev,noexec,mode=0700,size=64m",
        "-e", "KIT_SSH_PORT=12345", "-e", "KIT_CLUSTER=demo", "img:1"]
    assert network_create_argv(LOCAL_PLACES["local-1"], "demo") == [
        "docker", "network", "create", "--driver", "bridge", "--subnet", "10.213.4.0/24",
        "--label", "io.kit.cluster=demo", "kit-demo"]
    assert [h.name for h in LOCAL_HOSTS] == ["local-1", "local-2", "local-3"]
    assert [h.primary for h in LOCAL_HOSTS] == [True, False, False]
    assert all(h.local and h.slots == 1 for h in LOCAL_HOSTS)
    assert LOCAL_PLACES["local-3"].interfaces() == (("eth0", "10.213.4.4", 24),)
    assert ClusterConfig(name="lab").host_place().interfaces() == ()


def test_known_hosts_pins_each_name_on_the_cluster_port():
    text = known_hosts_lines([(["node-1", "10.0.0.1"], "ssh-ed25519 AAAA1 kit-lab@node-1"),
                              (["10.0.0.2", "10.0.0.2"], "ssh-ed25519 AAAA2 kit-lab@10.0.0.2")], 12345)
    assert text == "[node-1]:12345,[10.0.0.1]:12345 ssh-ed25519 AAAA1\n[10.0.0.2]:12345 ssh-ed25519 AAAA2\n"


def test_secret_files_are_written_private_and_atomically():
    assert write_command("/var/lib/kit/lab/ssh", "id_ed25519", 0o600) == (
        "umask 077 && mkdir -p /var/lib/kit/lab/ssh && cat > /var/lib/kit/lab/ssh/.id_ed25519.tmp "
        "&& chmod 600 /var/lib/kit/lab/ssh/.id_ed25519.tmp && mv -f /var/lib/kit/lab/ssh/.id_ed25519.tmp "
        "/var/lib/kit/lab/ssh/id_ed25519")


STATE = ClusterState("lab", "img:1", "sha256:abc", 12345, "/var/lib/kit/lab/workspace")
PLACE = ClusterConfig(name="lab").host_place()


def test_down_removes_what_up_made():
    facts = HostFacts(uid=0, docker_version="24.0", container=ContainerFacts("running", "sha256:abc", "x", "lab"),
                      kit_files={"config": "f"}, kit_dir_exists=True, workspace_exists=True)
    made = HostState("a", "10.0.0.1", PLACE, made_workspace=True, made_kit_dir=True)
    assert [c for c, _ in removal_commands(facts, made, STATE)] == [
        "docker rm -f kit-lab",
        "rm -rf /var/lib/kit/lab/ssh /var/lib/kit/lab/jobs /var/lib/kit/lab/owner",
        "rmdir /var/lib/kit/lab/workspace 2>/dev/null || echo kept",
        "rmdir /var/lib/kit/lab 2>/dev/null; true"]


def test_down_of_the_local_cluster_removes_the_network_with_the_primary():
    state = ClusterState("demo", "img:1", "sha256:abc", 12345, LOCAL_CFG.workspace_path)
    ours = NetworkFacts("demo", ("10.213.4.0/24",))
    facts = HostFacts(uid=0, docker_version="24.0", container=ContainerFacts("running", "sha256:abc", "x", "demo"),
                      kit_dir_exists=True, workspace_exists=True, network=ours)
    primary = HostState("local-1", "10.213.4.2", LOCAL_PLACES["local-1"], primary=True, local=True,
                        made_workspace=True, made_kit_dir=True)
    other = HostState("local-2", "10.213.4.3", LOCAL_PLACES["local-2"], local=True, made_kit_dir=True)
    assert [c for c, _ in removal_commands(facts, other, state)] == [
        "docker rm -f kit-demo-2",
        "rm -rf /var/lib/kit/demo/local-2/ssh /var/lib/kit/demo/local-2/jobs /var/lib/kit/demo/local-2/owner",
        "rmdir /var/lib/kit/demo/local-2 2>/dev/null; rmdir /var/lib/kit/demo 2>/dev/null; true"]
    assert [c for c, _ in removal_commands(facts, primary, state)][-2:] == [
        "rmdir /var/lib/kit/demo/local-1 2>/dev/null; rmdir /var/lib/kit/demo 2>/dev/null; true",
        "docker network rm kit-demo"]
    foreign = replace(facts, network=NetworkFacts("another", ("10.213.4.0/24",)))
    assert "docker network rm kit-demo" not in [c for c, _ in removal_commands(foreign, primary, state)]


def test_down_never_removes_kits_root_folder():
    """/var/lib/kit is every cluster's and may be a mountpoint, in this or another mount namespace. Removing it
    detached the mounts of every lab host (each its own /var/lib/kit in its namespace): after a local cluster's
    `kit down` on a fresh machine, the hosts shared one folder, and each served the host key written last."""
    facts = HostFacts(uid=0, docker_version="24.0", kit_dir_exists=True)
    for state, host in ((STATE, HostState("a", "10.0.0.1", PLACE, made_kit_dir=True)),
                        (ClusterState("demo", "img:1", "sha256:abc", 12345, LOCAL_CFG.workspace_path),
                         HostState("local-2", "10.213.4.3", LOCAL_PLACES["local-2"], local=True, made_kit_dir=True))):
        commands = " ".join(c for c, _ in removal_commands(facts, host, state))
        assert "rmdir /var/lib/kit/" in commands and not re.search(r"rmdir /var/lib/kit(?!/)", commands), commands


def test_down_leaves_what_it_did_not_make():
    foreign = ContainerFacts("running", "sha256:abc", "x", "another-cluster")
    facts = HostFacts(uid=0, docker_version="24.0", container=foreign, kit_dir_exists=True, workspace_exists=True)
    kept = HostState("a", "10.0.0.1", PLACE, made_workspace=False, made_kit_dir=False)
    assert removal_commands(facts, kept, STATE) == [("rm -rf /var/lib/kit/lab/ssh /var/lib/kit/lab/jobs /var/lib/kit/lab/owner",
                                                     "removed /var/lib/kit/lab/ssh and jobs")]
    assert removal_commands(HostFacts(uid=0, docker_version="24.0"), kept, STATE) == []


def test_slots_come_from_hosts_txt_then_gpus_then_one():
    from kit.config.hosts import Host
    from kit.cluster.steps.node import Node
    from kit.cluster.steps.preflight import slots

    def node(host_slots, gpus):
        n = Node(Host("a", slots=host_slots), runner=None, place=PLACE)
        n.facts = HostFacts(uid=0, docker_version="24.0", gpus=gpus)
        return n
    assert slots(node(3, 8), ClusterConfig(), gpu=True) == 3
    assert slots(node(None, 8), ClusterConfig(), gpu=True) == 8
    assert slots(node(None, 8), ClusterConfig(gpus=2), gpu=True) == 2
    assert slots(node(None, 8), ClusterConfig(), gpu=False) == 1
