"""The network survey's connections between nodes: each node's listener, which answers a connection with its token
and takes a bandwidth probe's stream; the check that connects to every other node's address (`reach`, `check`);
the probe. Standard library only: shipped with kit.network.links, choose and survey (kit.network.shipped)."""

from __future__ import annotations

import math
import socket
import threading
import time

CONNECT_S = 2.0       # one connection of the reachability check
PROBE_S = 0.5         # each probed network's stream
WAIT_S = 120.0        # for every member's hello (a loaded host, a container image that starts slowly)
ANSWER_S = 60.0       # for a member's answer to a check
CHUNK = 1 << 20
OPEN_MAX = 64         # connections handled at once by a listener, and by the coordinator: one more is closed as it comes


class Gate:
    """At most `limit` connections handled at once, each in a thread of its own: one more is closed as it comes (a
    job's process that opens thousands starts no thread for each)."""

    def __init__(self, limit: int = OPEN_MAX) -> None:
        self.slots = threading.BoundedSemaphore(limit)

    def start(self, conn: socket.socket, handle, *args) -> None:
        if not self.slots.acquire(blocking=False):
            conn.close()
            return

        def run() -> None:
            try:
                handle(conn, *args)
            finally:
                self.slots.release()
        threading.Thread(target=run, daemon=True).start()


class Listener:
    """A node's listener for the others' connections: each is answered with the node's token; one that then says
    PROBE streams to it for a bounded time, and is answered with the bytes and seconds counted from its first byte to
    its end."""

    def __init__(self, token: str, timeout: float = WAIT_S + ANSWER_S) -> None:
        self.token, self.timeout = token, timeout
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))  # every address of the host: each candidate's is checked
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.done, self.gate = threading.Event(), Gate()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        deadline = time.monotonic() + self.timeout
        while not self.done.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.gate.start(conn, self._answer)
        self.sock.close()

    def _answer(self, conn: socket.socket) -> None:
        end = time.monotonic() + CONNECT_S + PROBE_S * 4
        with conn:
            try:
                conn.settimeout(CONNECT_S)
                conn.sendall(f"KIT {self.token}\n".encode())
                head = b""
                while b"\n" not in head and len(head) < 64:
                    data = conn.recv(64 - len(head))
                    if not data:
                        return
                    head += data
                line, _, rest = head.partition(b"\n")
                if line.strip() != b"PROBE":
                    return
                total, first = len(rest), time.monotonic() if rest else None
                while time.monotonic() < end:
                    conn.settimeout(max(end - time.monotonic(), 0.01))
                    data = conn.recv(CHUNK)
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


def probe(address: str, port: int, source: str, token: str, seconds: float = PROBE_S) -> float:
    """Gbit/s of one TCP stream from here to a node's listener for `seconds`, as its end counted them, never more
    than this end sent in the time it took to send it: the node must answer with its token, and a figure it gives
    that is not a count of what it was sent (more bytes, less time, nan) is not taken. Raises ValueError then."""
    with _connect(address, port, source, CONNECT_S + seconds * 4) as s:
        f = s.makefile("rb")
        if f.readline(128).decode(errors="replace").split() != ["KIT", token]:
            raise ValueError(f"{address} answered, but not as the node that said hello")
        s.sendall(b"PROBE\n")
        data, start = bytes(CHUNK), time.monotonic()
        sent, end = 0, start + seconds
        while time.monotonic() < end:
            s.sendall(data)
            sent += len(data)
        s.shutdown(socket.SHUT_WR)
        sending = time.monotonic() - start
        total, took = f.readline(128).split()
    total_, took_ = int(total), float(took)
    if not (0 <= total_ <= sent and math.isfinite(took_) and took_ >= 0):
        raise ValueError(f"{address} counted {total} bytes in {took} s of the {sent} sent: not a count")
    return total_ * 8 / max(took_, sending, 1e-6) / 1e9
