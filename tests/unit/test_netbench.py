"""kit bench net: its schedule, its helper (run here over loopback, for real) and how it names the slow links."""

import itertools
import json
import subprocess
import sys

import pytest

from kit.bench import net as netbench
from kit.bench.net import Link


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_every_ordered_pair_is_measured_once_and_no_host_is_in_two_pairs_of_a_round(n):
    names = [f"h{i}" for i in range(n)]
    rounds = netbench.rounds(names)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == sorted(itertools.permutations(names, 2))
    for r in rounds:
        hosts = [h for p in r for h in p]
        assert len(hosts) == len(set(hosts))
    assert len(rounds) == 2 * (n - 1 if n % 2 == 0 else n)


def test_the_helper_measures_a_real_stream_over_loopback():
    recv = subprocess.Popen([sys.executable, "-c", netbench.HELPER, "recv", "127.0.0.1", "0", "1"],
                            stdout=subprocess.PIPE, text=True)
    port = json.loads(recv.stdout.readline())["port"]
    send = subprocess.run([sys.executable, "-c", netbench.HELPER, "send", "127.0.0.1", str(port), "1"], timeout=60)
    figures = json.loads(recv.stdout.readline())
    assert recv.wait(timeout=60) == 0 and send.returncode == 0
    assert figures["bytes"] > 1 << 20 and 0.5 < figures["seconds"] < 30


def test_the_slowest_links_and_the_host_they_share_are_named():
    links = [Link("a", "b", 0.94), Link("b", "a", 0.95), Link("a", "c", 0.095), Link("c", "a", 0.094),
             Link("b", "c", 0.096), Link("c", "b", 0.093)]
    assert [(l.source, l.target) for l in netbench.slowest(links)] == [("c", "b"), ("c", "a"), ("a", "c"),
                                                                        ("b", "c")]
    assert netbench.slow_host(links) == "c"
    assert netbench.slow_host([Link("a", "b", 0.5), Link("b", "a", 0.9)]) is None  # one slow link: no host to blame
