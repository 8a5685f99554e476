"""Reading what a host printed, where part of it is a container's (a job's) to forge.

A host's scripts mark their sections with lines that start with a marker, and a container's lines are prefixed so
that none of them starts with one. Both hold only when text is cut into lines where the shell cut them, at a line
feed: str.splitlines also cuts at \\r, \\v, \\f, \\x1c-\\x1e, \\x85, U+2028 and U+2029, which a container can print
in the middle of one of its lines. Numbers are ASCII digits only: '²'.isdigit() is true and int('²') fails. Pure.
"""

from __future__ import annotations

import re

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
