from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import IO, Callable, Iterable, Iterator, Protocol

from kit.errors import KitError

TAIL_LINES = 15
# The end of a conversation's stderr that kit keeps (it says why the command failed): what a container says there may
# be the job's, and never ends.
STDERR_KEPT = 64 << 10


@dataclass(frozen=True)
class Result:
    host: str
    command: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""

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
        return self


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

    def lines(self) -> Iterator[str]:
        """Its stdout, line by line; raises TimeoutError when it says nothing for `silence` seconds."""

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
