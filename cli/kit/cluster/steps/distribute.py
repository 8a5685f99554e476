"""The image's missing layers to every host that lacks them, without a registry; kit's own link carries each byte once.

The hosts that need layers form a chain, in hosts.txt's order. kit streams the
layers (gzip'd, from its cache; see steps/image.py) over SSH to the first; each
host's relay (kit/relay.py, run with the host's python3) gives them to `docker
load` as they arrive and passes them on over TCP to the next host, on the
address kit reaches that host at, while it receives. So the chain moves the
image about as fast as one host takes it, however long it is.

A hop that cannot be reached (or whose relay does not start) is routed around:
its predecessor goes on to the host after it, and kit sends it its layers from
here at once. A host whose docker load fails still passes the layers on; one
that drops out mid-way cuts off the rest of the chain, which is served again in
another round without it (the summary names each); each round's first host is
never served again, so the rounds end. A host alone, or one without python3, is
sent its layers from here too, as `docker load` reads them. Nothing half-sent is
ever loaded: a relay that fails kills its `docker load` before the tar ends, and
Docker keeps nothing of it. Ctrl-C closes every host's connection at once: kit
waits for no transfer or load to end.
"""

from __future__ import annotations

import secrets
import shlex
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol

from kit.image import relay
from kit.errors import HostsFailed, KitError
from kit.hostoutput import is_number
from kit.runners.base import Conversation, TAIL_LINES
from kit.cluster.steps.image import Blob, Layers, chunks
from kit.cluster.steps.node import Node

RELAY_SCRIPT = Path(relay.__file__).read_text()
RELAY_COMMAND = f"python3 -I -c {shlex.quote(RELAY_SCRIPT)}"  # what it is told comes on stdin
STALL_S = 30          # a hop that moves no byte (and says nothing) for this long has failed
START_S = 15          # a relay says where it listens within this
LOAD_LIMIT_S = 1800   # docker load of what arrived, on a slow disk
RELAY_NAME = "kit's image relay (python3 -c ...)"  # the command, in a failure line
LOAD_COMMAND = "docker load && echo loaded"  # not exec'd by the shell: a killed load is reported as exit 137
LOAD_HINT = "check free disk space and that Docker runs on the host, then run kit up again"


class Progress(Protocol):
    def status(self, host: str, text: str) -> None: ...
    def transfer(self, host: str, done: int, total: int) -> None: ...


@dataclass(frozen=True)
class Sent:
    """What the image step moved, for up's summary and the benchmarks."""

    hosts: int
    layers: int            # the most layers one host was sent
    image_layers: int
    stream_bytes: int      # gzip'd bytes of those layers
    image_bytes: int
    from_here: int         # bytes that left this machine
    between_hosts: int     # bytes the hosts passed on to each other
    seconds: float
    arrived: float         # seconds until every host had every byte (the rest: docker load applying the layers)
    routes: tuple[str, ...] = ()  # hosts routed around, or cut off and served again, and why

    def __str__(self) -> str:
        hosts = f"{self.hosts} host{'s' if self.hosts > 1 else ''}"
        line = (f"sent {self.layers} of the image's {self.image_layers} layers ({self.stream_bytes / 1e6:,.1f} MB "
                f"compressed; the image is {self.image_bytes / 1e9:.2f} GB) to {hosts} in {self.seconds:.1f} s (every byte "
                f"was there after {self.arrived:.1f} s): "
                f"{self.from_here / 1e6:,.1f} MB left this machine, {self.between_hosts / 1e6:,.1f} MB went from "
                f"host to host")
        return "\n".join([line, *self.routes])


@dataclass
class Hop:
    """One host in one round of the chain."""

    node: Node
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    talk: Conversation | None = None
    port: int = 0
    received: int = 0
    forwarded: int = 0
    state: str = "starting"   # listening, done, failed, upstream (cut off before it: served again), skipped (routed
    #                           around: served from here)
    reason: str = ""
    tail: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)  # end() is atomic

    @property
    def name(self) -> str:
        return self.node.name

    def end(self, state: str, reason: str = "", tail: str = "") -> bool:
        """Its outcome, unless it has one already (the first word stands); whether this one stood."""
        with self.lock:
            if self.state in ("done", "failed", "upstream", "skipped"):
                return False
            self.state, self.reason, self.tail = state, reason, tail
            return True


