"""`kit bench net`: the raw TCP throughput between every two hosts of the cluster, both ways, as a matrix.

A small helper (standard library only, sent as `python -c`) runs in the containers: the receiver listens on its
address on the training network (kit.network: where the ranks talk), the sender streams to it for a few seconds, the
receiver times the bytes from the first to the last. Both are given a token of the measurement on stdin (not in argv,
which any process of the host may read), the sender says it first, and the receiver counts the connection that says
it: a job's process that connects first is closed, not measured.
Pairs run in rounds where no host is in two pairs (a round-robin schedule), so each figure is one link's alone and
a round of n hosts takes as long as one pair.
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import asdict, dataclass

from kit.jobs.commands.docker import command, exec_argv
from kit.errors import KitError
from kit.cluster.fanout import fan_out
from kit.cluster.steps.node import Node

SECONDS = 3.0
CONNECT_S = 20      # the sender tries to reach the receiver this long (it may start first)

HELPER = r"""
import json, socket, sys, time
mode, address, port, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
token = sys.stdin.readline().strip().encode()
CHUNK = 1 << 20
if mode == "recv":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((address, port))
    s.listen(8)
    print(json.dumps({"port": s.getsockname()[1]}), flush=True)
    deadline = time.monotonic() + seconds + %(connect)d
    while True:  # the connection that says the token, until the deadline (accept's timeout ends it)
        s.settimeout(max(deadline - time.monotonic(), 0.01))
        conn, _ = s.accept()
        conn.settimeout(5)
        head = b""
        try:
            while b"\n" not in head and len(head) < 128:
                data = conn.recv(128 - len(head))
                if not data:
                    break
                head += data
        except OSError:
            pass
        line, _, rest = head.partition(b"\n")
        if token and line == token:
            break
        conn.close()
    conn.settimeout(seconds + %(connect)d)
    buf = bytearray(CHUNK)
    total, first = len(rest), (time.monotonic() if rest else None)
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        if first is None:
            first = time.monotonic()
        total += n
    print(json.dumps({"bytes": total, "seconds": time.monotonic() - (first or time.monotonic())}))
else:
    deadline = time.monotonic() + %(connect)d
    while True:
        try:
            s = socket.create_connection((address, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    s.sendall(token + b"\n")
    data = bytes(CHUNK)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
""" % {"connect": CONNECT_S}


@dataclass(frozen=True)
class Link:
    source: str
    target: str
    gbits: float   # Gbit/s, as the receiver counted it


def rounds(names: list[str]) -> list[list[tuple[str, str]]]:
    """Every ordered pair once, in rounds where no host is in two pairs (the circle method, both ways). Pure."""
    people = list(names) + ([None] if len(names) % 2 else [])
    n, out = len(people), []
    for r in range(n - 1):
        pairs = [(people[i], people[n - 1 - i]) for i in range(n // 2)]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        out.append(pairs)
        out.append([(b, a) for a, b in pairs])
        people = [people[0], people[-1], *people[1:-1]]
    return [r for r in out if r]


def helper_argv(*args: str) -> list[str]:
    """Isolated (-I): its modules are the standard library's, whatever the workspace (its folder) holds."""
    return ["python", "-I", "-c", HELPER, *args]


def helper_command(node: Node, seconds: float, *args: str) -> str:
    """The helper in the node's container, bounded here too (its sockets time out on their own); its token on
    stdin."""
    return command(["timeout", str(int(seconds * 2 + CONNECT_S * 2 + 30)),
                    *exec_argv(node.place.container, helper_argv(*args), ("-i",))])


def measure(sender: Node, receiver: Node, seconds: float = SECONDS, at: str = "") -> Link:
    """One link: the receiver listens on a free port of its address `at` (default: its cluster address) and says
    which, the sender streams to it for `seconds`, the receiver says how many bytes came in how long."""
    at = at or receiver.address
    token = (secrets.token_hex(16) + "\n").encode()
    lines: list[str] = []
    listening = threading.Event()

    def on_line(line: str) -> None:
        lines.append(line)
        listening.set()
    code: list[int] = []
    listener = threading.Thread(target=lambda: code.append(receiver.runner.stream_out(
        helper_command(receiver, seconds, "recv", at, "0", str(seconds)), on_line, stdin=token)))
    listener.start()
    ready = listening.wait(CONNECT_S + 30)
    port = json.loads(lines[0]).get("port") if ready and lines[0].startswith("{") else None
    sent = sender.runner.run(helper_command(sender, seconds, "send", at, str(port), str(seconds)), stdin=token) \
        if port else None
    listener.join()
    if not (port and sent.ok and code == [0] and len(lines) > 1):
        said = "\n".join(lines[-5:]) if not sent or sent.ok else sent.tail()
        raise KitError(f"the throughput test from {sender.name} to {receiver.name} ({at}) failed",
                       host=receiver.name if not sent or sent.ok else sender.name, command="kit's throughput helper",
                       output_tail=said, hint="run `kit doctor`: it names what keeps the hosts from each other")
    figures = json.loads(lines[-1])
    return Link(sender.name, receiver.name, figures["bytes"] * 8 / max(figures["seconds"], 1e-9) / 1e9)


def bench_net(nodes: list[Node], seconds: float = SECONDS, on_link=lambda link: None,
              at: dict[str, str] | None = None) -> list[Link]:
    """Every link, both ways; at: each host's address to measure at (default: its cluster address)."""
    by_name, at = {n.name: n for n in nodes}, at or {}
    links = []
    for pairs in rounds([n.name for n in nodes]):
        found = fan_out("the throughput test", pairs, lambda p: measure(by_name[p[0]], by_name[p[1]], seconds,
                                                                        at.get(p[1], "")),
                        lambda p: f"{p[0]} -> {p[1]}")
        for link in found:
            on_link(link)
        links += found
    return links


def slowest(links: list[Link]) -> list[Link]:
    """The slowest link, and every other within 10% of it (a slow host's links are all slow). Pure."""
    if not links:
        return []
    low = min(l.gbits for l in links)
    return sorted((l for l in links if l.gbits <= low * 1.1), key=lambda l: l.gbits)


def slow_host(links: list[Link]) -> str | None:
    """The host every one of the slowest links touches, when there is one and more than one such link. Pure."""
    low = slowest(links)
    common = set.intersection(*({l.source, l.target} for l in low)) if len(low) > 1 else set()
    return common.pop() if len(common) == 1 else None


def as_json(links: list[Link]) -> dict:
    return {"links": [asdict(l) for l in links], "slowest": [asdict(l) for l in slowest(links)],
            "slow_host": slow_host(links)}
