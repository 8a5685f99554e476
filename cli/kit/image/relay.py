"""kit's image relay: `kit up` runs it on each host that lacks layers of the image (`python3 -c`, as root).

It receives the missing layers, gzip'd, one after the other (from kit over SSH on
stdin, or from the host before it in the chain over TCP), hands them to `docker
load` inside a tar made on the fly, and passes every chunk on to the next host
while it arrives, so kit's own link carries each byte once.

Trust: all it is told comes from kit over SSH, on stdin (never on a command line,
which every user of the host can read and which Linux caps at 128 KiB): first the
layers' sizes and sha256 and the image's config (whose sha256 is the image ID),
then this host's one-time token, the addresses of the hosts before it in the chain
(any of them may be the one that connects: a host that cannot reach the next one
goes on to the one after it) and the next hops' addresses and tokens. A connection
from any other address is closed at once, unread; a peer must present this host's
token within a few seconds before it is read (strangers are checked side by side,
so they cannot hold the port). Each host sends from the address kit reaches it at,
so that its peer knows it by that one; each layer is checked
against its sha256 here, and Docker checks each layer's content against the
config. A transfer that fails or is stopped kills `docker load` before the tar
ends, so Docker keeps nothing of it.

Standalone on purpose: the standard library of Python 3.6 or later, nothing of kit.
Reads kit's two messages on stdin, each its length in a line and then that much JSON
(the head's layers follow the second). Talks to kit in lines on stdout:
    LISTEN port           listening for the host before it (not for the chain's head)
    NEXT name             forwarding to that host
    SKIP name reason      that host could not be reached: the next one is tried
    LOST name reason      the next host stopped taking bytes: the rest of the chain is cut off
    P received forwarded  progress, twice a second
    DONE received forwarded
Exit 0: loaded. Exit 3: the bytes did not arrive whole (the upstream's fault: worth another try). Exit 1: this
host failed (docker load refused, or kit went away).
"""

import hashlib
import hmac
import ipaddress
import json
import os
import select
import socket
import subprocess
import sys
import tarfile
import threading
import time

CHUNK = 1 << 20
UPSTREAM = 3
CONNECT_S = 3   # to the next host: on a LAN it answers at once; a firewall that drops costs this much a hop
TOKEN_S = 5     # for a peer to give the token once connected
PENDING = 64    # connections waiting to give it, at most (select takes up to 1024)


class Failed(Exception):
    def __init__(self, message, code=1):
        Exception.__init__(self, message)
        self.code = code


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def tar_header(name, size):
    """A plain ustar header; a layer of 8 GiB or more (a CUDA image's can be) gets a pax record for its size."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(format=tarfile.PAX_FORMAT)


def tar_member(name, data):
    return tar_header(name, len(data)) + data + padding(len(data))


def padding(size):
    return b"\0" * (-size % 512)


def image_tail(config, tag, layers):
    """What ends the tar `docker load` reads, after the layers: the config, the manifest naming every layer (those
    the host holds are not in the tar: Docker finds them by their chain) and the end of the archive."""
    manifest = json.dumps([{"Config": "config.json", "RepoTags": [tag], "Layers": layers}]).encode()
    return tar_member("config.json", config) + tar_member("manifest.json", manifest) + b"\0" * 1024


class FromKit:
    """The chain's head reads the layers from kit on stdin."""

    def __init__(self, stall):
        self.stall = stall

    def recv(self, size):
        ready, _, _ = select.select([0], [], [], self.stall)
        if not ready:
            raise Failed("kit sent nothing for %d s" % self.stall, UPSTREAM)
        return os.read(0, size)


def same_address(text):
    """One spelling of an address: an IPv4 peer of an IPv6 listener reads ::ffff:a.b.c.d, a link-local one %eth0."""
    try:
        ip = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return text
    return str(getattr(ip, "ipv4_mapped", None) or ip)


