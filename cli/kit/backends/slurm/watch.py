"""kit's hang watch over a Slurm job it follows, as the supervisor's on the cluster: each rank's heartbeat (the rank
launcher writes it in the job's folder, which the login host shares with the nodes) is read from the login host;
when no rank has moved for the hang timeout, every rank's stack is asked for (scancel --signal=USR2: each rank's
faulthandler writes its threads' stacks beside its heartbeat) and kept in the job's folder, the stuck rank and its
node are named, and the job is cancelled.

What the ranks write is the job's: read only from regular files (no link followed), each cut at a bound, its rank
a number of the job's; the node a rank runs on is kit's own reading of Slurm's node list (output.Reader), never
what the rank says.
"""

from __future__ import annotations

import io
import re
import secrets
import shlex
import tarfile
import time
from collections import defaultdict
from dataclasses import replace
from typing import Callable

from kit.backends.cluster.supervisor.heartbeats import Beat, Watch, hang_report, parse_beats
from kit.backends.slurm.jobs import Ending
from kit.backends.slurm.output import Reader
from kit.jobs.pace import Pace, Sample
from kit.runners.base import Runner

READ_EVERY_S = 5.0         # the heartbeats are read at least this often (the watch's own period may be less)
START_GRACE_S = 600        # until a first heartbeat, this much more than the hang timeout: an image to import, Python
                           # to load from the shared filesystem on many nodes at once
SILENT_S = 15.0            # a rank whose heartbeat (written every 2 s) was not written anew for this long is silent
STACK_WAIT_S = 10          # how long the ranks have to write their stacks after SIGUSR2
STACK_BYTES = 64 << 10     # of each rank's stack, kept
REMOTE_TIMEOUT_S = 60


def progress_dir(folder: str, slurm_id: str, job_id: str) -> str:
    """Where the job's ranks write their heartbeats: the batch script's KIT_DIR/progress/KIT_JOB (templates/sbatch.j2),
    in the job's folder."""
    return f"{folder}/.kit/job-{slurm_id}/progress/{job_id}"


def stacks_dir(folder: str, slurm_id: str) -> str:
    """Where kit keeps a hung job's stacks: beside its output (kit-ID.out), a file a rank."""
    return f"{folder}/kit-{slurm_id}-stacks"


def _each(folder: str, pattern: str, mark: str, limit: int) -> str:
    """sh: each regular file (not a link) of folder whose name fits pattern, after a `mark NAME INODE:MTIME` line (a
    file written anew has another), cut at limit; a read that does not end at once (a file the job swapped for a FIFO
    meanwhile) is given up after 5 s."""
    return (f"for f in {shlex.quote(folder)}/{pattern}; do [ -f \"$f\" ] && [ ! -h \"$f\" ] || continue; "
            f"printf '%s %s %s\\n' '{mark}' \"${{f##*/}}\" \"$(stat -c %i:%Y -- \"$f\" 2>/dev/null)\"; "
            f"timeout 5 head -c {limit} -- \"$f\"; echo; done; true")


def _split(text: str, mark: str, suffix: str, written: dict[int, str] | None = None) -> dict[int, str]:
    """rank -> its text, from _each's output (a file name is the rank's number, then the suffix); written: filled
    with each file's INODE:MTIME."""
    found: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.split("\n"):
        named = re.fullmatch(rf"{re.escape(mark)} (\d{{1,6}}){re.escape(suffix)} ?(\d+:\d+)?", line)
        if named:
            current = found.setdefault(int(named[1]), [])
            if written is not None:
                written[int(named[1])] = named[2] or ""
        elif line.startswith(mark + " "):
            current = None
        elif current is not None:
            current.append(line)
    return {rank: "\n".join(lines).strip("\n") for rank, lines in found.items()}


