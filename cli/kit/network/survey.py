"""The network survey: which candidate networks really join the hosts, and which of them is fastest, measured from
where the ranks run. Standard library only: shipped as one script with kit.network.links and kit.network.choose
(kit.network.shipped), run in the cluster's containers by `kit up` and `kit doctor`, and in every task of a Slurm job
before its ranks start.

One node coordinates (the first: the primary's container, or the job's first task), the others are members; every
member reads its own network (links.SCRIPT), listens for the others' connections on a port of its own, and says hello
to the coordinator with what it read. The coordinator works out the candidates (choose.candidates), has one member a
node connect to every other node's address on each candidate (each answer carries the node's token: an address that
another host also answers is caught), probes the bandwidth to the second node on the networks whose reported speeds
do not tell them apart, decides (choose.decide) and tells every member.

Only the survey's own processes take part: each node has a key (kit gives each container its own on stdin; a Slurm
job's tasks share one in a file of the job's, mode 0600), and every message after the first is sealed with it
(HMAC-SHA256 over the other end's random nonce and the message), both ways: a process that found the coordinator's
port cannot speak for a node, and one that took the job's port before the coordinator cannot speak for it. Every
wait, and every message's size, is bounded.

    python kit_net.py coordinate ADDRESS NODES WAIT SETTING   kit's containers: NODES `name=address ...`, the first
                            this one; SETTING cluster.network or ""; the nodes' keys, {"name": "key"}, on stdin;
                            prints {"port": N}, then {"decision": ...} or {"error": ...}
    python kit_net.py member ADDRESS:PORT NAME WAIT           its key on stdin; prints {"decision": ...} or {"error": ...}
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import re
import secrets
import socket
import subprocess
import sys
import time

from kit.network.choose import Candidate, Decision, Refused, candidates, checked, decide  # shipped together
from kit.network.choose import to_probe, unaddressed_rdma  # shipped together
from kit.network.links import SCRIPT, Reading, parse  # shipped together
from kit.network.wire import ANSWER_S, CHUNK, CONNECT_S, OPEN_MAX, WAIT_S, Gate, Listener, check, probe, reach  # shipped together

HELLO_MAX = 256 << 10  # the longest hello (one host's reading) the coordinator reads
LINE_MAX = 4 << 20    # the longest other message (the decision: every candidate of every host)
NONCE = re.compile(r"[0-9a-f]{32}")


class SurveyError(Exception):
    pass


def read_here() -> Reading:
    """This host's network, as links.SCRIPT reads it (KIT_SYSFS, KIT_DEVFS: stand-in roots)."""
    out = subprocess.run(["sh", "-c", SCRIPT], capture_output=True, text=True, timeout=30)
    reading = parse(out.stdout)
    if reading.noip:
        raise SurveyError(f"`ip` (iproute2) is not installed on {socket.gethostname()}: the survey reads the "
                          "interfaces with it")
    return reading


class Channel:
    """One connection of the survey: a JSON object a line, each read within a deadline and a size."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer = conn, b""

    def send(self, message: dict) -> None:
        self.conn.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def receive(self, deadline: float, limit: int = LINE_MAX) -> dict:
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or len(self.buffer) > limit:
                raise SurveyError("no answer in time" if left <= 0 else "a message longer than the survey's")
            self.conn.settimeout(left)
            try:
                data = self.conn.recv(CHUNK)
            except socket.timeout:
                raise SurveyError("no answer in time") from None
            if not data:
                raise SurveyError("the other end closed the connection")
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise SurveyError("a message that is not the survey's")
        return message


def seal(key: str, nonce: str, body: dict) -> dict:
    """A message the other end (whose nonce this is) can tell came from a holder of the key, unchanged."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return {"body": body, "mac": hmac.new(key.encode(), (nonce + text).encode(), hashlib.sha256).hexdigest()}


def unseal(key: str, nonce: str, message: dict) -> dict:
    body = message.get("body")
    if not isinstance(body, dict) or not isinstance(message.get("mac"), str) or \
            not hmac.compare_digest(seal(key, nonce, body)["mac"], message["mac"]):
        raise SurveyError("a message that is not the survey's (its seal does not hold)")
    return body


def hello(node: str, reading: Reading, listener: Listener) -> dict:
    return {"node": node, "reading": reading.as_dict(), "port": listener.port, "token": listener.token}


class Peer:
    """A member, as the coordinator holds it: its channel, its node and key, and both ends' nonces."""

    def __init__(self, channel: Channel, node: str, key: str, theirs: str, ours: str, said: dict) -> None:
        self.channel, self.node, self.key, self.theirs, self.ours, self.said = channel, node, key, theirs, ours, said

    def send(self, body: dict) -> None:
        self.channel.send(seal(self.key, self.theirs, body))

    def receive(self, deadline: float) -> dict:
        return unseal(self.key, self.ours, self.channel.receive(deadline))