class FromPeer:
    """Every other host reads them from the host before it: the first connection from one of `peers` (the addresses
    of the hosts before it) that gives this host's token; any other is closed at once, before a byte of it is read.
    Connections are read side by side, each for TOKEN_S at most, so strangers on the network cannot hold the port."""

    def __init__(self, listener, token, peers, stall):
        want = token.encode() + b"\n"
        peers = set(same_address(a) for a in peers)
        deadline = time.monotonic() + stall
        listener.setblocking(False)
        pending = {}  # a connection -> [what it sent so far, until when it may send the rest]
        conn = None
        try:
            while conn is None:
                now = time.monotonic()
                if now > deadline:
                    raise Failed("no host before this one connected within %d s" % stall, UPSTREAM)
                for c, (_, until) in list(pending.items()):
                    if now > until:
                        del pending[c]
                        c.close()
                wait = min([deadline] + [until for _, until in pending.values()]) - now
                ready, _, _ = select.select([listener] + list(pending), [], [], max(wait, 0.01))
                for r in ready:
                    if r is listener:
                        self._accept(listener, peers, pending)
                    elif r in pending and self._gave(r, want, pending):  # (not one dropped to make room)
                        conn = r
                        break
        finally:
            for c in pending:
                c.close()
            listener.close()
        conn.setblocking(True)
        conn.settimeout(stall)
        self.conn, self.stall = conn, stall

    @staticmethod
    def _gave(conn, want, pending):
        """Whether what conn sent now completes `want`. Once it sent a line, or as much, or ended, it leaves
        `pending`, and is closed unless it gave the token."""
        try:
            part = conn.recv(len(want) - len(pending[conn][0]))
        except (BlockingIOError, InterruptedError):  # not ready after all
            return False
        except OSError:
            part = b""
        got = pending[conn][0] = pending[conn][0] + part
        if part and len(got) < len(want) and not got.endswith(b"\n"):
            return False
        del pending[conn]
        if part and hmac.compare_digest(got, want):
            return True
        conn.close()  # not the host kit sent: ignored
        return False

    @staticmethod
    def _accept(listener, peers, pending):
        try:
            c, where = listener.accept()
        except OSError:  # gone before it was taken
            return
        if same_address(where[0]) not in peers:  # not a host kit named: not one byte of it is read
            c.close()
            return
        if len(pending) >= PENDING:  # the oldest stranger makes room
            oldest = next(iter(pending))
            del pending[oldest]
            oldest.close()
        c.setblocking(False)
        pending[c] = [b"", time.monotonic() + TOKEN_S]

    def recv(self, size):
        try:
            return self.conn.recv(size)
        except socket.timeout:
            raise Failed("the host before this one sent nothing for %d s" % self.stall, UPSTREAM)
        except OSError as e:
            raise Failed("the host before this one went away (%s)" % e, UPSTREAM)


class Next:
    """The host this one forwards to: the first of `route` that answers; the others are skipped, named. It is sent
    to from `source`, this host's address as kit knows it: the one the next host accepts (see FromPeer)."""

    def __init__(self, route, stall, source):
        self.conn, self.name, self.sent = None, None, 0
        for name, address, port, token in route:
            try:
                conn = socket.create_connection((address, port), timeout=CONNECT_S, source_address=(source, 0))
                conn.settimeout(stall)
                conn.sendall(token.encode() + b"\n")
            except OSError as e:
                say("SKIP", name, _reason(e))
                continue
            self.conn, self.name = conn, name
            say("NEXT", name)
            return

    def send(self, data):
        if self.conn is None:
            return
        try:
            self.conn.sendall(data)
            self.sent += len(data)
        except OSError as e:
            say("LOST", self.name, _reason(e))
            self.close()

    def close(self):
        if self.conn is not None:
            try:
                self.conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self.conn.close()
            self.conn = None


def _reason(e):
    if isinstance(e, socket.timeout):
        return "timed out"
    return (getattr(e, "strerror", None) or str(e) or type(e).__name__).replace("\n", " ")


