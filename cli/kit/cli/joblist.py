"""`kit jobs`, `kit stop`: every back end's jobs, and stopping one where its back end runs it (kit.cli.backends)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from kit.cli import backends
from kit.cli.common import CONFIG, NAME, app, console, need_state, reports_errors, where
from kit.jobs.model import check_job_ref


@app.command("jobs", short_help="The jobs: running, ended, and how each ended")
@reports_errors
def jobs_(
    as_json: bool = typer.Option(False, "--json", help="One JSON object a job."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """The cluster's jobs, as their folders on the primary record them: running, ended, stopped or lost; and the jobs
    kit submitted to Slurm or Kubernetes, in the state the scheduler gives them."""
    at = where(name, config)
    listed = False
    for b in backends.in_turn():
        found = b.rows(at)
        listed = listed or bool(found)
        if as_json:
            for row in found:
                print(json.dumps({"on": b.name, **row}))
        elif found:
            b.show(found)
    if not listed:
        state = need_state(at.cfg, at.identity, at.state)  # (none recorded, and no job anywhere: how to make one)
        if not as_json:
            console.print(f"no jobs on cluster {state.cluster} yet: `kit run train.py` starts one")


JOB = typer.Argument(..., help="The job: its id, a unique start of it, its last 4 characters, or last (the newest); "
                     "`kit jobs` lists them.")


@app.command(short_help="Stop a running job everywhere")
@reports_errors
def stop(
    job: str = JOB,
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Stop a running job on every host: its launcher first, as Ctrl-C does, then whatever is left of it. A Slurm
    job: scancel, and kit waits until Slurm says it ended. A Kubernetes job: its objects are deleted."""
    ref = check_job_ref(job)
    at = where(name, config)
    b, found = backends.find(ref, at)
    console.print(b.stop(found, at))
