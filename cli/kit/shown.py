"""Text from a host or a job, made safe to show a person: what a rank, a container or a host's stderr writes must
not drive the user's terminal (move the cursor, clear the screen, print a fake `✓ job finished`, write the clipboard
with OSC 52, reorder a line with bidi controls), nor flood it with one endless line.

The rule, one for every place kit prints remote text: the text is split on "\\n" (line breaks stay line breaks,
unless one_line); in each line every C0 control but TAB, DEL, every C1 control (U+0080-U+009F), U+2028/U+2029 and
the invisible format controls (U+200B-U+200F, U+202A-U+202E, U+2066-U+2069, U+FEFF) are shown as escapes: \\x1b,
\\x9b, \\u2028; a "\\r" that ends a line (CRLF) is dropped. A line over LINE_CAP characters is cut and says how
much was cut. Nothing else changes; Rich markup is the printer's affair (print with markup=False, or escape it).
The result holds no control character and visible(visible(t)) == visible(t). Pure: no import from kit."""

from __future__ import annotations

import re

LINE_CAP = 4096  # characters of one line; a rank's real lines are far shorter
_FORMAT = "\u200b-\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff"
_CONTROL = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f{_FORMAT}]")
_CUT_ROOM = 64  # room kept for the cut mark, so that a cut line stays within LINE_CAP


def _visible(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _line(line: str, cap: int) -> str:
    line = _CONTROL.sub(lambda m: _visible(m.group()), line[:-1] if line.endswith("\r") else line)
    if len(line) <= cap:
        return line
    kept = cap - _CUT_ROOM
    return f"{line[:kept]}… ({len(line) - kept} more characters cut)"


def visible(text: str, one_line: bool = False, cap: int = LINE_CAP) -> str:
    """text as it may reach a terminal (see the module's rule); one_line: a "\\n" too becomes visible, for text
    printed where one line is expected (a table cell, after a prefix)."""
    if one_line:
        return _line(text.replace("\n", "\\x0a"), cap)
    return "\n".join(_line(line, cap) for line in text.split("\n"))
