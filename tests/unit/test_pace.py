"""Each rank's pace from its heartbeats' counters, and the host whose ranks hold the others back (kit.jobs.pace):
the span each figure is over, the medians, the factor, the window a host must stay slow, a job on one host, and a
rank that starts again."""

from __future__ import annotations

from kit.jobs.pace import Pace, Sample, against_others, ranges

HOSTS = {"h1": (0, 1), "h2": (2, 3), "h3": (4, 5)}


def run(pace: Pace, until: float, busy, data=lambda host, now: 0.0, every: float = 5.0, step_s: float = 1.0,
        start: float = 0.0, counters=None) -> list:
    """Ranks that step together (each step `step_s`, synchronous: the others wait in collectives for the slowest),
    each host's ranks busy `busy(host, now)` of a step, waiting for data `data(host, now)` of it; a heartbeat every
    `every` seconds. What the pace names at each look, in order."""
    counters = counters if counters is not None else {}
    named, now = [], start
    while now <= until:
        for host, ranks in HOSTS.items():
            for rank in ranks:
                t, steps, d, c = counters.get(rank, (0.0, 0, 0.0, 0.0))
                b = busy(host, now)
                counters[rank] = (t + every, steps + int(every / step_s), d + every * data(host, now),
                                  c + every * (1 - b))
                t, steps, d, c = counters[rank]
                pace.add(rank, host, Sample(now, t, steps, d, c))
        named += [(now, s.text()) for s in pace.look(now)]
        now += every
    return named


def test_a_host_slow_for_the_window_is_named_once_with_what_its_ranks_wait_for():
    """h3's ranks are busy 0.95 of a step from t=60 s (their data loader starves: 0.7 of it), the others 0.5: h3 is
    1.9 times slower, named once it has been so for two minutes (and the span's 30 s have caught up), then never
    again."""
    pace = Pace()
    named = run(pace, 600, lambda h, now: 0.95 if h == "h3" and now >= 60 else 0.5,
                lambda h, now: 0.7 if h == "h3" and now >= 60 else 0.05)
    assert len(named) == 1, named
    when, text = named[0]
    assert 180 <= when <= 240, when
    assert text == "straggler: host h3 (ranks 4-5) 1.9x slower than the others for 2 min; its ranks wait for data " \
                   "70% of the time"
    table = {p.rank: p for p in pace.ranks(600)}
    assert table[4].steps_per_s == table[0].steps_per_s == 1.0  # the same rate: synchronous steps name nobody
    assert round(table[4].comm, 2) == 0.05 and round(table[0].comm, 2) == 0.5 and round(table[4].data, 2) == 0.7


def test_no_host_is_named_when_all_are_alike_or_one_is_less_than_the_factor_slower():
    assert run(Pace(), 900, lambda h, now: 0.5 + 0.05 * (hash((h, now)) % 3)) == []   # noise of 10%
    assert run(Pace(), 900, lambda h, now: 0.7 if h == "h2" else 0.5) == []          # 1.4x: below 1.5x
    assert run(Pace(factor=1.3), 900, lambda h, now: 0.7 if h == "h2" else 0.5) != []


def test_a_host_slow_for_less_than_the_window_is_not_named_and_its_time_starts_again():
    """Slow 90 s, then well, then slow 90 s again: never two minutes in a row."""
    slow = lambda h, now: 0.95 if h == "h1" and (60 <= now < 150 or 300 <= now < 390) else 0.5  # noqa: E731
    assert run(Pace(), 600, slow) == []


def test_a_job_on_one_host_names_its_slow_rank():
    pace = Pace()
    counters: dict = {}
    named, now = [], 0.0
    while now <= 400:
        for rank in range(4):
            t, steps, c = counters.get(rank, (0.0, 0, 0.0))
            busy = 0.9 if rank == 2 else 0.4
            counters[rank] = (t + 5, steps + 5, c + 5 * (1 - busy))
            pace.add(rank, "h1", Sample(now, *counters[rank][:2], 0.0, counters[rank][2]))
        named += [s.text() for s in pace.look(now)]
        now += 5
    assert named == ["straggler: rank 2 on h1 2.2x slower than the others for 2 min; it computes 90% of the time"]


def test_a_rank_that_starts_again_starts_its_figures_anew_and_is_not_slow_for_it():
    """A restart: the ranks' counters start again from 0 (and their clock): no step goes back, no negative time,
    and the time a host was slow starts again too."""
    pace = Pace()
    counters: dict = {}
    slow = lambda h, now: 0.95 if h == "h3" else 0.5  # noqa: E731
    assert run(pace, 100, slow, counters=counters) == []  # slow 100 s: not yet two minutes
    counters.clear()  # the job starts again
    assert run(pace, 200, slow, start=105, counters=counters) == []  # 95 s since the restart: not yet
    assert all(p.step_s > 0 and p.busy_s >= 0 for p in pace.ranks(200))
    assert [text for _, text in run(pace, 400, slow, start=205, counters=counters)] == [
        "straggler: host h3 (ranks 4-5) 1.9x slower than the others for 2 min; its ranks compute 95% of the time"]


