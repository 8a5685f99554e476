"""Errors kit raises. Only app.py turns them into output and exit codes.

Every error says what failed and where; `hint` is the one line that says how
to fix it. Remote and build failures also carry the command and the tail of
its output, so the user never has to go looking for the log.
"""

from __future__ import annotations


class KitError(Exception):
    """A failure of the job, a host or the engine: exit code 1."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        host: str | None = None,
        command: str | None = None,
        output_tail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.host = host
        self.command = command
        self.output_tail = output_tail

    def __str__(self) -> str:
        where = f"{self.host}: " if self.host else ""
        return f"{where}{self.message}"

    def exiting(self, code: int | None) -> "KitError":
        """This error, kit's exit code the job's own (as if it ran here) where that is one a process exits with and
        says a failure (1 to 254), else 1."""
        self.exit_code = code if code is not None and 0 < code < 255 else 1
        return self


class BadInput(KitError):
    """The user's input is wrong; nothing was changed anywhere: exit code 2."""

    exit_code = 2


class BuildFailed(KitError):
    """`docker build` stopped at a step."""


class VerifyFailed(KitError):
    """A built image does not do what a training image must."""


class HostsFailed(KitError):
    """One or more hosts failed; every one is reported, not only the first."""

    def __init__(self, what: str, failures: dict[str, KitError]) -> None:
        names = ", ".join(failures)
        super().__init__(f"{what} failed on {len(failures)} host{'s' if len(failures) > 1 else ''}: {names}",
                         hint=_common_hint(failures))
        self.failures = failures


def _common_hint(failures: dict[str, KitError]) -> str | None:
    hints = {f.hint for f in failures.values() if f.hint}
    return hints.pop() if len(hints) == 1 else None


def read_input(path, what: str, hint: str) -> str:
    """A file the user gave (hosts.txt, kit.yaml): its text, or BadInput naming the file (and line) and the fix."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BadInput(f"{path}: cannot read the {what} ({e.strerror})", hint=hint) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise BadInput(f"{path}:{line}: the {what} is not UTF-8 text (byte 0x{data[e.start]:02x})",
                       hint="save it as UTF-8 (plain ASCII is fine); `iconv -f latin1 -t utf-8` converts Latin-1") \
            from None