def distribute(nodes: list[Node], layers: Layers, starts: dict[str, int], progress: Progress,
               stall: float = STALL_S) -> Sent:
    """Each node's layers from starts[name] up; raises HostsFailed naming each host that did not load the image."""
    began = time.monotonic()
    arrivals = _Arrivals(progress)
    with ThreadPoolExecutor(max_workers=len(nodes) + 1) as pool:
        run = _Distribution(layers, starts, arrivals, stall, pool)
        try:
            chained = [n for n in nodes if n.facts.python3 and not n.place.private]
            for n in nodes:
                if n not in chained:
                    run.direct(n)
            pending = chained
            while len(pending) > 1:
                pending = run.round(pending)
            for n in pending:
                run.direct(n)
            for job in list(run.jobs):
                job.result()
        except BaseException:  # Ctrl-C: not a wait for the transfers still going
            _stop(nodes)
            raise
    if run.failures:
        raise HostsFailed("copying the image", run.failures)
    streams = [layers.stream(starts[n.name]) for n in nodes]
    return Sent(len(nodes), max(map(len, streams)), len(layers.diff_ids), max(sum(b.size for b in s) for s in streams),
                layers.image.size, run.from_here, run.between, time.monotonic() - began,
                max(arrivals.at.values(), default=began) - began, tuple(run.routes))


class _Arrivals:
    """Progress passed on, and when each host had every byte of its layers."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.at = progress, {}

    def status(self, host: str, text: str) -> None:
        self.progress.status(host, text)

    def transfer(self, host: str, done: int, total: int) -> None:
        if done >= total and host not in self.at:
            self.at[host] = time.monotonic()
        self.progress.transfer(host, done, total)


class _Distribution:
    """The state of one image step: bytes counted, hosts routed around, failures."""

    def __init__(self, layers: Layers, starts: dict[str, int], progress: Progress, stall: float,
                 pool: ThreadPoolExecutor) -> None:
        self.layers, self.starts, self.progress, self.stall, self.pool = layers, starts, progress, stall, pool
        self.lock = threading.Lock()
        self.from_here = self.between = 0
        self.failures: dict[str, KitError] = {}
        self.routes: list[str] = []
        self.jobs: list[Future] = []

    def direct(self, node: Node) -> None:
        """The host's layers straight from here, as `docker load` reads them (in the pool)."""
        self.jobs.append(self.pool.submit(self._direct, node))

    def _direct(self, node: Node) -> None:
        stream = self.layers.stream(self.starts[node.name])
        total = sum(b.size for b in stream)
        sent = 0

        def counted() -> Iterator[bytes]:
            nonlocal sent
            for part in _tar(self.layers, stream):
                yield part
                sent += len(part)
                with self.lock:
                    self.from_here += len(part)
                self.progress.transfer(node.name, min(sent, total), total)
        self.progress.status(node.name, "receiving the image")
        try:  # docker load says nothing until the image is in, which may take many minutes on a slow disk
            r = node.runner.stream_in(LOAD_COMMAND, counted(), lambda n: None, finish=LOAD_LIMIT_S)
        except Exception as e:  # noqa: BLE001 - whatever breaks on one host is that host's failure
            self.fail(node.name, f"loading image {self.layers.image.tag} failed: {e}", LOAD_COMMAND, "")
            return
        if not r.ok:
            self.fail(node.name, f"loading image {self.layers.image.tag} failed (exit {r.exit_code})",
                      LOAD_COMMAND, r.tail())

    def fail(self, host: str, message: str, command: str, tail: str) -> None:
        with self.lock:
            self.failures[host] = KitError(message, host=host, command=command, output_tail=tail or None,
                                           hint=LOAD_HINT)

    def round(self, nodes: list[Node]) -> list[Node]:
        """One chain through `nodes`; the hosts it cut off, to be served by another."""
        hops = [Hop(n) for n in nodes]
        sent = _chain(hops, self.layers, min(self.starts[n.name] for n in nodes), self.progress, self.stall,
                      self.route_around)
        with self.lock:
            self.from_here += sent
            self.between += sum(h.forwarded for h in hops)
        again = [h for h in hops[1:] if h.state == "upstream"]
        for h in hops:
            if h.state == "failed" or (h is hops[0] and h.state not in ("done", "skipped")):
                self.fail(h.name, f"loading image {self.layers.image.tag} failed: {h.reason}", RELAY_NAME, h.tail)
        with self.lock:
            self.routes += [f"{h.name}: cut off ({h.reason}); sent its layers again" for h in again]
        return [h.node for h in again]

    def route_around(self, hop: Hop, reason: str) -> None:
        """A host its predecessor could not reach, or whose relay did not start: its relay stops, and it is served
        from here at once."""
        with self.lock:
            self.routes.append(f"{hop.name}: {reason}; routed around it and sent its layers from here")
        if hop.talk is not None:
            hop.talk.close()
        self.direct(hop.node)


