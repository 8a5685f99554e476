"""Each rank's pace, from its heartbeats, and the host whose ranks hold the others back. Pure; standard library only
(a supervisor may be shipped it, as it is the heartbeats' parser).

A rank's heartbeat carries its counters since it started: steps, and the seconds it waited for data and in
collectives, on the rank's own clock (`t`). In synchronous data parallel training every rank makes steps at the
same rate (each allreduce waits for the slowest), so the rate names nobody: what differs is how much of a step each
rank spends *not* waiting in collectives (computing, or waiting for its data). A slow host's ranks wait least, the
others wait for them. So a rank's figure is its busy time a step, (time - time waiting in collectives) / steps,
over a recent span; a host's, the median of its ranks'; and a host is slow when its figure is `factor` times the
median of the other hosts' (one host alone: each rank against the median of the others), and a straggler once it
has been slow at every look for `window` seconds. It is named once.

Without the collectives' waits (a script that marks no step, a launcher with no hook), every busy time is the
step time and nobody is slow: no false alarm, and no finding either.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

FACTOR = 1.5          # slower than the others by this much ...
WINDOW_S = 120.0      # ... at every look for this long: a straggler
SPAN_S = 30.0         # a rank's figures are over its samples of the last SPAN_S (kit's clock), the window at most
LOOKS = 4             # looks a window, at least (a reading every window / LOOKS, 1 s to EVERY_S apart)
EVERY_S = 30.0        # ... and at most this far apart
KEEP_S = 600.0        # samples older than this are dropped


@dataclass(frozen=True)
class Sample:
    """One heartbeat's counters (cumulative since the rank started), read at kit's `seen` time."""

    seen: float           # kit's clock when it read the heartbeat
    t: float              # the rank's own clock when it wrote it
    steps: int
    data_s: float = 0.0   # waiting for the next batch
    comm_s: float = 0.0   # waiting in collectives


@dataclass(frozen=True)
class RankPace:
    rank: int
    host: str
    steps: int
    step_s: float         # seconds a step, over the span
    busy_s: float         # of which not waiting in collectives
    data: float           # share of the span waiting for data
    comm: float           # share of the span waiting in collectives

    @property
    def compute(self) -> float:
        return max(0.0, 1.0 - self.data - self.comm)

    @property
    def steps_per_s(self) -> float:
        return 1.0 / self.step_s if self.step_s > 0 else 0.0


@dataclass(frozen=True)
class Straggler:
    host: str
    ranks: tuple[int, ...]
    factor: float         # its busy time a step, over the others'
    seconds: float        # how long it has been slow
    data: float           # its ranks' shares of the span (medians)
    compute: float
    comm: float

    alone: bool = False   # a job on one host: a rank against the others

    def text(self) -> str:
        (plural, singular), share = max(((("wait for data", "waits for data"), self.data),
                                         (("compute", "computes"), self.compute),
                                         (("wait in collectives", "waits in collectives"), self.comm)),
                                        key=lambda c: c[1])
        who = f"rank {self.ranks[0]} on {self.host}" if self.alone else \
            f"host {self.host} (rank{'s' if len(self.ranks) > 1 else ''} {ranges(self.ranks)})"
        does = "it " + singular if self.alone else \
            "its rank " + singular if len(self.ranks) == 1 else "its ranks " + plural
        return (f"straggler: {who} {self.factor:.1f}x slower than the others for {minutes(self.seconds)}; "
                f"{does} {share:.0%} of the time")


def ranges(ranks: tuple[int, ...] | list[int]) -> str:
    """0, 1, 2, 5 -> "0-2, 5"."""
    out, ordered = [], sorted(ranks)
    start = prev = ordered[0] if ordered else 0
    for r in ordered[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if r is not None:
            start = prev = r
    return ", ".join(out)


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


@dataclass
class Pace:
    """The job's ranks' samples, looked at as they come (add, then look)."""

    factor: float = FACTOR
    window: float = WINDOW_S
    span: float = SPAN_S
    samples: dict[int, deque] = field(default_factory=dict)   # rank -> its samples, oldest first
    hosts: dict[int, str] = field(default_factory=dict)       # rank -> its host
    slow_since: dict[str, float] = field(default_factory=dict)  # host -> when it was first slow, at every look since
    named: set[str] = field(default_factory=set)               # hosts named once already

    def __post_init__(self) -> None:
        if self.window:  # (a figure over more than the window would name a host only well after it had been slow
            self.span = min(self.span, self.window)  # for the window)

    @property
    def every(self) -> float:
        """How often the heartbeats are read for the pace: LOOKS times a window, 1 s to EVERY_S apart (with the
        default window, the hang watch's own period); never, for a job with no window."""
        return max(1.0, min(EVERY_S, self.window / LOOKS)) if self.window else float("inf")

    def add(self, rank: int, host: str, sample: Sample) -> None:
        """A rank's new sample. A rank whose counters went back (it started again: a restart) starts anew."""
        kept = self.samples.setdefault(rank, deque())
        if kept and (sample.steps < kept[-1].steps or sample.t < kept[-1].t or self.hosts.get(rank) != host):
            kept.clear()
            for name in (self.hosts.get(rank, host), f"{self.hosts.get(rank, host)} rank {rank}"):
                self.slow_since.pop(name, None)  # (its figure starts anew: so does its time slow)
        if kept and sample.t == kept[-1].t:
            return  # (the same heartbeat, read again)
        self.hosts[rank] = host
        kept.append(sample)
        while kept and kept[0].seen < sample.seen - KEEP_S:
            kept.popleft()

    def ranks(self, now: float) -> list[RankPace]:
        """Each rank's figures over its samples of the last span (a rank with no step in it has none)."""
        out = []
        for rank, kept in sorted(self.samples.items()):
            if not kept or kept[-1].seen < now - self.span:
                continue  # (no heartbeat lately: the hang watch's to judge)
            older = [s for s in kept if s.seen < now - self.span]
            first, last = older[-1] if older else kept[0], kept[-1]
            steps, elapsed = last.steps - first.steps, last.t - first.t
            if steps <= 0 or elapsed <= 0:
                continue
            comm, data = last.comm_s - first.comm_s, last.data_s - first.data_s
            out.append(RankPace(rank, self.hosts[rank], last.steps, elapsed / steps,
                                max(0.0, elapsed - comm) / steps, clamp(data / elapsed), clamp(comm / elapsed)))
        return out

    def look(self, now: float) -> list[Straggler]:
        """The hosts that have been slow at every look for the window, each named once (the first time)."""
        groups, ratios, alone = compared(self.ranks(now))
        found = []
        for name, group in groups.items():
            ratio = ratios.get(name)
            if ratio is None or ratio < self.factor:
                self.slow_since.pop(name, None)
                continue
            since = self.slow_since.setdefault(name, now)
            if now - since >= self.window and name not in self.named:
                self.named.add(name)
                found.append(Straggler(group[0].host, tuple(p.rank for p in group), ratio, now - since,
                                       statistics.median(p.data for p in group),
                                       statistics.median(p.compute for p in group),
                                       statistics.median(p.comm for p in group), alone))
        return found


def compared(paces: list[RankPace]) -> tuple[dict[str, list[RankPace]], dict[str, float], bool]:
    """(the groups compared: each host's ranks, or on one host each rank alone; each group's busy time a step over
    the median of the others', where the others have one; whether the job is on one host)."""
    by_host: dict[str, list[RankPace]] = {}
    for p in paces:
        by_host.setdefault(p.host, []).append(p)
    alone = len(by_host) == 1
    groups = {f"{p.host} rank {p.rank}": [p] for p in paces} if alone else by_host  # (one host: rank by rank)
    ratios: dict[str, float] = {}
    if not counted(paces):
        return groups, ratios, alone  # (each busy time is the step time: they would all compare as 1.0, naming none)
    figure = {name: statistics.median(p.busy_s for p in group) for name, group in groups.items()}
    for name in groups:
        others = [v for other, v in figure.items() if other != name]
        if others and statistics.median(others) > 0:
            ratios[name] = figure[name] / statistics.median(others)
    return groups, ratios, alone


def counted(paces: list[RankPace]) -> bool:
    """Whether any rank's waits in collectives are counted (Horovod's are; a DDP job's wait inside backward() is not):
    without them, no rank can be told from the others."""
    return any(p.comm > 0 for p in paces)


def against_others(paces: list[RankPace]) -> dict[int, float]:
    """rank -> its host's busy time a step over the other hosts' (on one host: its own over the other ranks'), as
    the straggler check compares them; a rank with no others to compare with has none."""
    groups, ratios, _ = compared(paces)
    return {p.rank: ratios[name] for name, group in groups.items() if name in ratios for p in group}


def clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


def two_readings(read, wait: float, sleep, clock) -> list[RankPace]:
    """Each rank's figures between two readings of the heartbeats `wait` seconds apart (kit jobs ID --ranks): read()
    gives (rank, host, t, steps, data_s, comm_s) a heartbeat."""
    pace = Pace(span=float("inf"))
    for first in (True, False):
        if not first:
            sleep(wait)
        now = clock()
        for rank, host, t, steps, data_s, comm_s in read():
            pace.add(rank, host, Sample(now, t, steps, data_s, comm_s))
    return pace.ranks(clock())
