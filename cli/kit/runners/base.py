from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections import deque
from typing import IO, Callable, Iterable, Iterator, Protocol

from kit.errors import KitError

TAIL_LINES = 15
# The end of a conversation's stderr that kit keeps (it says why the command failed): what a container says there may
# be the job's, and never ends.
STDERR_KEPT = 64 << 10
# The start of a command's stdout that kit keeps (what its parsers read: kit's own scripts say far less); the rest is
# counted, not held.
STDOUT_KEPT = 16 << 20
# The start of one line of output that kit keeps: a rank may write without ever ending its line (or from /dev/zero).
LINE_KEPT = 64 << 10
CHUNK = 1 << 16


@dataclass(frozen=True)
class Result:
    host: str
    command: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    cut: int = 0  # bytes of stdout past the STDOUT_KEPT that kit keeps: what a parser would read is not whole

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self) -> str:
        text = (self.stderr.strip() or self.stdout.strip())
        return "\n".join(text.splitlines()[-TAIL_LINES:])

    def check(self, what: str, hint: str | None = None) -> "Result":
        """Raise, naming host, command and the tail of its output, unless it succeeded."""
        if not self.ok:
            how = f"exit {self.exit_code}" if self.exit_code >= 0 else "it ended without an exit status"
            raise KitError(f"{what} ({how})", host=self.host, command=self.command, output_tail=self.tail(),
                           hint=hint)
        if self.cut:
            raise KitError(f"{what}: its output is longer than the {STDOUT_KEPT >> 20} MiB kit reads ({self.cut} "
                           "bytes more)", host=self.host, command=self.command, hint=hint)
        return self


class Tail:
    """The last `size` bytes of a stream (a command's stderr says at its end why it failed): the one place each runner
    keeps a stderr."""

    def __init__(self, size: int = STDERR_KEPT) -> None:
        self.size, self.data = size, b""

    def add(self, chunk: bytes) -> None:
        self.data = (self.data + chunk)[-self.size:]

    def drain(self, read: Callable[[int], bytes]) -> "Tail":
        """Reads until read gives b"" (the stream's end)."""
        while chunk := read(CHUNK):
            self.add(chunk)
        return self

    def text(self) -> str:
        return self.data.decode(errors="replace")


class Head(Tail):
    """The first `size` bytes of a stream (what a parser reads); what comes after is counted (`left_out`) and let go."""

    def __init__(self, size: int = STDOUT_KEPT) -> None:
        super().__init__(size)
        self.left_out = 0

    def add(self, chunk: bytes) -> None:
        room = max(self.size - len(self.data), 0)
        self.data += chunk[:room]
        self.left_out += max(len(chunk) - room, 0)


class Lines:
    """Bytes as they come, cut into lines of at most LINE_KEPT bytes: the rest of a longer line is counted and let go
    (said at the line's end), not handed on as lines of its own, which would let what a job writes start a line kit
    reads (a rank's line begins with what names the rank)."""

    def __init__(self, kept: int = LINE_KEPT) -> None:
        self.kept, self.line, self.ready = kept, Head(kept), deque()

    def keep(self, kept: int) -> None:
        """From the line now read on, keep `kept` bytes of each."""
        self.kept = self.line.size = kept
        self.line.left_out += max(len(self.line.data) - kept, 0)
        self.line.data = self.line.data[:kept]

    def feed(self, data: bytes) -> None:
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self.line.add(data[start:end])
            self._done()
            start = end + 1
        self.line.add(data[start:])

    def end(self) -> None:
        """The stream ended: a last line without its newline is a line too."""
        if self.line.data or self.line.left_out:
            self._done()

    def _done(self) -> None:
        text = self.line.text().rstrip("\r")
        if self.line.left_out:
            text += f" [kit: {self.line.left_out} more bytes of this line left out]"
        self.ready.append(text)
        self.line = Head(self.kept)