def _tar(layers: Layers, stream: tuple[Blob, ...]) -> Iterator[bytes]:
    """The tar `docker load` reads: the gzip'd layers a host lacks, then the config and manifest."""
    for blob in stream:
        yield relay.tar_header(blob.name, blob.size)
        yield from chunks(blob.path)
        yield relay.padding(blob.size)
    yield relay.image_tail(layers.config, layers.image.tag, layers.manifest())


def _stop(nodes: list[Node]) -> None:
    """Ctrl-C: each host's connection closes, so no transfer goes on and kit waits for none (a reader of a relay's
    lines ends at once), and none starts: a closed runner starts nothing. There, a `docker load` fed from here has
    its input cut before the tar ends (Docker keeps nothing of it) or, with every byte in, finishes; a relay ends at
    its next word to kit, or kills its load at its stall."""
    for n in nodes:
        n.runner.close()


def _chain(hops: list[Hop], layers: Layers, start: int, progress: Progress, stall: float,
           route_around: Callable[[Hop, str], None]) -> int:
    """One chain: hops[0] fed from here, each passing on to the next that answers. Returns the bytes sent from here."""
    with ThreadPoolExecutor(max_workers=len(hops)) as pool:
        try:
            return _run_chain(hops, layers, start, pool, progress, stall, route_around)
        except BaseException:  # before this pool waits for the relays' readers
            _stop([h.node for h in hops])
            raise
        finally:
            for h in hops:
                if h.talk is not None:
                    h.talk.close()


def _run_chain(hops: list[Hop], layers: Layers, start: int, pool: ThreadPoolExecutor, progress: Progress,
               stall: float, route_around: Callable[[Hop, str], None]) -> int:
    stream = layers.stream(start)
    total = sum(b.size for b in stream)
    params = {"blobs": [[b.name, b.size, b.sha256] for b in stream], "layers": layers.manifest(),
              "config": layers.config.decode(), "tag": layers.image.tag, "stall": stall, "load_limit": LOAD_LIMIT_S}
    by_name = {h.name: h for h in hops}
    list(pool.map(lambda h: _start(h, params, head=h is hops[0], stall=stall), hops))
    for h in hops:
        if h.state == "failed":
            reason = h.reason
            h.state = "skipped"
            route_around(h, reason)
    live = [h for h in hops if h.state == "listening"]
    if hops[0] not in live:
        for h in live:
            h.end("upstream", f"the chain's first host, {hops[0].name}, did not start")
            h.talk.close()
        live = []
    else:
        for i, h in enumerate(live):
            route = [[n.name, n.node.address, n.port, n.token] for n in live[i + 1:]]
            peers = [n.node.address for n in live[:i]]  # any of them may connect: each goes on past hosts it cannot reach
            try:
                h.talk.send(relay.message({"token": None if h is hops[0] else h.token, "peers": peers, "next": route}))
            except OSError as e:
                h.end("failed", f"kit could not talk to its relay ({e})")
    readers = [pool.submit(_follow, h, by_name, total, progress, stall, route_around) for h in live]
    sent, broke = _feed(hops[0], stream, progress) if hops[0].state == "listening" else (0, None)
    for r in readers:
        r.result()
    if broke is not None and hops[0].state != "done":
        hops[0].reason += f" (kit's stream to it broke: {broke})"
    return sent


