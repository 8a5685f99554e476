"""The local cluster's pure parts: which subnet it takes, and what `kit demo` reads from the example."""

from ipaddress import IPv4Network
from pathlib import Path

import pytest

from kit.jobs.demo import Training
from kit.errors import BadInput
from kit.cluster.local import POOLS, check_count, docker_subnets, free_subnet, routes
from kit.cluster.steps.facts import NetworkFacts, parse_facts

DATA = Path(__file__).parent / "data"


def test_routes_of_this_kind_of_machine():
    # Captured on the CI machine: a default route, docker0 and the machine's own /24.
    assert routes((DATA / "proc_net_route.txt").read_text()) == [IPv4Network("172.17.0.0/16"),
                                                                 IPv4Network("192.0.2.0/24")]


def test_docker_subnets_from_network_attributes():
    attrs = [{"IPAM": {"Config": [{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}]}},
             {"IPAM": {"Config": []}}, {"IPAM": None}, {"IPAM": {"Config": [{"Subnet": "fd00::/64"}]}},
             {"IPAM": {"Config": [{"Subnet": "10.213.9.0/24"}]}}]
    assert docker_subnets(attrs) == [IPv4Network("172.17.0.0/16"), IPv4Network("10.213.9.0/24")]


def test_free_subnet_skips_what_is_taken():
    assert free_subnet([]) == IPv4Network("10.213.0.0/24")
    assert free_subnet([IPv4Network("10.213.0.0/24"), IPv4Network("10.213.1.128/25")]) == IPv4Network("10.213.2.0/24")
    assert free_subnet([IPv4Network("10.0.0.0/8")]) == IPv4Network("172.29.0.0/24")  # a LAN on all of 10/8


def test_free_subnet_says_when_nothing_is_left():
    with pytest.raises(BadInput, match="in use"):
        free_subnet(list(POOLS))


def test_node_count_is_checked():
    with pytest.raises(BadInput, match="--nodes: 0"):
        check_count(0)
    assert check_count(3) == 3


def test_network_facts():
    f = parse_facts(0, '@@kit network\n{"io.kit.cluster":"demo"} 10.213.9.0/24 \n')
    assert f.network == NetworkFacts("demo", ("10.213.9.0/24",))
    assert parse_facts(0, "@@kit network\n").network is None


RANK0 = """rank 0/3 (local 0) on 10.213.0.2 (local-1), device cpu
no CIFAR-10 batches in data/cifar-10-batches-py: using generated data of the same shape
epoch 1: loss 2.1381 accuracy 0.925 images/sec 613.1
epoch 2: loss 0.2251 accuracy 0.989 images/sec 619.4
saved checkpoint /var/lib/kit/demo/workspace/checkpoints/cifar10_cnn.pt""".splitlines()


def test_demo_summary_reads_rank_zero():
    t = Training()
    for line in RANK0:
        t.feed(0, line)
    t.feed(1, "epoch 9: loss 9.0 accuracy 0.1 images/sec 1.0")  # only rank 0's figures count
    assert [e.loss for e in t.epochs] == [2.1381, 0.2251] and t.loss_fell and t.generated_data
    rows = dict(t.rows())
    assert rows["loss"] == "2.1381 -> 0.2251 (fell)"
    assert rows["speed"] == "619 images/sec, all ranks together"
    assert rows["checkpoint"] == "/var/lib/kit/demo/workspace/checkpoints/cifar10_cnn.pt"
    assert dict(Training().rows()) == {"training": "no epoch finished"}


# ---------------------------------------------------------------- where `kit up` brings a cluster up

def _state(local: bool, given_slots: int | None = None):
    from kit.cluster import state as st
    from kit.config.settings import ClusterConfig
    from kit.cluster.place import Place
    hosts = [st.HostState(name=f"local-{i}" if local else f"gpu-{i}", address=f"10.0.0.{i}",
                          place=Place(f"kit-lab-{i}", "/var/lib/kit/lab") if local else ClusterConfig().host_place(),
                          user=None if local else "alice", port=None if local else 2222, slots=4,
                          given_slots=given_slots, primary=i == 1, local=local) for i in (1, 2, 3)]
    return st.ClusterState(cluster="lab", image="kit-horovod:cpu-0", image_id="sha256:0", ssh_port=12345,
                           workspace="/w", hosts=hosts)


