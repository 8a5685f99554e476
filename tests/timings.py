"""The figures tests/run prints at its end: each phase's time and each stream's slowest tests.

    python tests/timings.py FOLDER

FOLDER holds what tests/run wrote as it went: `phases` (a line a mark, `NAME start|end EPOCH`), one pytest JUnit
file a stream (`STREAM.xml`: its tests' times, setup and teardown included, so a session fixture's build counts in
the first test that needed it), and `waits` (a line a test that waited more than a second for the other streams'
share of the machine: `STREAM SECONDS NODEID`). Only the standard library: it runs with the machine's python3
before kit's venv exists, and after a failed run.
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SLOWEST = 10


def phases(text: str) -> list[tuple[str, float]]:
    """(name, seconds) of each phase that both started and ended, in the order they started, `total` last."""
    start, took = {}, {}
    for line in text.splitlines():
        name, mark, at = line.split()
        if mark == "start":
            start[name] = float(at)
        elif name in start:
            took[name] = float(at) - start[name]
    return sorted(((name, took[name]) for name in start if name in took), key=lambda phase: phase[0] == "total")


def tests(junit: str) -> list[tuple[float, str, str]]:
    """(seconds, outcome, id) of every test in a pytest JUnit file."""
    found = []
    for case in ET.fromstring(junit).iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        found.append((float(case.get("time") or 0), outcome, name))
    return found


def waits(text: str) -> dict[str, tuple[int, float]]:
    """stream -> (tests that waited, seconds waited in all) for the other streams' share of the machine."""
    found: dict[str, tuple[int, float]] = {}
    for line in text.splitlines():
        stream, seconds, _ = line.split(" ", 2)
        count, total = found.get(stream, (0, 0.0))
        found[stream] = (count + 1, total + float(seconds))
    return found


def minutes(seconds: float) -> str:
    return f"{seconds:7.0f} s {seconds / 60:5.1f} min"


def report(folder: Path) -> str:
    lines = ["phases"]
    marks = folder / "phases"
    for name, seconds in phases(marks.read_text() if marks.exists() else ""):
        lines.append(f"  {name:<24} {minutes(seconds)}")
    waited = waits((folder / "waits").read_text()) if (folder / "waits").exists() else {}
    for junit in sorted(folder.glob("*.xml")):
        stream = junit.stem
        try:
            found = tests(junit.read_text())
        except ET.ParseError:  # a stream killed before pytest wrote its file
            continue
        count, total = waited.get(stream, (0, 0.0))
        spent = sum(t for t, _, _ in found)
        lines.append(f"{stream}: {len(found)} tests, {spent:.0f} s in them ({spent / 60:.1f} min); "
                     f"{count} waited {total:.0f} s in all for the other streams")
        for seconds, outcome, name in sorted(found, reverse=True)[:SLOWEST]:
            lines.append(f"  {seconds:7.1f} s  {name}{'' if outcome == 'passed' else f' ({outcome})'}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1])))