def _start(hop: Hop, params: dict, head: bool, stall: float) -> None:
    try:
        hop.talk = hop.node.runner.converse(RELAY_COMMAND, silence=stall + START_S)
        hop.talk.send(relay.message({**params, "listen": not head, "bind": hop.node.address}))
    except KitError as e:
        hop.end("failed", e.message)
        return
    except Exception as e:  # noqa: BLE001 - whatever breaks on one host is that host's failure
        hop.end("failed", f"kit could not start its relay ({e})")
        return
    if head:
        hop.state = "listening"  # it reads from here, not from a port
        return
    try:
        first = next(iter(hop.talk.lines()), "")
    except TimeoutError:
        first = ""
    words = first.split()
    if len(words) == 2 and words[0] == "LISTEN" and is_number(words[1]):
        hop.port, hop.state = int(words[1]), "listening"
        return
    hop.talk.close()
    r = hop.talk.result()
    said = (r.stderr.strip() or first).splitlines()
    hop.end("failed", f"its relay did not start ({said[-1] if said else f'exit {r.exit_code}'})",
            _tail(r.stderr or first))


def _feed(head: Hop, stream: tuple[Blob, ...], progress: Progress) -> tuple[int, str | None]:
    """The layers into the head's relay: the bytes sent, and why the stream broke (the head's own end says more)."""
    sent = 0
    progress.status(head.name, "receiving the image")
    try:
        for blob in stream:
            for part in chunks(blob.path):
                head.talk.send(part)
                sent += len(part)
        head.talk.end_input()
    except (OSError, EOFError) as e:
        return sent, str(e) or type(e).__name__
    return sent, None


def _follow(hop: Hop, by_name: dict[str, Hop], total: int, progress: Progress, stall: float,
            route_around: Callable[[Hop, str], None]) -> None:
    """Read one relay's lines until it ends: progress, hops it skipped or lost, its outcome."""
    progress.status(hop.name, "receiving the image")
    said_done = False
    try:
        for line in hop.talk.lines():
            word, _, rest = line.partition(" ")
            if word == "P":
                received, forwarded = (int(x) for x in rest.split()[:2])
                hop.received, hop.forwarded = received, forwarded
                progress.transfer(hop.name, received, total)
                if received == total:
                    progress.status(hop.name, "loading the image")
            elif word == "SKIP":
                name, _, why = rest.partition(" ")
                skipped = by_name.get(name)
                # not when it had ended already (gave up waiting, failed): the round's end handles it
                if skipped is not None and skipped.end("skipped"):
                    route_around(skipped, f"not reached from {hop.name} ({why})")
            elif word == "LOST":
                name, _, why = rest.partition(" ")
                if name in by_name:
                    by_name[name].end("upstream", f"{hop.name} lost it mid-way ({why})")
            elif word == "DONE":
                received, forwarded = (int(x) for x in rest.split()[:2])
                hop.received, hop.forwarded, said_done = received, forwarded, True
    except TimeoutError:
        hop.talk.close()
        hop.end("failed", f"no word from its relay for {stall + START_S:g} s (its link, or the host, is down)")
        return
    except Exception as e:  # noqa: BLE001 - the SSH connection broke, or worse: this host's failure
        hop.end("failed", f"the SSH connection to it broke ({e})")
        return
    r = hop.talk.result()
    if r.exit_code == 0 and said_done:
        hop.end("done")
    elif r.exit_code == relay.UPSTREAM:
        hop.end("upstream", _tail(r.stderr).splitlines()[-1] if r.stderr.strip() else "cut off", _tail(r.stderr))
    else:
        said = r.stderr.strip().splitlines()
        hop.end("failed", f"its relay failed (exit {r.exit_code}){': ' + said[-1] if said else ''}", _tail(r.stderr))


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-TAIL_LINES:])