def read_lines(lines: Lines, read: Callable[[int], bytes]) -> Iterator[str]:
    """The lines of what read gives (b"": its end), each as soon as it is whole; `lines` keeps what is left of them
    for the next call."""
    while True:
        while lines.ready:
            yield lines.ready.popleft()
        data = read(CHUNK)
        if not data:
            lines.end()
            yield from (lines.ready.popleft() for _ in range(len(lines.ready)))
            return
        lines.feed(data)


class Runner(Protocol):
    host: str
    sudo: bool

    def peer_address(self) -> str: ...

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None,
            changes: bool = False) -> Result: ...

    def stream_in(self, command: str, chunks: Iterable[bytes], on_bytes: Callable[[int], None], *,
                  changes: bool = True, timeout: float | None = None, finish: float | None = None) -> Result: ...

    def stream_out(self, command: str, on_line: Callable[[str], None], *, stdin: bytes | None = None) -> int: ...

    def converse(self, command: str, silence: float) -> "Conversation": ...

    def read_out(self, command: str, silence: float) -> "Reading": ...

    def interact(self, command: str, *, stdin: IO[bytes] | None, stdout: IO[bytes], stderr: IO[bytes],
                 tty: bool = False) -> int: ...

    def close(self) -> None: ...


class Conversation(Protocol):
    """A command that runs while kit writes to its stdin and reads its stdout line by line."""

    def send(self, data: bytes) -> None:
        """Raises OSError when the command no longer takes input (over SSH also when it took none for `silence` s)."""

    def end_input(self) -> None: ...

    def quiet(self, silence: float | None) -> None:
        """From now on, how long it may say nothing (None: as long as it takes)."""

    def lines(self, kept: int = LINE_KEPT) -> Iterator[str]:
        """Its stdout, line by line, each cut at `kept` bytes (the rest counted: kit's own answers may be longer than
        what a job writes may); raises TimeoutError when it says nothing for `silence` seconds."""

    def result(self) -> Result:
        """Once its output ended: its exit code and the tail of its stderr."""

    def close(self) -> None:
        """Stop listening: its input ends, which tells a command that watches it to stop."""


class Reading(Protocol):
    """A command whose stdout kit reads as bytes (a tar stream), its input closed."""

    def read(self, size: int = -1) -> bytes:
        """Up to size bytes (b"" at the end); raises TimeoutError when it says nothing for `silence` seconds."""

    def result(self) -> Result:
        """Once its output ended: its exit code and the tail of its stderr."""

    def close(self) -> None: ...


RETRY_EVERY_S = 0.5
STALL_S = 300  # a stream whose far end takes nothing and says nothing this long has failed
SSHD_READY_S = 30  # a container's sshd starts in well under a second; allow for a loaded host
HOST_KEY_FAILED = "Host key verification failed"


def run_until_ok(runner: Runner, command: str, seconds: float, **options) -> Result:
    """Run a command until it succeeds, for at most `seconds` (something just started may need a moment);
    a failed host-key check is final. Returns the last result."""
    deadline = time.monotonic() + seconds
    while True:
        r = runner.run(command, **options)
        if r.ok or time.monotonic() > deadline or HOST_KEY_FAILED in r.stderr:
            return r
        time.sleep(RETRY_EVERY_S)


@dataclass
class DryRunner:
    """Reads go to the real host; changes are recorded and reported as done."""

    inner: Runner
    planned: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return self.inner.host

    @property
    def sudo(self) -> bool:
        return self.inner.sudo

    @sudo.setter
    def sudo(self, value: bool) -> None:
        self.inner.sudo = value

    def peer_address(self) -> str:
        return self.inner.peer_address()

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None,
            changes: bool = False) -> Result:
        if not changes:
            return self.inner.run(command, stdin=stdin, timeout=timeout)
        self.planned.append(command + (f"  <<< {len(stdin)} bytes" if stdin else ""))
        return Result(self.host, command, 0)

    def stream_in(self, command: str, chunks: Iterable[bytes], on_bytes: Callable[[int], None], *,
                  changes: bool = True, timeout: float | None = None, finish: float | None = None) -> Result:
        self.planned.append(f"{command}  <<< streamed")
        return Result(self.host, command, 0)

    def close(self) -> None:
        self.inner.close()
