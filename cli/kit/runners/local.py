"""Run commands on this machine, as SshRunner runs them on a host: the runner of the local cluster.

Each command runs in its own session, so the terminal's Ctrl-C reaches kit and
not the command: kit then stops the job itself, as it does on remote hosts.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from typing import IO, Callable, Iterable, Iterator

from kit.errors import KitError
from kit.runners.base import CHUNK, LINE_KEPT, STALL_S, Head, Lines, Result, Tail, read_lines


def _session() -> dict:
    """Every command runs in its own session (out of the terminal's reach) and the C locale (what the parsers read)."""
    return {"start_new_session": True, "env": {**os.environ, "LC_ALL": "C"}}


class LocalRunner:
    def __init__(self, host: str) -> None:
        self.host = host
        self.sudo = False  # set by become_root when kit does not run as root
        self.feeding: list[subprocess.Popen] = []  # what stream_in and converse started: close() ends it
        self.closed = False  # by kit: as a closed SSH runner, it starts nothing more
        self.lock = threading.Lock()  # a command starts wholly before close(), or not at all

    def peer_address(self) -> str:
        return "127.0.0.1"

    def _argv(self, command: str) -> list[str]:
        if self.closed:
            raise KitError("kit had closed its connection to the host (it was stopped)", host=self.host)
        return ["sudo", "-n", "bash", "-c", command] if self.sudo else ["bash", "-c", command]

    def _popen(self, command: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self._argv(command), **_session(), **kwargs)

    def _fed(self, command: str, **kwargs) -> subprocess.Popen:
        """A command kit writes to: close() kills it (closing an SSH connection cuts such a command's input and
        output there)."""
        with self.lock:
            proc = self._popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
            self.feeding = [p for p in self.feeding if p.poll() is None] + [proc]
        return proc

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = 300,
            changes: bool = False) -> Result:
        """timeout: how long it may take in all, however it trickles output (None: as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        proc = self._popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = _kept(proc)
        threading.Thread(target=_write, args=(proc, stdin or b""), daemon=True).start()
        if not _ended(proc, out, err, deadline):
            return Result(self.host, command, 124, out.text(), f"timed out: it did not end within {timeout:g} s")
        return Result(self.host, command, proc.returncode, out.text(), err.text(), out.left_out)

    def stream_in(self, command: str, chunks: Iterable[bytes], on_bytes: Callable[[int], None], *,
                  changes: bool = True, timeout: float | None = STALL_S, finish: float | None = None) -> Result:
        """finish (None: timeout): how long the command may go on after its input has ended (this machine takes
        input as fast as it can write it)."""
        timeout = timeout if finish is None else finish
        proc = self._fed(command)
        out, err = _kept(proc)
        try:
            for chunk in chunks:
                proc.stdin.write(chunk)
                on_bytes(len(chunk))
        except BrokenPipeError:
            pass  # the command stopped reading: its exit status and stderr say why
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
        if not _ended(proc, out, err, None if timeout is None else time.monotonic() + timeout):
            return Result(self.host, command, 124, "", f"timed out: still running {timeout:g} s after its input")
        return Result(self.host, command, proc.returncode, out.text(), err.text(), out.left_out)

    def stream_out(self, command: str, on_line: Callable[[str], None], *, stdin: bytes | None = None) -> int:
        """Run command (given stdin), handing each line of its output (stderr merged) to on_line; its exit code."""
        proc = self._popen(command, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        if stdin:
            try:
                proc.stdin.write(stdin)
                proc.stdin.close()
            except BrokenPipeError:  # it ended without reading all: its output and exit code say why
                pass
        for line in read_lines(Lines(), lambda n: os.read(proc.stdout.fileno(), n)):
            on_line(line)
        proc.stdout.close()
        return proc.wait()

    def converse(self, command: str, silence: float) -> "LocalConversation":
        return LocalConversation(self.host, command, self._fed(command, bufsize=0), silence)

    def read_out(self, command: str, silence: float) -> "LocalReading":
        reading = LocalReading(self.host, command, self._fed(command, bufsize=0), silence)
        reading.end_input()
        return reading

    def interact(self, command: str, *, stdin: IO[bytes] | None, stdout: IO[bytes], stderr: IO[bytes],
                 tty: bool = False) -> int:
        """Run command on our own stdin (or none), stdout and stderr: bytes pass untouched, and `docker exec -t` finds
        the terminal itself (tty is for SSH). In kit's session, so the terminal's Ctrl-C and keys reach it."""
        return subprocess.run(self._argv(command), stdin=subprocess.DEVNULL if stdin is None else stdin,
                              stdout=stdout, stderr=stderr).returncode

    def close(self) -> None:
        """Ends what kit still writes to (an interrupted image step): each command's whole process group, which
        its own session makes. One run through sudo is root's and is not killed: its input ends, and a `docker
        load` then stops short of an image, or finishes one that had every byte."""
        with self.lock:
            self.closed = True
            feeding, self.feeding = self.feeding, []
        for proc in feeding:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _kept(proc: subprocess.Popen) -> tuple[Head, Tail]:
    """The head of its stdout and the tail of its stderr, each read beside (in `.reader`) until its end."""
    kept = Head(), Tail()
    for k, f in zip(kept, (proc.stdout, proc.stderr)):
        k.reader = threading.Thread(target=k.drain, args=(lambda n, fd=f.fileno(): os.read(fd, n),), daemon=True)
        k.reader.start()
    return kept


def _write(proc: subprocess.Popen, data: bytes) -> None:
    try:
        if data:
            proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, ValueError):  # it ended without reading all: its output and exit code say why
        pass


def _ended(proc: subprocess.Popen, out: Tail, err: Tail, deadline: float | None) -> bool:
    """Whether it ended, its output read to the end, by the deadline (None: none); else its session is killed (what it
    started holds its output open)."""
    left = lambda: None if deadline is None else max(deadline - time.monotonic(), 0)  # noqa: E731
    try:
        proc.wait(timeout=left())
    except subprocess.TimeoutExpired:
        pass
    for k in (out, err):
        k.reader.join(left())
    if proc.returncode is not None and not out.reader.is_alive() and not err.reader.is_alive():
        return True
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except (ProcessLookupError, PermissionError):  # root's, through sudo: left to end when its pipes close
        pass
    return False


class LocalConversation:
    """Runner.converse with a process of this machine."""

    def __init__(self, host: str, command: str, proc: subprocess.Popen, silence: float) -> None:
        self.host, self.command, self.proc, self.silence, self.err = host, command, proc, silence, Tail()
        self.said = Lines()
        self.reader = threading.Thread(target=self.err.drain, args=(proc.stderr.read,), daemon=True)
        self.reader.start()

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self.proc.stdin.write(view):]

    def end_input(self) -> None:
        self.proc.stdin.close()

    def quiet(self, silence: float | None) -> None:
        self.silence = silence

    def lines(self, kept: int = LINE_KEPT) -> Iterator[str]:
        self.said.keep(kept)
        return read_lines(self.said, self.read)

    def read(self, size: int = -1) -> bytes:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.silence)
        if not ready:
            raise TimeoutError
        return os.read(self.proc.stdout.fileno(), size if size > 0 else CHUNK)

    def result(self) -> Result:
        code = self.proc.wait()
        self.reader.join(5)
        return Result(self.host, self.command, code, "", self.err.text())

    def close(self) -> None:
        if not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass


class LocalReading(LocalConversation):
    """Runner.read_out with a process of this machine."""

    def close(self) -> None:
        super().close()
        if self.proc.poll() is None:  # stopped before its end: its whole process group, as LocalRunner.close
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
