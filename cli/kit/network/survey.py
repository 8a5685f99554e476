"""The network survey: which candidate networks really join the hosts, and which of them is fastest, measured from
where the ranks run. Standard library only: shipped as one script with kit.network.links and kit.network.choose
(kit.network.shipped), run in the cluster's containers by `kit up` and `kit doctor`, and in every task of a Slurm job
before its ranks start.

One node coordinates (the first: the primary's container, or the job's first task), the others are members; every
member reads its own network (links.SCRIPT), listens for the others' connections on a port of its own, and says hello
to the coordinator with what it read. The coordinator works out the candidates (choose.candidates), has one member a
node connect to every other node's address on each candidate (each answer carries the node's token: an address that
another host also answers is caught), probes the bandwidth to the second node on the networks whose reported speeds
do not tell them apart, decides (choose.decide) and tells every member. Every wait is bounded.

    python kit_net.py coordinate ADDRESS NODES WAIT SETTING   kit's containers: NODES `name=address ...`, the first
                                          this one; SETTING cluster.network or ""; prints {"port": N}, then
                                          {"decision": ...} or {"error": ...}
    python kit_net.py member ADDRESS:PORT NAME WAIT             prints {"decision": ...} or {"error": ...}
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import threading
import time

from kit.network.choose import Candidate, Decision, Refused, candidates, decide, to_probe  # shipped together
from kit.network.links import SCRIPT, Reading, parse  # shipped together

CONNECT_S = 2.0       # one connection of the reachability check
PROBE_S = 0.5         # each probed network's stream
WAIT_S = 120.0        # for every member's hello (a loaded host, a container image that starts slowly)
ANSWER_S = 60.0       # for a member's answer to a check
LINE_MAX = 1 << 20    # the longest message kit reads
CHUNK = 1 << 20


class SurveyError(Exception):
    pass


def read_here() -> Reading:
    """This host's network, as links.SCRIPT reads it (KIT_SYSFS, KIT_DEVFS: stand-in roots)."""
    out = subprocess.run(["sh", "-c", SCRIPT], capture_output=True, text=True, timeout=30)
    return parse(out.stdout)


def send(f, message: dict) -> None:
    f.write(json.dumps(message).encode() + b"\n")
    f.flush()


def receive(f) -> dict:
    line = f.readline(LINE_MAX)
    if not line:
        raise SurveyError("the other end closed the connection")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise SurveyError("a message that is not kit's")
    return message


class Listener:
    """A node's listener for the others' connections: each is answered with the node's token; one that then says
    PROBE streams to it, and is answered with the bytes and seconds counted from its first byte to its end."""

    def __init__(self, token: str, timeout: float = WAIT_S + ANSWER_S) -> None:
        self.token, self.timeout = token, timeout
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))  # every address of the host: each candidate's is checked
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        deadline = time.monotonic() + self.timeout
        while not self.done.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()
        self.sock.close()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(CONNECT_S + PROBE_S * 4)
            try:
                conn.sendall(f"KIT {self.token}\n".encode())
                f = conn.makefile("rb")
                if f.readline(64).strip() != b"PROBE":
                    return
                total, first = 0, None
                while True:
                    data = f.read1(CHUNK) if hasattr(f, "read1") else f.read(CHUNK)
                    if not data:
                        break
                    first = first or time.monotonic()
                    total += len(data)
                conn.sendall(f"{total} {time.monotonic() - (first or time.monotonic()):.6f}\n".encode())
            except OSError:
                pass

    def close(self) -> None:
        self.done.set()


def _connect(address: str, port: int, source: str, timeout: float = CONNECT_S) -> socket.socket:
    return socket.create_connection((address, port), timeout=timeout, source_address=(source, 0) if source else None)


def reach(target: list) -> str:
    """One connection of the check: "" where the node answered with its token, else what went wrong."""
    network, node, address, port, token, source = target
    try:
        with _connect(address, int(port), source) as s:
            said = s.makefile("rb").readline(128).decode(errors="replace").split()
    except OSError as e:
        return f"{address}:{port}: {e.strerror or e}"
    if said[:1] != ["KIT"] or said[1:] != [token]:
        return f"{address} answered, but is not {node} (another host has that address)"
    return ""


def check(targets: list[list]) -> list[list]:
    """Every connection at once: [[network, node, error]] for each target."""
    results: list = [None] * len(targets)

    def one(i: int) -> None:
        results[i] = [targets[i][0], targets[i][1], reach(targets[i])]
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(CONNECT_S * 3)
    return [r or [t[0], t[1], "no answer in time"] for r, t in zip(results, targets)]


def probe(address: str, port: int, source: str, seconds: float = PROBE_S) -> float:
    """Gbit/s of one TCP stream from here to a node's listener for `seconds`, as its end counted them."""
    with _connect(address, port, source, CONNECT_S + seconds * 4) as s:
        f = s.makefile("rb")
        f.readline(128)
        s.sendall(b"PROBE\n")
        data, end = bytes(CHUNK), time.monotonic() + seconds
        while time.monotonic() < end:
            s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        total, took = f.readline(128).split()
    return int(total) * 8 / max(float(took), 1e-6) / 1e9


def hello(node: str, reading: Reading, listener: Listener) -> dict:
    return {"node": node, "reading": reading.as_dict(), "port": listener.port, "token": listener.token}


