"""kit's hang watch over a Slurm job (kit.backends.slurm.watch), on this machine's shell as the login host's: the
ranks' heartbeats read from the job's folder, the stuck rank named with its node, every rank's stack asked for and
kept beside the job's output. Real rank launchers write the heartbeats and answer SIGUSR2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kit.backends.slurm import watch as slurmwatch
from kit.backends.slurm.output import Reader
from kit.jobs.commands.horovod import rank_launcher
from kit.runners.local import LocalRunner

JOB, SLURM_ID = "20261129-090000-abcd", "42"


def reader(ranks: int = 3) -> Reader:
    r = Reader("horovod", ranks, lambda *a: None)
    r.feed("@@kit-nodes n1=10.0.0.1 n2=10.0.0.2 n3=10.0.0.3")
    return r


def beat(folder: Path, rank: int, moves: int, where: str) -> None:
    """A heartbeat, written as the rank launcher writes it: a new file put in the old one's place."""
    progress = Path(slurmwatch.progress_dir(str(folder), SLURM_ID, JOB))
    progress.mkdir(parents=True, exist_ok=True)
    (progress / f"{rank}.new").write_text(json.dumps(dict(rank=rank, pid=1, moves=moves, where=where)))
    (progress / f"{rank}.new").replace(progress / str(rank))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_rank_at_another_line_is_named_with_its_node_once_no_rank_moved_for_the_timeout(tmp_path):
    clock = Clock()
    watch = slurmwatch.SlurmWatch(LocalRunner("login"), str(tmp_path), SLURM_ID, JOB, reader(), 60, clock=clock)
    for rank in range(3):
        beat(tmp_path, rank, 5, "train.py:20 in step" if rank != 1 else "train.py:31 in broadcast_params")
    assert watch() is None  # the first reading: every rank is new, which is progress
    for step in range(1, 7):  # a reading every 10 s (the timeout's sixth)
        clock.now += 10
        if step == 3:
            beat(tmp_path, 0, 6, "train.py:20 in step")  # rank 0 moved by 30 s: the clock starts again
        assert watch() is None, step  # 60 s have not passed without progress
    clock.now += 20
    assert watch() is None  # 50 s
    clock.now += 10
    said = watch().hang
    assert said == ("no rank has made progress for 60 s: rank 1 on n2 is at train.py:31 in broadcast_params; the "
                    "other 2 ranks wait at train.py:20 in step")


def test_what_is_not_a_heartbeat_of_the_jobs_ranks_is_none(tmp_path):
    """A rank writes its file: one named for no rank, one that says another rank, a link, or no JSON is no beat."""
    progress = Path(slurmwatch.progress_dir(str(tmp_path), SLURM_ID, JOB))
    beat(tmp_path, 0, 1, "a.py:1 in f")
    (progress / "7").write_text(json.dumps(dict(rank=7, pid=1, moves=1, where="x")))   # the job has 3 ranks
    (progress / "2").write_text(json.dumps(dict(rank=0, pid=1, moves=9, where="x")))   # says it is rank 0
    (tmp_path / "elsewhere").write_text(json.dumps(dict(rank=1, pid=1, moves=1, where="x")))
    (progress / "1").symlink_to(tmp_path / "elsewhere")
    (progress / "0.stack").write_text("Thread 0x1 (most recent call first):\n")
    watch = slurmwatch.SlurmWatch(LocalRunner("login"), str(tmp_path), SLURM_ID, JOB, reader(), 60)
    mark = watch.mark
    text = LocalRunner("login").run(slurmwatch._each(watch.folder, "[0-9]*", mark, 2000), timeout=30).stdout
    assert [(b.host, b.rank, b.moves) for b in watch.beats(text)] == [("n1", 0, 1)]