class SlurmWatch:
    """Called at each look of the follow, while Slurm says the job runs: the hang report once no rank has moved for
    `timeout` seconds (since a rank last moved; before any rank wrote a heartbeat, START_GRACE_S more, counted from
    when Slurm started the job), else None (always, with no timeout). Reads the heartbeats every Watch.every seconds,
    READ_EVERY_S at most: one command on the login host. It also keeps when each rank last wrote its heartbeat anew
    (every 2 s while the rank's process lives, moving or not): a rank that stopped (silent()) was lost with its
    node, or killed, without the exit line its launcher prints."""

    def __init__(self, runner: Runner, folder: str, slurm_id: str, job_id: str, reader: Reader, timeout: float,
                 clock: Callable[[], float] = time.monotonic, find_lost: bool = False, window: float = 120,
                 say: Callable[[str], None] | None = None) -> None:
        self.runner, self.reader, self.clock, self.find_lost = runner, reader, clock, find_lost
        self.say = say or (lambda text: reader.show(None, None, text))  # kit's own lines (a straggler named)
        self.folder = progress_dir(folder, slurm_id, job_id)
        self.watch = Watch(timeout, clock)
        self.started = False
        self.beaten = False  # whether any rank has written a heartbeat yet
        self.next = 0.0
        self.mark = "@@kit-beat-" + secrets.token_hex(8)  # (a rank's file cannot end its part early: it cannot guess)
        self.written: dict[int, tuple[str, float]] = {}  # rank -> (its file's INODE:MTIME, when kit saw it so first)
        self.there: set[int] = set()  # the ranks whose heartbeat the last reading found
        self.pace = Pace(window=window)  # the ranks' pace (kit.jobs.pace): the nodes that hold the others back
        self.stragglers: list[str] = []  # what kit said of them, once each

    @property
    def ranks(self) -> int:
        return self.reader.ranks  # (a job submitted again with fewer nodes has fewer: as the reader counted them)

    def __call__(self) -> Ending | None:
        if not self.started:  # the watch's clock starts when Slurm starts the job, not while it waits in the queue
            self.started, self.watch.since = True, self.clock()
        if self.clock() < self.next:
            return None
        self.next = self.clock() + min(self.watch.every, READ_EVERY_S)
        r = self.runner.run(_each(self.folder, "[0-9]*", self.mark, 2000), timeout=REMOTE_TIMEOUT_S)
        beats = self.beats(r.stdout) if r.ok else []  # (no reading: no progress either)
        for slow in self.pace.look(self.clock()) if self.pace.window else ():
            self.stragglers.append(slow.text())
            self.say(f"kit: {slow.text()}")
        if self.find_lost and (lost := self.lost()):
            return Ending("lost", None, None, lost=tuple(sorted(lost)))
        if not self.watch.timeout:
            return None
        self.beaten = self.beaten or bool(beats)
        if not self.watch.stalled(beats) or not self.beaten and self.watch.quiet() < self.watch.timeout + START_GRACE_S:
            return None
        return Ending("hung", None, None, hang_report(self.watch.last, self.watch.quiet()))

    def beats(self, text: str) -> list[Beat]:
        """Each rank's heartbeat, with the node Slurm put it on; a file named for no rank of the job is none."""
        written: dict[int, str] = {}
        found = beats_of(text, self.mark, self.reader, written)
        now = self.clock()
        for b in found:
            if b.t is not None and b.host != "?":
                self.pace.add(b.rank, b.host, Sample(now, b.t, b.steps, b.data_s, b.comm_s))
        self.there = {b.rank for b in found}
        for rank in self.there:
            if self.written.get(rank, ("",))[0] != written.get(rank):
                self.written[rank] = (written.get(rank, ""), now)
        return found

    def silent(self, after: float = SILENT_S) -> dict[int, float]:
        """rank -> seconds since it last wrote its heartbeat, for each rank whose heartbeat the last reading found
        unchanged for `after` seconds or more (a rank that ended has none: its launcher removed it)."""
        now = self.clock()
        return {rank: now - since for rank, (_, since) in self.written.items()
                if rank in self.there and now - since >= after}

    def silent_nodes(self) -> dict[str, float]:
        """node -> seconds since its ranks last wrote a heartbeat, for each node every rank of which that kit saw is
        silent, and none of which printed its exit line."""
        silent, by_node = self.silent(), defaultdict(list)
        for rank in self.written:
            by_node[self.reader.node_of(rank)].append(rank)
        return {node: min(silent[r] for r in ranks) for node, ranks in by_node.items()
                if node and all(r in silent and r not in self.reader.exits for r in ranks)}

    def lost(self) -> dict[str, float]:
        """The silent nodes of a job that runs on though another of its ranks ended (its exit line, or srun's line of
        its task): their slurmd and tasks died with them, and srun waits for them until Slurm gives them up (the
        node's SlurmdTimeout, 300 s by default), the job doing nothing meanwhile."""
        return self.silent_nodes() if self.reader.exits or self.reader.srun_errors else {}