def coordinate(server: socket.socket, nodes: list[tuple[str, str]], expected: int, reading: Reading,
               setting: str | None = None, wait: float = WAIT_S) -> Decision:
    """The first node's part, on a listening socket: every member's hello (expected in all, this one among them),
    the checks, the probes, the decision, told to every member. Raises SurveyError (Refused: of cluster.network)."""
    listener = Listener(secrets.token_hex(8))
    names = [name for name, _ in nodes]
    hellos = {names[0]: hello(names[0], reading, listener)}
    members: list[tuple[socket.socket, object, dict]] = []
    try:
        deadline = time.monotonic() + wait
        while len(members) < expected - 1:
            server.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                conn, _ = server.accept()
            except socket.timeout:
                heard = {m[2]["node"] for m in members} | {names[0]}
                raise SurveyError(f"only {len(members) + 1} of {expected} answered in {wait:.0f} s; none from "
                                  + ", ".join(n for n in names if n not in heard)) from None
            conn.settimeout(CONNECT_S * 5)
            f = conn.makefile("rwb")
            try:
                said = receive(f)
            except (SurveyError, OSError, ValueError):
                said = {}
            if said.get("node") not in names or not isinstance(said.get("reading"), dict):
                conn.close()  # not one of the survey's members (a job's process that found the port): not heard
                continue
            conn.settimeout(ANSWER_S)
            members.append((conn, f, said))
            hellos.setdefault(said["node"], said)
        decision = _decide(nodes, hellos, members, listener, setting)
        for _, f, _ in members:
            send(f, {"decision": decision.as_dict()})
        return decision
    except (Refused, SurveyError, OSError, ValueError, KeyError) as e:
        for _, f, _ in members:
            try:
                send(f, {"error": str(e)})
            except OSError:
                pass
        raise SurveyError(str(e)) from None
    finally:
        for conn, f, _ in members:  # each member closes first, so the port is free again at once
            try:
                conn.settimeout(5)
                f.read(1)
            except OSError:
                pass
            conn.close()
        listener.close()


def _decide(nodes: list[tuple[str, str]], hellos: dict[str, dict], members: list, listener: Listener,
            setting: str | None) -> Decision:
    readings = {name: Reading.from_dict(hellos[name]["reading"]) for name, _ in nodes if name in hellos}
    found, notes = candidates(readings, dict(nodes))
    if len(readings) > 1:
        _check(found, hellos, members, nodes[0][0])
        _probe(found, hellos, nodes)
    return decide(found, setting, notes)


def _targets(found: list[Candidate], hellos: dict[str, dict], node: str) -> list[list]:
    """What `node` connects to: every other node's address on each candidate both are on."""
    return [[c.network, other, m.address, hellos[other]["port"], hellos[other]["token"], c.members[node].address]
            for c in found if node in c.members for other, m in c.members.items() if other != node]


def _check(found: list[Candidate], hellos: dict[str, dict], members: list, first: str) -> None:
    asked = {}
    for conn, f, said in members:
        if said["node"] not in asked and said["node"] != first:
            asked[said["node"]] = f
            send(f, {"check": _targets(found, hellos, said["node"])})
    results = {first: check(_targets(found, hellos, first))}
    for node, f in asked.items():
        answer = receive(f).get("reached")
        if not isinstance(answer, list):
            raise SurveyError(f"{node} did not say what it reached")
        results[node] = answer
    by_network = {c.network: c for c in found}
    for node, reached in results.items():
        for network, other, error in reached:
            if error and network in by_network:
                by_network[network].failed[f"{node} -> {other}"] = str(error)[:200]


def _probe(found: list[Candidate], hellos: dict[str, dict], nodes: list[tuple[str, str]]) -> None:
    first, second = nodes[0][0], nodes[1][0]
    tied = to_probe(found)
    for c in found:
        if c.network in tied and second in c.members and first in c.members:
            try:
                c.gbits = probe(c.members[second].address, hellos[second]["port"], c.members[first].address)
            except (OSError, ValueError) as e:
                c.failed[f"{first} -> {second}"] = f"the bandwidth probe failed: {e}"


def member(address: str, port: int, node: str, reading: Reading, wait: float = WAIT_S) -> Decision:
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
            conn.settimeout(wait + ANSWER_S)
            f = conn.makefile("rwb")
            send(f, hello(node, reading, listener))
            while True:
                said = receive(f)
                if "check" in said:
                    send(f, {"reached": check(said["check"])})
                elif "decision" in said:
                    return Decision.from_dict(said["decision"])
                elif "error" in said:
                    raise SurveyError(str(said["error"]))
    finally:
        listener.close()


def listen(address: str, port: int = 0) -> socket.socket:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(256)
    return server


def nodes_arg(text: str) -> list[tuple[str, str]]:
    return [tuple(pair.split("=", 1)) for pair in text.split()]


def task(env: dict, nodes: list[tuple[str, str]]) -> Decision:
    """A Slurm task's part (kit_task.py): the job's first task coordinates at the first node's address and the job's
    port, every other is a member; KIT_SUBNET is the setting."""
    rank, tasks = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
    reading = read_here()
    if rank == 0:
        with listen(nodes[0][1], int(env["KIT_PORT"])) as server:
            return coordinate(server, nodes, tasks, reading, env.get("KIT_SUBNET") or None)
    return member(nodes[0][1], int(env["KIT_PORT"]), nodes[int(env["SLURM_NODEID"])][0], reading)


def main(argv: list[str]) -> int:
    """coordinate ADDRESS NODES WAIT SETTING ("": none) | member ADDRESS:PORT NAME WAIT"""
    try:
        if argv[1] == "coordinate":
            nodes = nodes_arg(argv[3])
            with listen(argv[2]) as server:
                print(json.dumps({"port": server.getsockname()[1]}), flush=True)
                decision = coordinate(server, nodes, len(nodes), read_here(), argv[5] or None, float(argv[4]))
        else:
            address, _, port = argv[2].rpartition(":")
            decision = member(address, int(port), argv[3], read_here(), float(argv[4]))
    except (SurveyError, OSError, ValueError) as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 1
    print(json.dumps({"decision": decision.as_dict()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