def test_a_short_window_is_read_more_often_and_its_figures_span_no_more_than_it():
    """The default window is looked at every 30 s (the hang watch's own period), over the last 30 s; a window of
    10 s four times in it, over those 10 s, so that a host slowed at 60 s is named about a window later, not once
    30 s of figures have caught up; a job with no window is never read for its pace."""
    assert (Pace().every, Pace().span) == (30.0, 30.0)
    assert (Pace(window=10).every, Pace(window=10).span) == (2.5, 10.0)
    assert Pace(window=2).every == 1.0 and Pace(window=600).every == 30.0 and Pace(window=0).every == float("inf")
    slow = lambda h, now: 0.95 if h == "h3" and now >= 60 else 0.5  # noqa: E731
    named = run(Pace(window=10), 200, slow, every=2.5)
    assert len(named) == 1 and 70 <= named[0][0] <= 80, named
    wide = Pace(window=10)
    wide.span = 30.0  # (as before the span was bound by the window: named 10 s later or more)
    assert run(wide, 200, slow, every=2.5)[0][0] >= named[0][0] + 10


def test_without_the_collectives_waits_nobody_is_slow():
    """A script that marks no wait: every busy time is the step time, the same for every rank, and no rank is
    compared with the others (a DDP job, whose wait is inside backward())."""
    pace = Pace()
    assert run(pace, 600, lambda h, now: 1.0) == []
    assert pace.ranks(600) and against_others(pace.ranks(600)) == {}


def test_ranges():
    assert ranges([0, 1, 2, 5]) == "0-2, 5" and ranges((7,)) == "7" and ranges([4, 5]) == "4-5"


MARKED = """import time
import kit_pace
import horovod.torch.mpi_ops as ops
from horovod.torch import optimizer
def batches():
    for i in range(6):
        time.sleep(0.1)              # the loader
        yield i
for batch in kit_pace.data(batches()):
    time.sleep(0.05)                 # compute
    with kit_pace.comm():
        time.sleep(0.02)             # a wait kit cannot see, marked
    kit_pace.step()
    optimizer.synchronize(batch)     # Horovod's wait for the step's allreduce, as its optimizer names it
time.sleep(1.0)                      # a heartbeat written after the last step
print("steps done", flush=True)
time.sleep(3)                        # (its heartbeat is read meanwhile: the launcher removes it as the script ends)
"""
# Horovod's layout where the waiting is: mpi_ops.synchronize, which its optimizer imports by name.
OPS = "import time\ndef synchronize(handle):\n    time.sleep(0.03)\n    return handle\n"
OPTIMIZER = "from horovod.torch.mpi_ops import synchronize\n"