class Docker:
    """`docker load` fed with a tar made as the layers arrive; its output kept for the error message. A write that
    Docker does not take within `stall` kills it, so the relay never waits on it for ever. Once it failed, what
    follows is not written but the failure kept (the relay still passes the layers on), and raised by finish."""

    def __init__(self, stall):
        self.proc = subprocess.Popen(["docker", "load"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, bufsize=0)  # every write under the watchdog
        self.output, self.writing, self.stall, self.stuck, self.failed = [], None, stall, False, None
        reader = threading.Thread(target=lambda: self.output.append(self.proc.stdout.read()))
        reader.daemon = True
        reader.start()
        self.reader = reader
        watchdog = threading.Thread(target=self._watch)
        watchdog.daemon = True
        watchdog.start()

    def _watch(self):
        while self.proc.poll() is None:
            since = self.writing
            if since is not None and time.monotonic() - since > self.stall:
                self.stuck = True
                self.kill()
            time.sleep(1)

    def write(self, data):
        if self.failed is not None:
            return
        self.writing = time.monotonic()
        try:
            view = memoryview(data)
            while view:
                view = view[self.proc.stdin.write(view):]
        except OSError:
            self.failed = Failed("docker load took nothing for %d s" % self.stall if self.stuck else
                                 "docker load stopped reading: " + self.said())
            self.kill()
        finally:
            self.writing = None

    def said(self):
        self.reader.join(5)
        text = b"".join(self.output).decode("utf-8", "replace").strip()
        return "\n".join(text.splitlines()[-15:]) or "(no output)"

    def finish(self, limit, heartbeat):
        if self.failed is not None:
            raise self.failed
        self.proc.stdin.close()
        deadline = time.monotonic() + limit
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise Failed("docker load did not finish within %d s" % limit)
            heartbeat()
            time.sleep(0.5)
        if self.proc.returncode != 0:
            raise Failed("docker load failed (exit %d): %s" % (self.proc.returncode, self.said()))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def watch_kit(abort):
    """A host that is not the head hears nothing more from kit on stdin: its end means kit stopped this transfer."""
    def watch():
        while os.read(0, 4096):
            pass
        abort("kit stopped the transfer")
    thread = threading.Thread(target=watch)
    thread.daemon = True
    thread.start()


def message(value):
    """One message to the relay on its stdin: its length in a line, then the JSON."""
    body = json.dumps(value).encode()
    return b"%d\n" % len(body) + body


def read_message():
    """Exactly one message from stdin, not a byte more: the head's layers follow the second."""
    def read(n):
        data = b""
        while len(data) < n:
            part = os.read(0, n - len(data))
            if not part:
                raise Failed("kit went away before the transfer started")
            data += part
        return data
    line = b""
    while not line.endswith(b"\n") and len(line) < 20:
        line += read(1)
    return json.loads(read(int(line)).decode())


def main():
    p = read_message()
    stall = p["stall"]
    listener = None
    if p["listen"]:
        family = socket.AF_INET6 if ":" in p["bind"] else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.bind((p["bind"], 0))
        listener.listen(PENDING)
        say("LISTEN", listener.getsockname()[1])
    told = read_message()
    docker = Docker(stall)

    def abort(why):
        docker.kill()
        sys.stderr.write(why + "\n")
        sys.stderr.flush()
        os._exit(1)
    if listener is not None:
        watch_kit(abort)
    try:
        upstream = FromPeer(listener, told["token"], told["peers"], stall) if listener is not None else FromKit(stall)
        forward = Next(told["next"], stall, p["bind"])
        received, last = 0, 0.0
        total = sum(size for _, size, _ in p["blobs"])
        for name, size, sha256 in p["blobs"]:
            docker.write(tar_header(name, size))
            digest, left = hashlib.sha256(), size
            while left:
                data = upstream.recv(min(CHUNK, left))
                if not data:
                    raise Failed("the stream ended at byte %d of %d" % (received, total), UPSTREAM)
                forward.send(data)
                digest.update(data)
                docker.write(data)
                left -= len(data)
                received += len(data)
                if time.monotonic() - last > 0.5:
                    say("P", received, forward.sent)
                    last = time.monotonic()
            if digest.hexdigest() != sha256:
                raise Failed("layer %s arrived damaged (sha256 differs)" % name, UPSTREAM)
            docker.write(padding(size))
        forward.close()  # the next host has every byte, whatever becomes of this one's load
        say("P", received, forward.sent)
        docker.write(image_tail(p["config"].encode(), p["tag"], p["layers"]))
        docker.finish(p["load_limit"], lambda: say("P", received, forward.sent))
        say("DONE", received, forward.sent)
    except BaseException:
        docker.kill()  # before the manifest is written Docker keeps nothing; killed, it stops at once
        raise


if __name__ == "__main__":
    try:
        main()
    except Failed as e:
        sys.stderr.write(str(e) + "\n")
        sys.exit(e.code)
