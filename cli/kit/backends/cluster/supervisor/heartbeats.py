"""The ranks' heartbeats, and the supervisor's watch on them: the script that reads them on a host, the one that
reads every rank's stack, their parsers, the report of a hang and the Watch that says when no rank has moved for too
long. Standard library only: shipped in the supervisor's script (kit.backends.cluster.supervisor.shipped)."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass

from kit.backends.cluster.supervisor.launch import PROGRESS, PROGRESS_DIR  # shipped together


# ---------------------------------------------------------------------------------------------- ranks' heartbeats

# In each host's container: every heartbeat of the job, one JSON line each (see heartbeat()).
def progress_script(job_id: str) -> str:
    # (a heartbeat being written, *.new, is skipped; and a rank's stack, *.stack)
    return (f"for f in \"{PROGRESS}/{job_id}\"/*; do case \"$f\" in *.new|*.stack) continue;; esac; "
            "[ -f \"$f\" ] && head -c 2000 \"$f\" && echo; done; true")


# In each host's container: every rank's Python stack (py-spy), each after a line `@@kit-stack RANK PID`; only
# for a pid that carries the job's mark (a rank writes its heartbeat: its pid is not taken on trust).
STACKS = r"""
import json, os, subprocess, sys, time
job = sys.argv[1]
folder = os.path.join(os.environ.get("KIT_PROGRESS_DIR", sys.argv[2]), job)
ranks, end = [], time.monotonic() + 30
for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
    if name.endswith(".new"):  # (one being written)
        continue
    try:
        with open(os.path.join(folder, name)) as f:
            beat = json.loads(f.read(2000))
        rank, pid = int(beat["rank"]), int(beat["pid"])
        with open("/proc/%d/environ" % pid, "rb") as f:
            if ("KIT_JOB=" + job).encode() not in f.read().split(b"\0"):
                continue
    except (OSError, ValueError, KeyError, TypeError):
        continue
    try:  # every rank at once: a rank stuck in the kernel can make py-spy wait its whole timeout
        ranks.append((rank, pid, subprocess.Popen(["py-spy", "dump", "--pid", str(pid)], stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True)))
    except OSError as e:
        print("@@kit-stack %d %d\npy-spy could not run: %s" % (rank, pid, e), flush=True)
