"""The local cluster's pure parts: which subnet it takes, and what `kit demo` reads from the example."""

from ipaddress import IPv4Network
from pathlib import Path

import pytest

from kit.demo import Training
from kit.errors import BadInput
from kit.local import POOLS, check_count, docker_subnets, free_subnet, routes
from kit.steps.facts import NetworkFacts, parse_facts

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