def beats_of(text: str, mark: str, reader: Reader, written: dict[int, str] | None = None) -> list[Beat]:
    """Each rank's heartbeat in _each's output, with the node Slurm put it on (reader's); a file named for no rank of
    the job is none."""
    found = []
    for rank, body in _split(text, mark, "", written).items():
        for beat in parse_beats("", body)[:1]:
            if beat.rank == rank < reader.ranks:
                found.append(replace(beat, host=reader.node_of(rank) or "?"))
    return found


def read_beats(runner: Runner, folder: str, slurm_id: str, job_id: str, reader: Reader) -> list[Beat]:
    """Every rank's heartbeat now (kit jobs ID --ranks), read from the login host."""
    mark = "@@kit-beat-" + secrets.token_hex(8)
    r = runner.run(_each(progress_dir(folder, slurm_id, job_id), "[0-9]*", mark, 2000), timeout=REMOTE_TIMEOUT_S)
    return beats_of(r.check(f"cannot read the heartbeats of job {job_id}").stdout, mark, reader)


def take_stacks(runner: Runner, folder: str, slurm_id: str, job_id: str, reader: Reader, ranks: list[int],
                signal: Callable[[], None], sleep: Callable[[float], None] = time.sleep) -> tuple[str, dict[int, str]]:
    """Every rank's stack, kept in the job's folder (stacks_dir): signal() sends SIGUSR2 to the job's tasks, whose
    ranks write their stacks; those that answered within STACK_WAIT_S are read and written there, a file a rank
    (rank-N.txt), each headed by the rank and its node. (that folder, rank -> stack)."""
    source = progress_dir(folder, slurm_id, job_id)
    mark = "@@kit-stack-" + secrets.token_hex(8)
    signal()
    found: dict[int, str] = {}
    deadline = time.monotonic() + STACK_WAIT_S
    while True:  # (bounded: STACK_WAIT_S)
        r = runner.run(_each(source, "[0-9]*.stack", mark, STACK_BYTES), timeout=REMOTE_TIMEOUT_S)
        found = {rank: text for rank, text in _split(r.stdout if r.ok else "", mark, ".stack").items()
                 if text and rank in ranks}  # (a file named for no rank of the job is none)
        if set(ranks) <= set(found) or time.monotonic() >= deadline:
            break
        sleep(1.0)
    kept = io.BytesIO()
    with tarfile.open(fileobj=kept, mode="w") as tar:
        for rank in sorted(set(ranks) | set(found)):
            text = found.get(rank, f"(no stack: the rank did not answer SIGUSR2 within {STACK_WAIT_S} s)")
            data = f"rank {rank} on {reader.node_of(rank) or '?'}\n{text}\n".encode(errors="replace")
            info = tarfile.TarInfo(f"rank-{rank}.txt")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    where = stacks_dir(folder, slurm_id)
    # A folder of kit's, made anew: whatever the job put at its name (a link to elsewhere included) is removed
    # first, never followed.
    at = shlex.quote(where)
    runner.run(f"rm -rf -- {at} && mkdir -m 755 -- {at} && tar -xf - -C {at}", stdin=kept.getvalue(),
               timeout=REMOTE_TIMEOUT_S, changes=True).check(f"cannot keep the stacks of job {job_id} in {where}")
    return where, found