for rank, pid, proc in ranks:
    try:
        out = proc.communicate(timeout=max(1.0, end - time.monotonic()))[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        out = "py-spy could not read it in 30 s (the process may be stuck in the kernel: D state)"
    print("@@kit-stack %d %d\n%s" % (rank, pid, out.strip()), flush=True)
"""


def stacks_argv(job_id: str) -> list[str]:
    return ["python", "-I", "-c", STACKS, job_id, PROGRESS_DIR]


def parse_stacks(text: str) -> dict[int, str]:
    """rank -> its stack, from the output of stacks_argv()."""
    found: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.removesuffix("\n").split("\n"):  # (a stack is its rank's text: no other break starts a rank)
        parts = line.split()
        if line.startswith("@@kit-stack ") and len(parts) == 3 and parts[1].isascii() and parts[1].isdigit():
            current = found.setdefault(int(parts[1]), [])
        elif current is not None:
            current.append(line)
    return {rank: "\n".join(lines) for rank, lines in found.items()}


@dataclass(frozen=True)
class Beat:
    host: str
    rank: int
    moves: int     # how often the rank's main thread was seen somewhere else than before
    where: str     # where it is now: file:line in function
    t: float | None = None  # the rank's own clock when it wrote it (None: a launcher that keeps no pace)
    steps: int = 0          # the steps the script marked (kit_pace.step), and its seconds waiting for data
    data_s: float = 0.0     # (kit_pace.data) and in collectives (Horovod's, kit_pace.comm), since it started
    comm_s: float = 0.0


def _pace(raw: dict) -> tuple:
    """A heartbeat's pace (t, steps, data_s, comm_s), () where it has none or it is no figures (a rank writes it)."""
    try:
        t, steps, data_s, comm_s = (float(raw["t"]), int(raw["steps"]), float(raw["data_s"]), float(raw["comm_s"]))
    except (KeyError, ValueError, TypeError, OverflowError):
        return ()
    return (t, steps, data_s, comm_s) if all(0 <= x < 1e12 for x in (t, steps, data_s, comm_s)) else ()


def parse_beats(host: str, text: str) -> list[Beat]:
    """The heartbeats in progress_script's output, read on `host`. A rank writes them: whatever is not a heartbeat
    is skipped, and `where` keeps no character that is not printable (a newline in it printed a line that passed for
    kit's own)."""
    beats = []
    for line in text.splitlines():
        try:
            raw = json.loads(line)
            where = "".join(c if c.isprintable() else "?" for c in str(raw["where"])[:300])
            beats.append(Beat(host, int(raw["rank"]), int(raw["moves"]), where, *_pace(raw)))
        except (ValueError, KeyError, TypeError):
            continue
    return beats


def placed(beats: list[Beat], ranks: list[str] | tuple[str, ...]) -> list[Beat]:
    """The heartbeats of the launch's ranks (ranks: the host of each), each only as read on its own host, and one a
    rank: any rank may write a file there, and one for a made-up rank, or for a rank of another host, moved that
    host's pace (an innocent host named a straggler) and the hang watch's count."""
    seen: set[int] = set()
    out = []
    for b in beats:
        if 0 <= b.rank < len(ranks) and ranks[b.rank] == b.host and b.rank not in seen:
            seen.add(b.rank)
            out.append(b)
    return out


def odd_ones(beats: list[Beat]) -> tuple[list[Beat], str]:
    """The ranks that are somewhere else than most, and where most are: only when more than half the ranks are in
    one place (with no such majority, none is named odd: the report lists where each rank is)."""
    if not beats:
        return [], ""
    common, count = Counter(b.where for b in beats).most_common(1)[0]
    if count * 2 <= len(beats):
        return [], ""
    return [b for b in beats if b.where != common], common


def hang_report(beats: list[Beat], seconds: float) -> str:
    odd, common = odd_ones(beats)
    if not beats:
        return f"no rank has started in {seconds:.0f} s"
    head = f"no rank has made progress for {seconds:.0f} s"

    def where(ranks: list[Beat]) -> str:
        return "; ".join(f"rank {b.rank} on {b.host} is at {b.where}" for b in sorted(ranks, key=lambda b: b.rank))
    if not common:
        return f"{head}: {where(beats)}"
    if not odd:
        return f"{head}: all {len(beats)} ranks wait at {common}"
    named = where(odd)
    rest = len(beats) - len(odd)
    return f"{head}: {named}; the other {rest} {'rank waits' if rest == 1 else 'ranks wait'} at {common}"


class Watch:
    """Whether any rank has moved lately: by the heartbeats' counters, on the supervisor's own clock."""

    def __init__(self, timeout: float, clock=time.monotonic) -> None:
        self.timeout, self.clock = timeout, clock
        self.every = max(1.0, min(30.0, timeout / 6)) if timeout else 3600.0
        self.since = clock()   # the last time any rank moved (or the launch)
        self.seen: dict[tuple[str, int], int] = {}
        self.last: list[Beat] = []

    def stalled(self, beats: list[Beat]) -> bool:
        """A rank moved when its counter changed, or it is new; a rank missing from this reading (its host did not
        answer in time) is not progress."""
        moved = {(b.host, b.rank): b.moves for b in beats}
        if any(self.seen.get(rank) != count for rank, count in moved.items()):
            self.since = self.clock()
        self.seen = {**self.seen, **moved}
        self.last = beats
        return self.quiet() >= self.timeout

    def quiet(self) -> float:
        return self.clock() - self.since