def test_a_job_still_in_the_queue_is_not_watched_until_it_runs_and_its_start_has_more_time(tmp_path):
    """Until a first heartbeat, the ranks have START_GRACE_S more than the timeout: an image to import, Python to
    load from the shared filesystem."""
    clock = Clock()
    watch = slurmwatch.SlurmWatch(LocalRunner("login"), str(tmp_path), SLURM_ID, JOB, reader(2), 30, clock=clock)
    clock.now += 3600  # (the follow asks only while Slurm says the job runs: the clock starts at the first ask)
    assert watch() is None
    clock.now += 29
    assert watch() is None
    clock.now += 6
    assert watch() is None  # 35 s: more than the timeout, but no rank has written a heartbeat yet
    clock.now += slurmwatch.START_GRACE_S
    assert watch().hang == f"no rank has started in {35 + slurmwatch.START_GRACE_S} s"


def test_a_node_whose_ranks_went_silent_while_the_others_ended_is_lost_and_one_still_beating_is_not(tmp_path):
    """kitlab-h3's slurmd and tasks died: its rank's heartbeat stays as it was; the others fail on the lost peer and
    print their exit lines (srun its own). srun waits for the node until Slurm gives it up: kit's watch (of a job that
    may restart) names it once its rank has been silent SILENT_S. A rank that stands still in a collective writes its
    heartbeat all the same: never silent; and while no rank ended, a silent node is no lost one."""
    clock, r = Clock(), reader()
    watch = slurmwatch.SlurmWatch(LocalRunner("login"), str(tmp_path), SLURM_ID, JOB, r, 0, clock=clock,
                                  find_lost=True)
    for rank in range(3):
        beat(tmp_path, rank, 5, "train.py:20 in step")
    assert watch() is None
    for _ in range(4):  # 20 s: ranks 0 and 1 write their heartbeats (standing still), rank 2 none
        clock.now += slurmwatch.READ_EVERY_S
        for rank in (0, 1):
            beat(tmp_path, rank, 5, "train.py:20 in step")
        assert watch() is None  # no rank ended: a rank that writes no heartbeat alone is no lost node
    assert watch.silent_nodes() == {"n3": 20.0} and set(watch.silent()) == {2}
    r.feed("srun: error: n2: task 1: Exited with exit code 1")
    clock.now += slurmwatch.READ_EVERY_S
    beat(tmp_path, 0, 5, "train.py:20 in step")
    seen = watch()
    assert (seen.state, seen.lost) == ("lost", ("n3",)), seen
    # A read of the heartbeats that failed is no silence: only what kit read counts.
    watch2 = slurmwatch.SlurmWatch(LocalRunner("login"), str(tmp_path / "none"), SLURM_ID, JOB, reader(), 0,
                                   clock=clock, find_lost=True)
    assert watch2() is None and watch2.silent_nodes() == {}


