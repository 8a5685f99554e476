"""`kit logs`, `kit attach`, `kit stacks`: what a job printed, following it to its end, its ranks' stacks; each from
the back end that runs the job (kit.cli.backends)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kit.errors import BadInput
from kit.cli import backends
from kit.cli.common import CONFIG, NAME, app, reports_errors, where
from kit.cli.joblist import JOB
from kit.jobs.model import check_job_ref


@app.command(short_help="A job's output (-f follows it)")
@reports_errors
def logs(
    job: Optional[str] = typer.Argument(None, help="The job: its id, a unique start of it, its last 4 characters, or "
                                        "last (the default)."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Only this rank's lines."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing while the job runs."),
    tail: Optional[int] = typer.Option(None, "--tail", "-n", help="Only the last N lines (with -f: then what comes)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Output of a job, kept on the primary (or, for a Slurm job, in its folder on the login host; for a Kubernetes
    job, its pods'); per rank with --rank."""
    ref = check_job_ref(job or "last")
    if tail is not None and tail < 0:
        raise BadInput(f"--tail: {tail} is below 0", hint="give the number of lines to show, e.g. --tail 50")
    at = where(name, config)
    b, found = backends.find(ref, at)
    b.logs(found, at, rank, follow, tail)


@app.command(short_help="Follow a running job to its end, as kit run does")
@reports_errors
def attach(
    job: str = JOB,
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Follow a job to its end as `kit run` does: its output from the start, how it ended, its exit code. Ctrl-C
    stops it on every host (`kit logs ID -f` follows without that)."""
    _one(job, name, config, "attach")


@app.command(short_help="Every rank's Python stack, now")
@reports_errors
def stacks(
    job: str = JOB,
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Every rank's Python stack now (py-spy dump in each host's container): where a slow or stuck job is."""
    _one(job, name, config, "stacks")


def _one(job: str, name: Optional[str], config: Optional[Path], command: str) -> None:
    """kit attach, kit stacks: where the back end of the job has them."""
    ref = check_job_ref(job)
    at = where(name, config)
    b, found = backends.find(ref, at)
    backends.needs(b, command, ref)
    getattr(b, command)(found, at)