def test_up_without_flags_goes_back_to_the_recorded_servers_as_hosts_txt_gave_them():
    from kit.cluster.lifecycle import where_to_bring_up
    where = where_to_bring_up(_state(local=False, given_slots=2), "lab", False, False, None, 3)
    assert where.count is None
    assert [(h.name, h.user, h.port, h.slots, h.primary, h.local) for h in where.recorded] == [
        ("gpu-1", "alice", 2222, 2, True, False), ("gpu-2", "alice", 2222, 2, False, False),
        ("gpu-3", "alice", 2222, 2, False, False)]
    # slots the flavor decided (none in hosts.txt) are decided again, not frozen
    assert {h.slots for h in where_to_bring_up(_state(local=False), "lab", False, False, None, 3).recorded} == {None}


def test_up_makes_a_local_cluster_only_where_none_is_recorded_on_servers():
    from kit.cluster.lifecycle import where_to_bring_up
    assert where_to_bring_up(None, "lab", False, False, None, 3).count == 3
    assert where_to_bring_up(None, "lab", False, True, 2, 3).count == 2
    assert where_to_bring_up(_state(local=True), "lab", False, False, None, 5).count == 3  # as many as it has
    assert where_to_bring_up(_state(local=True), "lab", False, True, 4, 3).count == 4
    hosts_file = where_to_bring_up(_state(local=False), "lab", True, False, None, 3)
    assert hosts_file.recorded is None and hosts_file.count is None  # the hosts file says


@pytest.mark.parametrize("local, hosts_file, local_flag, nodes, says", [
    (False, False, True, None, "cluster lab runs on servers (gpu-1, gpu-2, gpu-3); a local cluster would remove it"),
    (False, False, False, 2, "cluster lab runs on servers"),
    (True, True, False, None, "cluster lab runs on this machine (3 local containers); kit up --hosts would remove"),
    (None, True, True, None, "--local is for a cluster on this machine; --hosts lists servers"),
    (None, True, False, 2, "--nodes is for a cluster on this machine; --hosts lists servers"),
])
def test_up_refuses_to_replace_one_kind_of_cluster_with_another(local, hosts_file, local_flag, nodes, says):
    from kit.cluster.lifecycle import where_to_bring_up
    state = None if local is None else _state(local)
    with pytest.raises(BadInput) as e:
        where_to_bring_up(state, "lab", hosts_file, local_flag, nodes, 3)
    assert str(e.value).startswith(says) and e.value.hint


def test_a_later_up_keeps_the_settings_the_cluster_runs_with_unless_a_flag_or_kit_yaml_gives_them():
    """`kit up --hosts hosts.txt --ssh-port 2222 --shm-size 8g`, later `kit up`: the containers keep port 2222 and
    8g, not the defaults (which would replace them all); a flag or kit.yaml's key is what changes them."""
    from dataclasses import replace

    from kit.cluster.lifecycle import kept_settings
    from kit.config.settings import ClusterConfig
    state = replace(_state(local=False), ssh_port=2222, shm_size="8g")
    assert kept_settings(state, ClusterConfig(), set()) == {"ssh_port": 2222, "workspace": "/w", "shm_size": "8g"}
    assert kept_settings(state, ClusterConfig(ssh_port=2300), {"ssh_port", "workspace"}) == {"shm_size": "8g"}
    same = ClusterConfig(ssh_port=2222, workspace="/w", shm_size="8g")
    assert kept_settings(state, same, set()) == {}  # nothing differs: nothing said
    assert kept_settings(replace(state, shm_size=""), ClusterConfig(shm_size="1g"), set()) == \
        {"ssh_port": 2222, "workspace": "/w", "shm_size": None}
    assert kept_settings(_state(local=True), ClusterConfig(), set()) == {} and \
        kept_settings(None, ClusterConfig(), set()) == {}


def test_recorded_hosts_are_not_asked_again_who_logs_in():
    """`kit run`, `logs`, `exec` ... on a cluster up recorded: each host's sudo is as up found it (one round trip a
    host less before a job); a record without it (an older kit's) asks."""
    from kit.cluster import state as st
    from kit.cluster.steps.preflight import recorded_nodes
    from kit.runners.base import Result

    class Asked:
        def __init__(self, host):
            self.host, self.sudo, self.commands = host.name, False, []

        def run(self, command, **kw):
            self.commands.append(command)
            return Result(self.host, command, 0, "0\n" if command == "id -u" else "")

    hosts = [st.HostState(name=n, address=n, place=_state(False).hosts[0].place, sudo=s)
             for n, s in (("a", True), ("b", False), ("c", None))]
    a, b, c = recorded_nodes(hosts, Asked)
    assert (a.runner.sudo, a.runner.commands) == (True, [])
    assert (b.runner.sudo, b.runner.commands) == (False, [])
    assert (c.runner.sudo, c.runner.commands) == (False, ["id -u"])