def greet(conn: socket.socket, keys: dict[str, str], deadline: float) -> Peer | None:
    """A connection to the coordinator: a Peer where it is a member of the survey (a node's hello, sealed with its
    key, whole and well formed), else None (it is not heard)."""
    channel, ours = Channel(conn), secrets.token_hex(16)
    try:
        channel.send({"nonce": ours})
        said = channel.receive(deadline, HELLO_MAX)
        node, theirs = said.get("node"), said.get("nonce")
        key = keys.get(node) if isinstance(node, str) else None
        if key is None or not isinstance(theirs, str) or not NONCE.fullmatch(theirs):
            return None
        body = unseal(key, ours, said)
        Reading.from_dict(body["reading"])
        if not (isinstance(body["port"], int) and 0 < body["port"] < 65536 and isinstance(body["token"], str)
                and re.fullmatch(r"[0-9a-f]{1,64}", body["token"]) and body["node"] == node):
            return None
    except (SurveyError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return Peer(channel, node, key, theirs, ours, body)


def coordinate(server: socket.socket, nodes: list[tuple[str, str]], expected: int, reading: Reading,
               keys: dict[str, str], setting: str | None = None, wait: float = WAIT_S) -> Decision:
    """The first node's part, on a listening socket: every member's hello (expected in all, this one among them),
    the checks, the probes, the decision, told to every member. keys: each node's. Raises SurveyError (of
    cluster.network too)."""
    listener = Listener(secrets.token_hex(8))
    names = [name for name, _ in nodes]
    hellos = {names[0]: hello(names[0], reading, listener)}
    members: list[Peer] = []
    greeted: queue.Queue = queue.Queue()
    gate = Gate()

    def greeter(conn: socket.socket, until: float) -> None:  # each hello in a thread: a slow one holds up no other
        peer = greet(conn, keys, until)
        if peer is None:
            conn.close()  # not one of the survey's members (a job's process that found the port): not heard
        else:
            greeted.put(peer)
    try:
        deadline = time.monotonic() + wait
        while len(members) < expected - 1:
            if time.monotonic() >= deadline:
                heard = {m.node for m in members} | {names[0]}
                raise SurveyError(f"only {len(members) + 1} of {expected} answered in {wait:.0f} s; none from "
                                  + ", ".join(n for n in names if n not in heard))
            server.settimeout(0.1)
            try:
                conn, _ = server.accept()
                gate.start(conn, greeter, min(deadline, time.monotonic() + CONNECT_S * 5))
            except socket.timeout:
                pass
            while not greeted.empty() and len(members) < expected - 1:
                peer = greeted.get()
                members.append(peer)
                hellos.setdefault(peer.node, peer.said)
        decision = _decide(nodes, hellos, members, setting)
        for m in members:
            m.send({"decision": decision.as_dict()})
        return decision
    except (Refused, SurveyError, OSError, ValueError, KeyError, TypeError) as e:
        for m in members:
            try:
                m.send({"error": str(e)})
            except OSError:
                pass
        raise SurveyError(str(e)) from None
    finally:
        for m in members:  # each member closes first, so the port is free again at once
            try:
                m.channel.conn.settimeout(5)
                m.channel.conn.recv(1)
            except OSError:
                pass
            m.channel.conn.close()
        listener.close()


def _decide(nodes: list[tuple[str, str]], hellos: dict[str, dict], members: list[Peer],
            setting: str | None) -> Decision:
    readings = {name: Reading.from_dict(hellos[name]["reading"]) for name, _ in nodes if name in hellos}
    found, notes = candidates(readings, dict(nodes))
    if len(readings) > 1:
        _check(found, hellos, members, nodes[0][0])
        _probe(found, hellos, nodes)
    decision = decide(found, setting if len(nodes) > 1 else None, notes)
    decision.warnings += unaddressed_rdma(readings, decision)
    return checked(decision, [name for name, _ in nodes])


def _targets(found: list[Candidate], hellos: dict[str, dict], node: str) -> list[list]:
    """What `node` connects to: every other node's address on each candidate both are on."""
    return [[c.network, other, m.address, hellos[other]["port"], hellos[other]["token"], c.members[node].address]
            for c in found if node in c.members for other, m in c.members.items() if other != node]


def _check(found: list[Candidate], hellos: dict[str, dict], members: list[Peer], first: str) -> None:
    asked = {}
    for m in members:
        if m.node not in asked and m.node != first:
            asked[m.node] = m
            m.send({"check": _targets(found, hellos, m.node)})
    results = {first: check(_targets(found, hellos, first))}
    deadline = time.monotonic() + ANSWER_S
    for node, m in asked.items():
        answer = m.receive(deadline).get("reached")
        if not isinstance(answer, list) or not all(isinstance(r, list) and len(r) == 3 and
                                                   all(isinstance(x, str) for x in r) for r in answer):
            raise SurveyError(f"{node} did not say what it reached")
        results[node] = answer
    by_network = {c.network: c for c in found}
    for node, reached in results.items():
        for network, other, error in reached:
            if error and network in by_network:
                by_network[network].failed[f"{node} -> {other}"] = error[:200]


def _probe(found: list[Candidate], hellos: dict[str, dict], nodes: list[tuple[str, str]]) -> None:
    first, second = nodes[0][0], nodes[1][0]
    tied = to_probe(found)
    for c in found:
        if c.network in tied and second in c.members and first in c.members:
            try:
                c.gbits = probe(c.members[second].address, hellos[second]["port"], c.members[first].address,
                                hellos[second]["token"])
            except (OSError, ValueError) as e:
                c.failed[f"{first} -> {second}"] = f"the bandwidth probe failed: {e}"


def member(address: str, port: int, node: str, reading: Reading, key: str, wait: float = WAIT_S) -> Decision:
    """A member's part: hello, the checks asked of it, then the decision (SurveyError: the coordinator's)."""
    listener = Listener(secrets.token_hex(8))
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                conn = socket.create_connection((address, port), timeout=CONNECT_S)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise SurveyError(f"the survey's first node at {address}:{port} does not answer: {e}") from None
                time.sleep(0.2)
        with conn:
            channel, ours = Channel(conn), secrets.token_hex(16)
            theirs = channel.receive(time.monotonic() + CONNECT_S * 5, 256).get("nonce")
            if not isinstance(theirs, str) or not NONCE.fullmatch(theirs):
                raise SurveyError(f"what answers at {address}:{port} is not the survey's first node")
            channel.send({"node": node, "nonce": ours, **seal(key, theirs, hello(node, reading, listener))})
            while True:
                said = unseal(key, ours, channel.receive(time.monotonic() + wait + ANSWER_S))
                if "check" in said:
                    channel.send(seal(key, theirs, {"reached": check(said["check"])}))
                elif "decision" in said:
                    return Decision.from_dict(said["decision"])
                elif "error" in said:
                    raise SurveyError(str(said["error"]))
    finally:
        listener.close()


def listen(address: str, port: int = 0) -> socket.socket:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((address, port))
    except OSError as e:
        server.close()
        raise SurveyError(f"cannot listen at {address}:{port} ({e.strerror or e}): another program holds the port")
    server.listen(256)
    return server


def nodes_arg(text: str) -> list[tuple[str, str]]:
    return [tuple(pair.split("=", 1)) for pair in text.split()]


def task(env: dict, nodes: list[tuple[str, str]]) -> Decision:
    """A Slurm task's part (kit_task.py): the job's first task coordinates at the first node's address and the job's
    port, every other is a member; the job's key is in the file KIT_NET_KEY names, KIT_SUBNET is the setting."""
    rank, tasks = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    with open(env["KIT_NET_KEY"]) as f:
        key = f.read().strip()
    reading = read_here()
    if rank == 0:
        with listen(nodes[0][1], int(env["KIT_PORT"])) as server:
            return coordinate(server, nodes, tasks, reading, {name: key for name, _ in nodes},
                              env.get("KIT_SUBNET") or None)
    decision = member(nodes[0][1], int(env["KIT_PORT"]), nodes[int(env["SLURM_NODEID"])][0], reading, key)
    return checked(decision, [name for name, _ in nodes])


def main(argv: list[str]) -> int:
    """coordinate ADDRESS NODES WAIT SETTING ("": none) | member ADDRESS:PORT NAME WAIT; the keys on stdin"""
    try:
        given = sys.stdin.read(1 << 20)
        if argv[1] == "coordinate":
            nodes, keys = nodes_arg(argv[3]), json.loads(given)
            with listen(argv[2]) as server:
                print(json.dumps({"port": server.getsockname()[1]}), flush=True)
                decision = coordinate(server, nodes, len(nodes), read_here(), keys, argv[5] or None, float(argv[4]))
        else:
            address, _, port = argv[2].rpartition(":")
            decision = member(address, int(port), argv[3], read_here(), given.strip(), float(argv[4]))
    except Exception as e:  # noqa: BLE001 - whatever went wrong is said on the line kit reads
        print(json.dumps({"error": f"{type(e).__name__}: {e}" if not isinstance(e, SurveyError) else str(e)}),
              flush=True)
        return 1
    print(json.dumps({"decision": decision.as_dict()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
