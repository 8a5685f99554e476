"""kit bench net: its schedule, its helper (run here over loopback, for real) and how it names the slow links."""

import itertools
import json
import socket
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


def _receiver(seconds: str) -> tuple[subprocess.Popen, int]:
    recv = subprocess.Popen([sys.executable, "-c", netbench.HELPER, "recv", "127.0.0.1", "0", seconds],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    recv.stdin.write("t0ken\n")
    recv.stdin.close()
    return recv, json.loads(recv.stdout.readline())["port"]


def test_the_helper_measures_a_real_stream_over_loopback():
    recv, port = _receiver("1")
    send = subprocess.run([sys.executable, "-c", netbench.HELPER, "send", "127.0.0.1", str(port), "1"],
                          input="t0ken\n", text=True, timeout=60)
    figures = json.loads(recv.stdout.readline())
    assert recv.wait(timeout=60) == 0 and send.returncode == 0
    assert figures["bytes"] > 1 << 20 and 0.5 < figures["seconds"] < 30


def test_the_receiver_measures_the_sender_not_a_process_that_connects_first():
    """A job's process on the host that finds the port first (and streams, or says a wrong token) is closed: the
    figure is the sender's stream, which says the measurement's token first."""
    recv, port = _receiver("0.5")
    intruders = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    intruders[0].sendall(b"\n" + bytes(1 << 16))              # no token, then bytes that must not count
    intruders[1].sendall(b"guess\n" + bytes(1 << 16))
    send = subprocess.run([sys.executable, "-c", netbench.HELPER, "send", "127.0.0.1", str(port), "0.5"],
                          input="t0ken\n", text=True, timeout=60, capture_output=True)
    figures = json.loads(recv.stdout.readline())
    assert recv.wait(timeout=60) == 0 and send.returncode == 0, send.stderr
    assert figures["bytes"] % (1 << 20) == 0 and figures["bytes"] >= 1 << 20   # whole chunks: the sender's alone
    for s in intruders:
        with pytest.raises(OSError):   # closed by the receiver: the flood is refused, not measured
            for _ in range(200):
                s.sendall(bytes(1 << 20))
        s.close()


def test_the_slowest_links_and_the_host_they_share_are_named():
    links = [Link("a", "b", 0.94), Link("b", "a", 0.95), Link("a", "c", 0.095), Link("c", "a", 0.094),
             Link("b", "c", 0.096), Link("c", "b", 0.093)]
    assert [(l.source, l.target) for l in netbench.slowest(links)] == [("c", "b"), ("c", "a"), ("a", "c"),
                                                                        ("b", "c")]
    assert netbench.slow_host(links) == "c"
    assert netbench.slow_host([Link("a", "b", 0.5), Link("b", "a", 0.9)]) is None  # one slow link: no host to blame