def test_the_rank_launcher_counts_the_steps_and_waits_the_script_marks_and_horovods_own(tmp_path):
    """A real rank launcher runs a script that marks its steps and its loader (kit_pace) and waits in Horovod's
    synchronize (a stand-in module of Horovod's layout: its optimizer imports synchronize by name): its heartbeat
    carries the counters, on the rank's clock, and parse_beats reads them."""
    import json
    import subprocess
    import sys

    from kit.backends.cluster.supervisor.heartbeats import parse_beats
    from kit.jobs.commands.horovod import rank_launcher
    for rel, text in (("horovod/__init__.py", ""), ("horovod/torch/__init__.py", ""),
                      ("horovod/torch/mpi_ops.py", OPS), ("horovod/torch/optimizer.py", OPTIMIZER)):
        (tmp_path / "lib" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "lib" / rel).write_text(text)
    (tmp_path / "launcher.py").write_text(rank_launcher(env_dir=str(tmp_path / "env"), every=0.5, look=0.1))
    (tmp_path / "train.py").write_text(MARKED)
    env = {"PATH": "/usr/bin:/bin", "KIT_JOB": "20261129-120000-abcd", "HOROVOD_RANK": "0",
           "KIT_PROGRESS_DIR": str(tmp_path / "progress"), "PYTHONPATH": str(tmp_path / "lib")}
    beat_file = tmp_path / "progress" / "20261129-120000-abcd" / "0"
    proc = subprocess.Popen([sys.executable, "launcher.py", "train.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "steps done\n"
        raw = json.loads(beat_file.read_text())
    finally:
        proc.wait(timeout=30)
    assert raw["steps"] == 6
    assert 0.55 <= raw["data_s"] < 1.2, raw           # 6 x 0.1 s in the loader
    assert 6 * (0.02 + 0.03) - 0.01 <= raw["comm_s"] < 0.8, raw  # marked, and Horovod's synchronize
    (beat,) = parse_beats("h1", json.dumps(raw))
    assert (beat.steps, beat.data_s, beat.comm_s, beat.t) == (6, raw["data_s"], raw["comm_s"], raw["t"])
    # A heartbeat with no pace, or with figures that are none, is a heartbeat all the same (for the hang watch)
    (old,) = parse_beats("h1", json.dumps(dict(rank=0, moves=3, where="x")))
    (bad,) = parse_beats("h1", json.dumps(dict(rank=0, moves=3, where="x", t="nan", steps=1, data_s=0, comm_s=0)))
    assert old.t is None and bad.t is None and bad.moves == 3


LONG_WAIT = """import time
import kit_pace
with kit_pace.comm():
    print("waiting", flush=True)
    time.sleep(3)                    # one wait, longer than a heartbeat's period
print("done", flush=True)
time.sleep(2)
"""


def test_a_heartbeat_counts_the_wait_going_on_so_far(tmp_path):
    """A wait is counted as it goes, not only once it ended: a heartbeat written 2 s into a 3 s wait says about 2 s
    (else a reading taken then, and one after the wait, would give the whole wait to the span between them, more
    than its length, and a rank that waits for a slow one would seem to compute nothing)."""
    import json
    import subprocess
    import sys
    import time

    from kit.jobs.commands.horovod import rank_launcher
    (tmp_path / "launcher.py").write_text(rank_launcher(env_dir=str(tmp_path / "env"), every=0.5, look=0.1))
    (tmp_path / "train.py").write_text(LONG_WAIT)
    env = {"PATH": "/usr/bin:/bin", "KIT_JOB": "20261129-120000-abcd", "HOROVOD_RANK": "0",
           "KIT_PROGRESS_DIR": str(tmp_path / "progress")}
    beat_file = tmp_path / "progress" / "20261129-120000-abcd" / "0"
    proc = subprocess.Popen([sys.executable, "launcher.py", "train.py"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "waiting\n"
        time.sleep(2.2)
        during = json.loads(beat_file.read_text())
        assert proc.stdout.readline() == "done\n"
        time.sleep(1.0)
        after = json.loads(beat_file.read_text())
    finally:
        proc.wait(timeout=30)
    assert 1.0 <= during["comm_s"] <= 2.6, during
    assert 2.9 <= after["comm_s"] < 3.5 and after["comm_s"] - during["comm_s"] <= after["t"] - during["t"], (during,
                                                                                                           after)


def test_two_readings_give_each_ranks_figures_between_them_and_each_host_against_the_others():
    """kit jobs ID --ranks: two readings 10 s apart; h3's ranks busy 0.9 s a step and h1's and h2's 0.45: h3 is 2x
    the others, the others 0.5x of theirs (the median of h2's and h3's, 0.675, is 1.5x h1's: not named)."""
    from kit.jobs.pace import against_others, two_readings
    readings = iter([
        [(r, h, 100.0, 10, 1.0, 5.0) for h, ranks in HOSTS.items() for r in ranks],
        [(r, h, 110.0, 20, 1.0 + (7.0 if h == "h3" else 0.5), 5.0 + (1.0 if h == "h3" else 5.5))
         for h, ranks in HOSTS.items() for r in ranks],
    ])
    slept, clock = [], iter([0.0, 10.0, 10.0])
    paces = two_readings(lambda: next(readings), 10.0, slept.append, lambda: next(clock))
    assert slept == [10.0]
    by_rank = {p.rank: p for p in paces}
    assert sorted(by_rank) == [0, 1, 2, 3, 4, 5]
    assert by_rank[4].steps == 20 and abs(by_rank[4].steps_per_s - 1.0) < 1e-9
    assert abs(by_rank[4].busy_s - 0.9) < 1e-9 and abs(by_rank[0].busy_s - 0.45) < 1e-9
    assert abs(by_rank[4].data - 0.7) < 1e-9 and abs(by_rank[4].comm - 0.1) < 1e-9
    against = against_others(paces)
    assert abs(against[4] - 2.0) < 1e-9 and against[4] == against[5]
    assert abs(against[0] - 0.45 / 0.675) < 1e-9


def test_a_rank_with_no_step_between_the_readings_has_no_figure_and_one_host_compares_rank_by_rank():
    from kit.jobs.pace import against_others, two_readings
    readings = iter([[(0, "a", 1.0, 5, 0, 0), (1, "a", 1.0, 5, 0, 0), (2, "a", 1.0, 5, 0, 0)],
                     [(0, "a", 11.0, 15, 0, 4.0), (1, "a", 11.0, 15, 0, 4.0), (2, "a", 11.0, 5, 0, 0)]])
    paces = two_readings(lambda: next(readings), 10.0, lambda s: None, iter([0.0, 10.0, 10.0]).__next__)
    assert [p.rank for p in paces] == [0, 1]   # rank 2 made no step: no figure
    assert against_others(paces) == {0: 1.0, 1: 1.0}
    assert against_others(paces[:1]) == {}     # no other to compare with