def test_every_ranks_stack_is_taken_from_real_rank_launchers_and_kept_beside_the_output(tmp_path):
    """Three rank launchers run a script that waits in a function; SIGUSR2 (as scancel --signal=USR2 sends it) has
    each write its stack; kit keeps them in kit-ID-stacks/, a file a rank headed by its rank and node."""
    (tmp_path / "launcher.py").write_text(rank_launcher(env_dir=str(tmp_path / "env")))
    (tmp_path / "wait.py").write_text("import os, time\ndef waits_here():\n    time.sleep(120)\n"
                                      "child = os.fork()\nos.write(1, b'%s %d\\n' % (b'up' if child else b'child', os.getpid()))\n"
                                      "waits_here()\n")
    env = {**os.environ, "KIT_JOB": JOB, "KIT_PROGRESS_DIR": f".kit/job-{SLURM_ID}/progress"}
    ranks = [subprocess.Popen([sys.executable, "launcher.py", "wait.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                              text=True, env={**env, "HOROVOD_RANK": str(rank)}) for rank in range(3)]
    try:
        children = []
        for proc in ranks:  # each rank, and the process it forked (as a DataLoader forks its workers)
            said = dict(proc.stdout.readline().split() for _ in range(2))
            children.append(int(said["child"]))
        progress = Path(slurmwatch.progress_dir(str(tmp_path), SLURM_ID, JOB))
        deadline = time.monotonic() + 30
        while len(list(progress.glob("[0-9]"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # (each rank's first heartbeat)

        def usr2() -> None:  # (to every process of the job, as slurmstepd sends it)
            for pid in [proc.pid for proc in ranks] + children:
                os.kill(pid, signal.SIGUSR2)
        where, found = slurmwatch.take_stacks(LocalRunner("login"), str(tmp_path), SLURM_ID, JOB, reader(), [0, 1, 2],
                                              usr2)
        assert where == f"{tmp_path}/kit-{SLURM_ID}-stacks" and sorted(found) == [0, 1, 2]
        for rank, node in enumerate(("n1", "n2", "n3")):
            text = (Path(where) / f"rank-{rank}.txt").read_text()
            assert text.startswith(f"rank {rank} on {node}\n"), text
            assert 'wait.py", line 3 in waits_here' in text and "kit-heartbeat" not in text.split("\n")[0], text
        assert all(proc.poll() is None for proc in ranks)  # asked for their stacks, the ranks go on
        for child in children:  # and what they forked ignored it
            os.kill(child, 0)
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_rank_that_does_not_answer_is_said_so_in_its_file(tmp_path):
    """...and a link the job left at the stacks' folder's name is replaced, never followed."""
    beat(tmp_path, 0, 1, "a.py:1 in f")
    (tmp_path / "elsewhere").mkdir()
    Path(slurmwatch.stacks_dir(str(tmp_path), SLURM_ID)).symlink_to(tmp_path / "elsewhere")
    progress = Path(slurmwatch.progress_dir(str(tmp_path), SLURM_ID, JOB))
    (progress / "7.stack").write_text("made up\n")  # the job has 2 ranks
    slurmwatch.STACK_WAIT_S, saved = 1, slurmwatch.STACK_WAIT_S
    try:
        where, found = slurmwatch.take_stacks(LocalRunner("login"), str(tmp_path), SLURM_ID, JOB, reader(2), [0, 1],
                                              lambda: (progress / "0.stack").write_text("Thread 0x1:\n  File x\n"))
    finally:
        slurmwatch.STACK_WAIT_S = saved
    assert sorted(found) == [0]
    assert (Path(where) / "rank-1.txt").read_text() == \
        "rank 1 on n2\n(no stack: the rank did not answer SIGUSR2 within 1 s)\n"
    assert not Path(where).is_symlink() and list((tmp_path / "elsewhere").iterdir()) == []
    assert sorted(p.name for p in Path(where).iterdir()) == ["rank-0.txt", "rank-1.txt"]


def test_a_hung_job_is_said_hung_with_the_report_and_recorded_so(tmp_path, monkeypatch):
    from kit.backends.slurm import jobs as slurmjobs
    from kit.cli.backends import slurm as cli_slurm
    from kit.errors import KitError
    monkeypatch.setenv("KIT_HOME", str(tmp_path / "home"))
    record = slurmjobs.SlurmRecord(JOB, SLURM_ID, None, str(tmp_path), "horovod", "train.py", 3, 0.0,
                                   hang_timeout=60)
    hang = "no rank has made progress for 60 s: rank 1 on n2 is at t.py:3 in f; Slurm job 42 was cancelled (stopped)"
    ending = slurmjobs.Ending("failed", None, None, hang)
    try:
        cli_slurm.report(JOB, record, ending)
        raise AssertionError("a hung job is no success")
    except KitError as e:
        assert (str(e), e.exit_code) == (f"job {JOB} hung: {hang}", 1)
    cli_slurm._remember_end(record, ending)
    (found,) = slurmjobs.records()
    assert (found.ended, found.hang_timeout) == ({"state": "failed", "exit": None, "hang": hang}, 60)
