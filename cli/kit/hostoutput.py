r"""Reading what a host printed, where part of it is a container's (a job's) to forge.

kit's scripts print what they read in sections, each started by a line `@@kit NAME` (MARK), and a container's lines
go with INNER in front, so that none of them can start one. Both hold only when the text is cut into lines where the
shell cut it, at a line feed: str.splitlines also cuts at \r, \v, \f, \x1c-\x1e, \x85, U+2028 and U+2029, which a
container can print in the middle of one of its lines. A number is ASCII digits only: '²'.isdigit() is true and
int('²') fails, and int('٣') is 3. Pure.
"""

from __future__ import annotations

import re

MARK = "@@kit "  # a line that starts a section: MARK NAME
INNER = "|"  # in front of every line a container printed (sed 's/^/|/' on the host)
PREFIX_INNER = f"sed 's/^/{INNER}/'"


def lines(text: str) -> list[str]:
    """text cut at line feeds only (a last line feed ends the last line, as with str.splitlines)."""
    if not text:
        return []
    return text.removesuffix("\n").split("\n")


def inner_lines(text: str) -> list[str]:
    """The container's lines of text (those with INNER in front), without it."""
    return [line[len(INNER):] for line in lines(text) if line.startswith(INNER)]


def is_number(text: str) -> bool:
    """A plain decimal number: ASCII digits, at least one (no sign, no space, no '²' or '٣')."""
    return re.fullmatch(r"[0-9]+", text) is not None


def number(text: str, default: int | None = None) -> int | None:
    """int(text) when text is a plain decimal number, else default."""
    return int(text) if is_number(text) else default


def sections(text: str) -> dict[str, str]:
    """NAME -> its text, for each `@@kit NAME` section of a script's output (a later one of a name replaces it)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in lines(text):
        if line.startswith(MARK):
            current = line[len(MARK):].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v).strip() for k, v in out.items()}
