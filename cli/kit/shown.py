"""Text from a host or a job, made safe to show a person: what a rank, a container or a host's stderr writes must
not drive the user's terminal (move the cursor, clear the screen, print a fake `✓ job finished`, write the clipboard
with OSC 52, reorder a line with bidi controls), nor flood it with one endless line.

The rule, one for every place kit prints remote text: the text is split on "\\n" (line breaks stay line breaks,
unless one_line); in each line every control and format character (Unicode's Cc, Cf, Cs, Zl, Zp: C0 but TAB, DEL, C1,
the bidi and zero-width controls, U+2028/U+2029, the tag characters...) is shown as an escape: \\x1b, \\x9b,
\\u2028, \\U000e0041; a "\\r" that ends a line (CRLF) is dropped. A line over LINE_CAP characters is cut and says how
much was cut. Nothing else changes; Rich markup is the printer's affair (print with markup=False, or escape it).
The result holds no control character and visible(visible(t)) == visible(t). Pure: no import from kit."""

from __future__ import annotations

import re
import unicodedata

LINE_CAP = 4096  # characters of one line; a rank's real lines are far shorter
_SUSPECT = re.compile(r"[^\t\x20-\x7e]")  # what may be a control: judged by its Unicode category
_HIDDEN = ("Cc", "Cf", "Cs", "Zl", "Zp")
_CUT_ROOM = 64  # room kept for the cut mark, so that a cut line stays within LINE_CAP
# The mark kit's runners end a line with when they kept only its start (kit.runners.base.Lines): kept through a cut
# here, so that a rank's endless line still says how long it was.
_RUNNER_MARK = re.compile(r" \[kit: [0-9]+ more bytes of this line left out\]$")


def _visible(char: str) -> str:
    if unicodedata.category(char) not in _HIDDEN:
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _line(line: str, cap: int) -> str:
    line = _SUSPECT.sub(lambda m: _visible(m.group()), line[:-1] if line.endswith("\r") else line)
    if len(line) <= cap:
        return line
    mark = found.group() if (found := _RUNNER_MARK.search(line)) else ""
    kept = cap - _CUT_ROOM - len(mark)
    return f"{line[:kept]}… ({len(line) - kept - len(mark)} more characters cut){mark}"


def visible(text: str, one_line: bool = False, cap: int = LINE_CAP) -> str:
    """text as it may reach a terminal (see the module's rule); one_line: a "\\n" too becomes visible, for text
    printed where one line is expected (a table cell, after a prefix)."""
    if one_line:
        return _line(text.replace("\n", "\\x0a"), cap)
    return "\n".join(_line(line, cap) for line in text.split("\n"))
