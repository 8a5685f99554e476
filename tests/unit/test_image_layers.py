"""The image's layers on their way to the hosts: which a host lacks, and kit's relay (kit/relay.py) run for real
as two hops of a chain on this machine, over TCP on loopback, with `docker` a recorder of what it would load."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from helpers import closed_port

from kit.image import relay
from kit.errors import KitError
from kit.config.hosts import Host
from kit.cluster.place import Place
from kit.runners.local import LocalRunner
from kit.cluster.steps.distribute import RELAY_SCRIPT, Sent, distribute
from kit.cluster.steps.facts import HostFacts, parse_facts
from kit.cluster.steps.image import Blob, Layers, LocalImage, present
from kit.cluster.steps.node import Node

A, B, C, D = (f"sha256:{c * 64}" for c in "abcd")


def test_a_host_holds_the_longest_start_of_the_images_chain_that_one_of_its_images_shares():
    image = (A, B, C)
    assert present(image, ()) == 0
    assert present(image, ((A, B, D),)) == 2            # the old image: all but the top layer
    assert present(image, ((A,), (A, B, C, D))) == 3    # a child of the image holds it whole
    assert present(image, ((B, C),)) == 0               # the same layer on another base is another layer


def test_the_facts_read_each_images_layers_and_python3():
    text = ("@@kit layers\n" + json.dumps([A, B]) + "\n" + json.dumps([A, C]) + "\nnot json\n"
            "@@kit python3\n/usr/bin/python3\n@@kit end\n")
    f = parse_facts(0, text)
    assert f.layer_chains == ((A, B), (A, C)) and f.python3
    assert not parse_facts(0, "@@kit python3\n@@kit end\n").python3


def test_the_summary_says_what_left_this_machine_and_what_went_between_hosts():
    s = Sent(8, 2, 14, 120_000_000, 2_100_000_000, 121_000_000, 847_000_000, 31.5, 12.25,
             ("h3: not reached from h2 (timed out); routed around",))
    assert str(s).splitlines() == [
        "sent 2 of the image's 14 layers (120.0 MB compressed; the image is 2.10 GB) to 8 hosts in 31.5 s (every "
        "byte was there after 12.2 s): "
        "121.0 MB left this machine, 847.0 MB went from host to host",
        "h3: not reached from h2 (timed out); routed around"]


# ---------------------------------------------------------------- the relay, for real

def _blob(data: bytes, name: str) -> tuple[bytes, list]:
    packed = gzip.compress(data, 1)
    return packed, [name, len(packed), hashlib.sha256(packed).hexdigest()]


@pytest.fixture
def recorder(tmp_path) -> dict:
    """`docker` on PATH that keeps what `docker load` would read, one file per host folder; KIT_TEST_REFUSE: it
    fails saying that; KIT_TEST_HANG=midway|after: it hangs after 100 kB, or once it read every byte."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text('#!/bin/sh\n[ "$1" = load ] || exit 2\nout="${KIT_TEST_LOADED:-$KIT_TEST_DIR/$$.tar}"\n'
                                    '[ -z "$KIT_TEST_REFUSE" ] || { head -c 1000 >/dev/null; echo "$KIT_TEST_REFUSE" >&2;'
                                    ' exit 1; }\n'
                                    'echo $$ > "$out.pid-new" && mv "$out.pid-new" "$out.pid"\n'  # (whole)
                                    'hang() { exec sleep 120; }\n'
                                    '[ "$KIT_TEST_HANG" != midway ] || { head -c 100000 > "$out"; hang; }\n'
                                    'cat > "$out" || exit 1\n'
                                    '[ "$KIT_TEST_HANG" != after ] || hang\n'
                                    'echo "input ended" > "$out.end"\n')
    (bin_dir / "docker").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _relay(env: dict, loaded: Path, listen: bool, blobs: list, stall: float = 10, refuse: str = "") -> subprocess.Popen:
    """refuse: what its `docker load` says when it stops after 1000 bytes and fails (a full disk), if anything."""
    params = {"listen": listen, "bind": "127.0.0.1", "blobs": blobs, "layers": [b[0] for b in blobs],
              "config": '{"architecture": "amd64"}', "tag": "kit-test:1", "stall": stall, "load_limit": 30}
    env = {**env, "KIT_TEST_LOADED": str(loaded), "KIT_TEST_REFUSE": refuse}
    proc = subprocess.Popen([sys.executable, "-c", RELAY_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdin.write(relay.message(params))  # as kit does: on stdin, not the command line
    proc.stdin.flush()
    return proc


def _told(token: str | None, route: list) -> bytes:
    return relay.message({"token": token, "peers": ["127.0.0.1"], "next": route})


def _loaded(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}



def test_the_chains_head_loads_the_layers_and_passes_every_byte_on(tmp_path, recorder):
    one, two = _blob(b"layer one" * 1000, "one.tar.gz"), _blob(os.urandom(3 << 20), "two.tar.gz")
    blobs = [one[1], two[1]]
    second = _relay(recorder, tmp_path / "second.tar", True, blobs)
    port = int(second.stdout.readline().split()[1])
    second.stdin.write(_told("t" * 32, []))
    second.stdin.flush()
    # strangers are ignored: one with a wrong token, one that says nothing (for its few seconds); the chain goes on
    with socket.create_connection(("127.0.0.1", port)) as wrong, socket.create_connection(("127.0.0.1", port)):
        wrong.sendall(b"x" * 32 + b"\n")
        head = _relay(recorder, tmp_path / "head.tar", False, blobs)
        route = [["nobody", "127.0.0.1", closed_port(), "u" * 32], ["second", "127.0.0.1", port, "t" * 32]]
        told = _told(None, route)
        out, err = head.communicate(told + one[0] + two[0], timeout=60)
    lines = out.decode().splitlines()
    assert head.returncode == 0, err.decode()
    assert lines[0].startswith("SKIP nobody ") and lines[1] == "NEXT second", lines
    total = len(one[0]) + len(two[0])
    assert lines[-1] == f"DONE {total} {total}"
    assert second.wait(timeout=60) == 0, second.stderr.read().decode()  # its input open: kit is still there
    second.stdin.close()
    assert second.stdout.read().decode().splitlines()[-1] == f"DONE {total} 0"
    for path in (tmp_path / "head.tar", tmp_path / "second.tar"):
        files = _loaded(path)
        assert files["one.tar.gz"] == one[0] and files["two.tar.gz"] == two[0]
        assert json.loads(files["manifest.json"]) == [{"Config": "config.json", "RepoTags": ["kit-test:1"],
                                                      "Layers": ["one.tar.gz", "two.tar.gz"]}]
        assert files["config.json"] == b'{"architecture": "amd64"}'


def test_strangers_on_the_network_cannot_hold_a_relays_port(tmp_path, recorder):
    """Twenty connections that never give a token, made before the host before it connects: each may take its few
    seconds, but side by side, not one after the other (that took 20 x 5 s, far past the relay's wait)."""
    blob = _blob(os.urandom(1 << 20), "one.tar.gz")
    second = _relay(recorder, tmp_path / "second.tar", True, [blob[1]], stall=8)
    port = int(second.stdout.readline().split()[1])
    second.stdin.write(_told("t" * 32, []))
    second.stdin.flush()
    strangers = []
    try:
        for _ in range(20):
            strangers.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        strangers[0].sendall(b"t" * 31)  # one that starts like the token and stops
        head = _relay(recorder, tmp_path / "head.tar", False, [blob[1]])
        out, err = head.communicate(_told(None, [["second", "127.0.0.1", port, "t" * 32]]) + blob[0], timeout=60)
        assert head.returncode == 0, err.decode()
        assert second.wait(timeout=60) == 0, second.stderr.read().decode()
    finally:
        for c in strangers:
            c.close()
        second.kill()
    assert _loaded(tmp_path / "second.tar")["one.tar.gz"] == blob[0]


def test_a_relay_full_of_strangers_makes_room_and_still_finds_its_peer(monkeypatch):
    """Connections past PENDING push out the oldest, also one that has just sent a byte (it was read after it had
    gone, and the relay died on it); the host before it, last in the queue, is found."""
    monkeypatch.setattr(relay, "PENDING", 2)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = listener.getsockname()
        first = socket.create_connection(address)
        first.sendall(b"x")
        first.shutdown(socket.SHUT_WR)  # and readable again: its end
        strangers = [first] + [socket.create_connection(address) for _ in range(3)]
        peer = socket.create_connection(address)
        peer.sendall(b"t" * 32 + b"\n" + b"layers")
        try:
            upstream = relay.FromPeer(listener, "t" * 32, ["127.0.0.1"], 10)
            assert upstream.recv(6) == b"layers"
            upstream.conn.close()
        finally:
            for c in strangers + [peer]:
                c.close()


def test_a_host_whose_docker_load_fails_still_passes_every_byte_on_and_says_why(tmp_path, recorder):
    """A full disk on one host of the chain costs that host, not the hosts behind it."""
    blob = _blob(os.urandom(3 << 20), "one.tar.gz")
    second = _relay(recorder, tmp_path / "second.tar", True, [blob[1]])
    port = int(second.stdout.readline().split()[1])
    second.stdin.write(_told("t" * 32, []))
    second.stdin.flush()
    full = "write /var/lib/docker/tmp/docker-import-1/one.tar.gz: no space left on device"
    head = _relay(recorder, tmp_path / "head.tar", False, [blob[1]], refuse=full)
    told = _told(None, [["second", "127.0.0.1", port, "t" * 32]])
    out, err = head.communicate(told + blob[0], timeout=60)
    assert head.returncode == 1 and err.decode().strip().splitlines()[-1].endswith(full), err.decode()
    assert out.decode().splitlines()[-1] == f"P {len(blob[0])} {len(blob[0])}"  # all of it passed on; no DONE
    assert second.wait(timeout=60) == 0, second.stderr.read().decode()
    second.stdin.close()
    assert _loaded(tmp_path / "second.tar")["one.tar.gz"] == blob[0]


def test_a_layer_damaged_on_the_way_is_never_given_whole_to_docker(tmp_path, recorder):
    good = _blob(b"the layer" * 1000, "one.tar.gz")
    damaged = bytearray(good[0])
    damaged[len(damaged) // 2] ^= 0xFF
    head = _relay(recorder, tmp_path / "head.tar", False, [good[1]])
    _, err = head.communicate(_told(None, []) + bytes(damaged), timeout=60)
    assert head.returncode == relay.UPSTREAM and b"arrived damaged" in err
    loaded = tmp_path / "head.tar"  # docker load was killed: its input never ended as a tar does
    assert not (tmp_path / "head.tar.end").exists()
    assert not loaded.exists() or b"manifest.json" not in loaded.read_bytes()


def test_a_stream_cut_short_and_a_silent_upstream_end_the_relay_with_the_reason(tmp_path, recorder):
    blob = _blob(os.urandom(1 << 20), "one.tar.gz")
    head = _relay(recorder, tmp_path / "head.tar", False, [blob[1]])
    _, err = head.communicate(_told(None, []) + blob[0][:1000], timeout=60)
    assert head.returncode == relay.UPSTREAM and b"ended at byte 1000 of" in err
    assert not (tmp_path / "head.tar.end").exists()
    waiting = _relay(recorder, tmp_path / "w.tar", True, [blob[1]], stall=1)
    waiting.stdout.readline()
    waiting.stdin.write(_told("t" * 32, []))
    waiting.stdin.flush()
    assert waiting.wait(timeout=30) == relay.UPSTREAM
    assert b"no host before this one connected within 1 s" in waiting.stderr.read()


@pytest.fixture
def local_hosts(tmp_path, recorder, monkeypatch):
    """distribute() on this machine: hosts are LocalRunners, their relays talk over loopback, `docker` records."""
    monkeypatch.setenv("PATH", recorder["PATH"])
    monkeypatch.setenv("KIT_TEST_DIR", str(tmp_path))
    monkeypatch.delenv("KIT_TEST_LOADED", raising=False)

    def nodes(count: int, python3: bool = True, elsewhere: int = -1) -> list[Node]:
        """`elsewhere`: the host whose address is not this machine's, so its relay cannot listen."""
        return [Node(Host(f"h{i}"), LocalRunner(f"h{i}"), Place("c", str(tmp_path)),
                     address="192.0.2.1" if i == elsewhere else "127.0.0.1",
                     facts=HostFacts(0, "20.10", python3=python3)) for i in range(count)]
    return nodes


def _layers(folder: Path, config: bytes, *contents: bytes) -> Layers:
    blobs = []
    for n, data in enumerate(contents):
        path = folder / f"{n}.tar.gz"
        path.write_bytes(gzip.compress(data, 1))
        blobs.append(Blob(f"sha256:{n}" * 8, path, path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()))
    image = LocalImage("kit-test:1", "sha256:" + "f" * 64, 10 << 20, None, tuple(b.diff_id for b in blobs))
    return Layers(image, image.diff_ids, config, tuple(blobs), 0)


class Seen:
    """The progress kit shows; `then(host, done, total)` runs on each report."""

    def __init__(self, then=lambda host, done, total: None):
        self.done: dict[str, int] = {}
        self.then = then

    def status(self, host, text):
        pass

    def transfer(self, host, done, total):
        self.done[host] = max(done, self.done.get(host, 0))
        self.then(host, done, total)


def test_a_chain_of_relays_gives_every_host_the_layers_once_from_here_and_routes_around_one_that_cannot_listen(
        tmp_path, local_hosts):
    """Four hosts: the chain's bytes leave here once; a host whose relay cannot listen (its address is not this
    machine's) is named and sent its layers from here; every host's `docker load` reads the same whole tar."""
    config = json.dumps({"history": [{"created_by": "RUN pip install " + "x" * 200}] * 1000}).encode()
    layers = _layers(tmp_path, config, b"base" * 100_000, os.urandom(2 << 20))  # config: past one argument's limit
    blobs = layers.blobs
    seen = Seen()
    sent = distribute(local_hosts(4, elsewhere=2), layers, {f"h{i}": 0 for i in range(4)}, seen, stall=10)
    stream = sum(b.size for b in blobs)
    assert sent.routes == ("h2: its relay did not start (OSError: [Errno 99] Cannot assign requested address); "
                           "routed around it and sent its layers from here",)
    # the chain's head, and h2 (as a tar: headers, config, manifest)
    assert 0 <= sent.from_here - 2 * stream - len(config) < 8192
    assert sent.between_hosts == 2 * stream  # h0 -> h1 -> h3
    assert seen.done == {f"h{i}": stream for i in range(4)}
    assert 0 < sent.arrived <= sent.seconds
    loads = sorted(tmp_path.glob("*.tar"))
    assert len(loads) == 4 and all(Path(f"{p}.end").exists() for p in loads)
    for path in loads:
        files = _loaded(path)
        assert [files[b.name] for b in blobs] == [b.path.read_bytes() for b in blobs]
        assert files["config.json"] == config


class Scripted:
    """A host whose relays say what a script says (one script for each relay kit starts there): the bookkeeping of
    the chain's rounds, with no timing in the way. What kit sends them is taken and dropped. A script's line
    "(its input ends)" waits for kit to end the relay's input; "(set X)" and "(wait X)" order two relays' words."""

    events: dict[str, threading.Event] = {}

    def __init__(self, host: str, *scripts: tuple[list[str], int, str]):
        self.host, self.sudo, self.scripts = host, False, list(scripts)

    def converse(self, command: str, silence: float) -> "Scripted.Talk":
        return Scripted.Talk(self.host, *self.scripts.pop(0))

    def close(self) -> None:
        pass

    class Talk:
        def __init__(self, host: str, lines: list[str], code: int, stderr: str):
            self.host, self.said, self.code, self.stderr = host, iter(lines), code, stderr
            self.ended = threading.Event()

        def send(self, data: bytes) -> None:
            pass

        def end_input(self) -> None:
            self.ended.set()

        def lines(self):
            for line in self.said:
                word, _, name = line.strip("()").partition(" ")
                if line == "(its input ends)":
                    assert self.ended.wait(10)
                elif line.startswith("(") and word in ("set", "wait"):
                    event = Scripted.events.setdefault(name, threading.Event())
                    if word == "set":
                        event.set()
                    else:
                        assert event.wait(10)
                else:
                    yield line

        def result(self):
            from kit.runners.base import Result
            return Result(self.host, "relay", self.code, "", self.stderr)

        def close(self) -> None:
            pass


def test_hosts_cut_off_mid_way_are_served_again_and_named_in_the_summary(tmp_path):
    """h0 loses h1 mid-way (a reset link), which cuts off h2 behind it: both are served in a second round, and the
    summary says so, with why."""
    layers = _layers(tmp_path, b"{}", b"x" * 10)
    total = layers.blobs[0].size
    Scripted.events.clear()
    h0 = Scripted("h0", (["NEXT h1", "LOST h1 Connection reset by peer", "(set lost)", "(its input ends)",
                          f"DONE {total} 5"], 0, ""))
    # h1's relay ends after h0 said it lost h1 (h1's own end would name the other side of it)
    h1 = Scripted("h1", (["LISTEN 1", "P 5 5", "(wait lost)"], relay.UPSTREAM,
                         "the host before this one went away (reset)"),
                  (["(its input ends)", f"DONE {total} {total}"], 0, ""))
    h2 = Scripted("h2", (["LISTEN 2", "P 5 0"], relay.UPSTREAM, "the stream ended at byte 5 of 10"),
                  (["LISTEN 3", f"DONE {total} 0"], 0, ""))
    nodes = [Node(Host(r.host), r, Place("c", str(tmp_path)), address="127.0.0.1",
                  facts=HostFacts(0, "20.10", python3=True)) for r in (h0, h1, h2)]
    sent = distribute(nodes, layers, {n.name: 0 for n in nodes}, Seen(), stall=10)
    assert sent.routes == ("h1: cut off (h0 lost it mid-way (Connection reset by peer)); sent its layers again",
                           "h2: cut off (the stream ended at byte 5 of 10); sent its layers again")
    assert sent.from_here == 2 * total and sent.between_hosts == 5 + 5 + total  # h0 -> h1 -> h2, then h1 -> h2
    assert "h2: cut off (the stream ended at byte 5 of 10); sent its layers again" in str(sent).splitlines()


def _interrupted(nodes: list[Node], layers: Layers, when) -> float:
    """distribute(), and Ctrl-C (a real SIGINT) the first time when(done, total) holds; how long it took to stop.
    Every `docker load` hangs (KIT_TEST_HANG), as one that is applying a large image, or a stuck disk."""
    interrupted = threading.Event()

    def then(host, done, total):
        if when(done, total) and not interrupted.is_set():
            interrupted.set()
            os.kill(os.getpid(), signal.SIGINT)
    # Ctrl-C as in a terminal, where Python turns it into KeyboardInterrupt: whatever started the tests (a shell's
    # background job ignores SIGINT, and so then does this process) does not decide it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    began = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            distribute(nodes, layers, {n.name: 0 for n in nodes}, Seen(then), stall=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted.is_set()
    return time.monotonic() - began


def _hung_loads_end(folder: Path) -> None:
    """Every `docker load` was killed, and none read a whole image."""
    pids = [int(p.read_text()) for p in folder.glob("*.pid")]
    assert pids
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)
    assert not list(folder.glob("*.end"))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_closed_local_runner_ends_what_it_feeds_and_starts_nothing_more(tmp_path):
    """As a closed SSH runner: Ctrl-C's close() ends a local host's relay or load, and a thread that was about to
    start one gets an error instead."""
    runner = LocalRunner("h0")
    talk = runner.converse(f"echo started; sleep 120; touch {tmp_path / 'ran'}", silence=30)
    assert next(talk.lines()) == "started"
    runner.close()
    assert talk.result().exit_code == -signal.SIGKILL
    for start in (lambda: runner.run("true"), lambda: runner.converse("cat", silence=5),
                  lambda: runner.stream_in("cat", iter([b"x"]), lambda n: None)):
        with pytest.raises(KitError, match="kit had closed its connection"):
            start()
    assert not (tmp_path / "ran").exists()


def test_ctrl_c_while_the_chain_streams_stops_every_relay_at_once(tmp_path, local_hosts, monkeypatch):
    """Not after the relays' 75 s of silence: each host's connection closes (here: its commands are killed, the
    relays and their `docker load`), so kit's readers of the relays end at once."""
    monkeypatch.setenv("KIT_TEST_HANG", "midway")  # docker load takes no more: the chain stalls mid-way
    layers = _layers(tmp_path, b"{}", os.urandom(4 << 20))
    took = _interrupted(local_hosts(3), layers, lambda done, total: 0 < done < total)
    assert took < 40, f"Ctrl-C took {took:.0f} s to stop the image step"
    _hung_loads_end(tmp_path)


def test_ctrl_c_while_a_host_loads_what_it_was_sent_directly_stops_at_once(tmp_path, local_hosts, monkeypatch):
    """A host without python3 is sent its layers from here; once they are all there, kit waits for `docker load`
    (up to 30 min): Ctrl-C then ends that wait and the load, not after it."""
    monkeypatch.setenv("KIT_TEST_HANG", "after")
    layers = _layers(tmp_path, b"{}", os.urandom(1 << 20))
    took = _interrupted(local_hosts(2, python3=False), layers, lambda done, total: done == total)
    assert took < 40, f"Ctrl-C took {took:.0f} s to stop the image step"
    _hung_loads_end(tmp_path)


def test_the_relays_tar_is_what_tarfile_reads():
    data = b"x" * 1000
    raw = relay.tar_header("a.tar.gz", len(data)) + data + relay.padding(len(data)) + relay.image_tail(
        b"{}", "t:1", ["a.tar.gz"])
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        assert [m.name for m in tar] == ["a.tar.gz", "config.json", "manifest.json"]


def test_a_layer_of_8_gib_or_more_gets_a_header_that_says_its_size():
    """ustar's size field ends below 8 GiB; a CUDA image's torch layer can pass it (a pax record carries it)."""
    name, size = "b" * 64 + ".tar.gz", (9 << 30) + 5
    with tarfile.open(fileobj=io.BytesIO(relay.tar_header(name, size)), mode="r|") as tar:
        member = tar.next()
    assert (member.name, member.size) == (name, size)
    plain = tarfile.TarInfo(name)
    plain.size, plain.mode, plain.mtime = 1000, 0o644, 0
    assert relay.tar_header(name, 1000) == plain.tobuf(format=tarfile.USTAR_FORMAT)  # below that: as it always was


# ---------------------------------------------------------------- the extras' delta (images/venv_delta.py)

def _tree(root: Path) -> dict[str, object]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = ("link", os.readlink(path)) if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out


def test_the_extras_delta_laid_over_the_old_venv_gives_the_venv_they_made(tmp_path):
    """What the final image does: remove what the list names from torch's venv, then copy the delta over it."""
    import shutil

    script = Path(__file__).parents[2] / "images" / "venv_delta.py"
    venv = tmp_path / "venv"
    for rel, data in {"bin/python": b"py", "lib/site/numpy/core.py": b"np 2", "lib/site/numpy-2.0.dist-info/RECORD": b"r",
                      "lib/site/torch/__init__.py": b"torch", "lib/site/pkg/a.py": b"a", "lib/site/real/a.py": b"b"}.items():
        (venv / rel).parent.mkdir(parents=True, exist_ok=True)
        (venv / rel).write_bytes(data)
    old = tmp_path / "old"
    shutil.copytree(venv, old, symlinks=True)
    subprocess.run([sys.executable, script, "snapshot", venv, tmp_path / "before.json"], check=True)
    # a pip install that adds a package and a script link, swaps numpy 2.0 for 1.26 (files changed and removed), and
    # turns a folder into a link
    (venv / "lib/site/tqdm").mkdir()
    (venv / "lib/site/tqdm/__init__.py").write_bytes(b"tqdm")
    (venv / "bin/tqdm").symlink_to("../lib/site/tqdm/__init__.py")
    (venv / "lib/site/numpy/core.py").write_bytes(b"np 1.26!")
    shutil.rmtree(venv / "lib/site/numpy-2.0.dist-info")
    (venv / "lib/site/numpy-1.26.dist-info").mkdir()
    (venv / "lib/site/numpy-1.26.dist-info/RECORD").write_bytes(b"r2")
    shutil.rmtree(venv / "lib/site/pkg")
    (venv / "lib/site/pkg").symlink_to("real")
    delta, removed = tmp_path / "delta", tmp_path / "removed"
    subprocess.run([sys.executable, script, "delta", venv, tmp_path / "before.json", delta, removed], check=True,
                   capture_output=True)
    assert "torch" not in {p.name for p in delta.rglob("*")}  # what did not change stays in the layer below
    assert removed.read_text().splitlines() == ["lib/site/numpy-2.0.dist-info", "lib/site/pkg"]  # topmost only
    for rel in removed.read_text().splitlines():  # as `xargs rm -rf` does
        target = old / rel
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    shutil.copytree(delta, old, symlinks=True, dirs_exist_ok=True)
    assert _tree(old) == _tree(venv)
