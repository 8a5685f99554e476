"""`kit run --on slurm --restarts N --min-np M` (kit.backends.slurm.restart): which nodes a job that failed is
submitted again without, and on how many nodes; the sbatch command line that does it, run by a real shell."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kit.backends.slurm import folder as slurmfolder
from kit.backends.slurm import jobs as slurmjobs
from kit.backends.slurm import restart
from kit.backends.slurm.sbatch import ENV_DIR
from kit.errors import KitError
from kit.runners.local import LocalRunner

NODES = ["n1", "n2", "n3"]
IDLE = {"n1": "idle", "n2": "idle", "n3": "idle"}


def test_sinfo_states_are_read_and_a_line_of_no_node_is_none():
    text = "n1 idle\nn2 down*\nn3 alloc\n\nbad node name here\n$(id) idle\nn4 drain\n"
    assert restart.parse_sinfo(text) == {"n1": "idle", "n2": "down*", "n3": "alloc", "n4": "drain"}
    assert [restart.unfit(s) for s in ("idle", "alloc", "mix", "idle~", "down*", "alloc*", "drain", "drng", "fail",
                                       "down")] == \
        [None, None, None, None] + ["Slurm says it is not responding"] * 2 + \
        ["Slurm says it is drain", "Slurm says it is drng", "Slurm says it is fail", "Slurm says it is down"]


def test_a_node_whose_ranks_went_silent_without_an_exit_line_is_left_out_and_the_job_asks_for_the_rest():
    """The third node's slurmd and tasks died: its rank wrote no heartbeat since, and printed no exit line (the others
    did, failing on the lost peer). Slurm does not know yet (not responding only after SlurmdTimeout)."""
    again = restart.plan(NODES, 1, 2, {"n3": 21.0}, {"n1", "n2"}, IDLE)
    assert again == restart.Again({"n3": "its ranks wrote no heartbeat for 21 s and left no exit line"}, 2, 2)
    assert again.options() == ("--nodes=2", "--exclude=n3")


def test_a_node_slurm_marks_unfit_is_left_out_and_a_node_that_ended_is_not_though_it_went_silent():
    again = restart.plan(NODES, 2, 2, {"n2": 30.0}, {"n1", "n2"}, {"n1": "idle", "n2": "idle", "n3": "down*",
                                                                   "n4": "idle", "n5": "drain"})
    assert again.left_out == {"n3": "Slurm says it is not responding"}
    assert (again.low, again.high) == (1, 3)  # n1, n2 and n4 answer: as many as it had, at least one (2 ranks each)
    assert again.options() == ("--nodes=1-3", "--exclude=n3")


def test_a_job_that_failed_on_nodes_that_all_answer_starts_again_on_as_many():
    again = restart.plan(NODES, 1, 3, {}, {"n1"}, IDLE)
    assert again == restart.Again({}, 3, 3) and again.options() == ("--nodes=3",)


def test_too_few_nodes_for_min_np_say_so():
    said = restart.plan(NODES, 1, 3, {"n3": 20.0}, {"n1", "n2"}, IDLE)
    assert said == ("2 node(s) answer (n1, n2) and --min-np 3 needs 3 (1 rank(s) a node); left out n3: its ranks "
                    "wrote no heartbeat for 20 s and left no exit line")
    # sinfo did not answer: the job's own nodes that were not left out are those that answer
    assert restart.plan(NODES, 1, 2, {"n3": 20.0}, set(), {}).options() == ("--nodes=2", "--exclude=n3")


def test_the_start_and_options_reach_sbatch_quoted(tmp_path, monkeypatch):
    """A real shell runs the command kit sends: a fake sbatch (first on PATH) prints what it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SEEN"\necho 77\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SEEN", str(tmp_path / "seen"))
    job = tmp_path / "job"
    job.mkdir()
    again = restart.Again({"n3": "x"}, 2, 2)
    assert slurmjobs.submit(LocalRunner("login"), str(job), [], again.options(), ("1",)) == "77"
    assert (tmp_path / "seen").read_text().splitlines() == ["--parsable", "--nodes=2", "--exclude=n3",
                                                            "kit-job.sbatch", "1"]


def test_the_variables_are_staged_again_0600_and_never_through_a_link(tmp_path):
    runner = LocalRunner("login")
    job = tmp_path / "job"
    job.mkdir()
    slurmfolder.stage_variables(runner, str(job), "20261129-000000-abcd", 1, {"TOKEN": "s3cret"})
    path = job / ENV_DIR / "20261129-000000-abcd.1"  # (the first start after the first: a file of its own)
    assert json.loads(path.read_text()) == {"TOKEN": "s3cret"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    # The job made its env folder a link to a folder others read: nothing is written there.
    other = tmp_path / "job2"
    (other / ".kit").mkdir(parents=True)
    public = tmp_path / "public"
    public.mkdir()
    (other / ENV_DIR).symlink_to(public)
    with pytest.raises(KitError, match="cannot write the job's variables"):
        slurmfolder.stage_variables(runner, str(other), "20261129-000000-abcd", 1, {"TOKEN": "s3cret"})
    assert list(public.iterdir()) == []
    (other / ENV_DIR).unlink()
    (other / ".kit").rmdir()
    Path(other / ".kit").symlink_to(public)
    with pytest.raises(KitError):
        slurmfolder.stage_variables(runner, str(other), "20261129-000000-abcd", 1, {"TOKEN": "s3cret"})
    assert list(public.iterdir()) == []
