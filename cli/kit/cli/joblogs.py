"""`kit logs`, `kit attach`, `kit stacks`: what a job printed, following it to its end, its ranks' stacks; each from
the back end that runs the job (kit.cli.backends)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import typer

from kit.errors import BadInput
from kit.cli import backends
from kit.cli.common import CONFIG, NAME, app, reports_errors, where
from kit.cli.joblist import JOB, RANKS_WAIT_S, live_ranks

RANKS_EVERY_MIN_S = 2 * RANKS_WAIT_S  # a table is read over RANKS_WAIT_S: not more often than every other such span
RANKS = typer.Option(None, "--ranks", metavar="SECONDS", help="While following: every SECONDS, the ranks' table of "
                     "`kit jobs ID --ranks` (their pace, and how each host compares with the others).")
from kit.jobs.model import check_job_ref


@app.command(short_help="A job's output (-f follows it)")
@reports_errors
def logs(
    job: Optional[str] = typer.Argument(None, help="The job: its id, a unique start of it, its last 4 characters, or "
                                        "last (the default)."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Only this rank's lines."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing while the job runs."),
    tail: Optional[int] = typer.Option(None, "--tail", "-n", help="Only the last N lines (with -f: then what comes)."),
    ranks: Optional[float] = RANKS,
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Output of a job, kept on the primary (or, for a Slurm job, in its folder on the login host; for a Kubernetes
    job, its pods'); per rank with --rank."""
    ref = check_job_ref(job or "last")
    if tail is not None and tail < 0:
        raise BadInput(f"--tail: {tail} is below 0", hint="give the number of lines to show, e.g. --tail 50")
    if ranks is not None and not follow:
        raise BadInput("--ranks: the ranks' table is shown while kit follows the job",
                       hint="give -f with it, or use `kit jobs ID --ranks` for the table once")
    every = _every(ranks)
    at = where(name, config)
    b, found = backends.find(ref, at)
    with _live(b, found, at, ref, every):
        b.logs(found, at, rank, follow, tail)


@app.command(short_help="Follow a running job to its end, as kit run does")
@reports_errors
def attach(
    job: str = JOB,
    ranks: Optional[float] = RANKS,
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Follow a job to its end as `kit run` does: its output from the start, how it ended, its exit code. Ctrl-C
    stops it on every host (`kit logs ID -f` follows without that)."""
    _one(job, name, config, "attach", _every(ranks))


@app.command(short_help="Every rank's Python stack, now")
@reports_errors
def stacks(
    job: str = JOB,
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Every rank's Python stack now (py-spy dump in each host's container): where a slow or stuck job is."""
    _one(job, name, config, "stacks")


def _every(ranks: Optional[float]) -> float:
    """--ranks SECONDS: how often the ranks' table is shown (0 or none: never)."""
    if ranks is not None and not (ranks == 0 or RANKS_EVERY_MIN_S <= ranks <= 86400):
        raise BadInput(f"--ranks: {ranks:g} s is not from {RANKS_EVERY_MIN_S:.0f} s to a day",
                       hint="give how often to show the ranks' table, e.g. --ranks 60")
    return ranks or 0.0


def _live(b, found, at, ref: str, every: float):
    """While following a job: its ranks' table every `every` seconds (0: none), where its back end reads them."""
    if not every:
        return contextlib.nullcontext()
    backends.needs(b, "ranks", ref)
    return live_ranks(b, found, at, every)


def _one(job: str, name: Optional[str], config: Optional[Path], command: str, every: float = 0.0) -> None:
    """kit attach, kit stacks: where the back end of the job has them (kit attach: with the ranks' table every
    `every` seconds)."""
    ref = check_job_ref(job)
    at = where(name, config)
    b, found = backends.find(ref, at)
    backends.needs(b, command, ref)
    with _live(b, found, at, ref, every):
        getattr(b, command)(found, at)
