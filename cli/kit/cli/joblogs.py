"""`kit logs`, `kit attach`, `kit stacks`: what a job printed, following it to its end, its ranks' stacks."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from kit.cluster.steps.preflight import recorded_nodes
from kit.backends.cluster import control as jobcontrol
from kit.backends.cluster import records as jobrecords
from kit.backends.cluster import run as jobs
from kit.jobs.commands.horovod import exit_report, split_rank
from kit.errors import BadInput
from kit.shown import visible
from kit.cli.common import CONFIG, NAME, app, connector, console, need_state, recorded, reports_errors
from kit.cli import k8s as k8s_cli, slurm as slurm_cli
from kit.cli.jobs import job_printer, report
from kit.cli.joblist import JOB, k8s_job, slurm_job, the_job


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
    ref = jobrecords.check_job_ref(job or "last")
    if tail is not None and tail < 0:
        raise BadInput(f"--tail: {tail} is below 0", hint="give the number of lines to show, e.g. --tail 50")
    cfg, identity, state = recorded(name, config)
    if record := slurm_job(ref, state):
        slurm_cli.logs(record, rank, follow, tail, cfg.connect_timeout, slurm_cli.printer(record.launcher))
        return
    if k8s_record := k8s_job(ref, state):
        k8s_cli.logs(k8s_record, rank, follow, tail)
        return
    state = need_state(cfg, identity, state)
    primary = state.primary
    (node,) = recorded_nodes([primary], connector(cfg.connect_timeout))
    try:
        records = {r.id: r for r in jobrecords.read_records(node, ref)}
        job = jobrecords.resolve_job(ref, list(records), state.cluster)
        shown = _LogLines(job_printer(records[job].launcher), list(records[job].hosts), rank, tail)
        folder = primary.place.job_dir(job)
        read = 0
        if not follow or tail is not None:  # what is there now; the last `tail` lines of it
            read = _read_lines(node, jobcontrol.log_command(primary.place.container, folder), shown)
            shown.flush()
        if follow:  # (a line being written when it was read is shown cut; the rest of it is not)
            node.runner.stream_out(jobcontrol.follow_command(primary.place.container, folder, job, first=read + 1),
                                   shown.add)
    finally:
        node.runner.close()


def _read_lines(node, cmd: str, shown: "_LogLines") -> int:
    count = 0

    def one(line: str) -> None:
        nonlocal count
        count += 1
        shown.add(line)
    node.runner.stream_out(cmd, one)
    return count


class _LogLines:
    """A job's output log read as `kit logs` shows it: kit's own marks left out, each rank's lines with its host, only
    one rank's with --rank; with --tail, held back until flush() and only the last N of them shown."""

    def __init__(self, printer, hosts: list[str], rank: Optional[int], tail: Optional[int]) -> None:
        self.printer, self.hosts, self.rank = printer, hosts, rank
        self.held: Optional[collections.deque] = collections.deque(maxlen=tail) if tail is not None else None

    def add(self, line: str) -> None:
        if line.startswith(jobcontrol.END_MARK):
            return
        if (launched := jobcontrol.launch_ranks(line)) is not None:  # a launch: the host of each of its ranks
            self.hosts = launched
            return
        r, text = split_rank(line)
        if (self.rank is None or r == self.rank) and exit_report(text) is None:
            host = self.hosts[r] if r is not None and r < len(self.hosts) else None
            if self.held is None:
                self.printer(r, host, text)
            else:
                self.held.append((r, host, text))

    def flush(self) -> None:
        while self.held:
            self.printer(*self.held.popleft())
        self.held = None



@app.command(short_help="Follow a running job to its end, as kit run does")
@reports_errors
def attach(
    job: str = JOB,
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Follow a job to its end as `kit run` does: its output from the start, how it ended, its exit code. Ctrl-C
    stops it on every host (`kit logs ID -f` follows without that)."""
    with the_job(job, name, config) as (state, nodes, record):
        job = record.id
        outcome = jobs.follow_to_end(nodes, job, list(record.hosts), job_printer(record.launcher))
    report(outcome, job, record.launcher, state)


@app.command(short_help="Every rank's Python stack, now")
@reports_errors
def stacks(
    job: str = JOB,
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Every rank's Python stack now (py-spy dump in each host's container): where a slow or stuck job is."""
    with the_job(job, name, config) as (state, nodes, record):
        job = record.id
        if record.state not in jobrecords.ACTIVE:
            raise BadInput(f"job {job} is not running ({record.state})",
                           hint=f"a hung job's stacks, taken when it was stopped, are in "
                                f"{state.primary.place.job_dir(job)}/stacks on {state.primary.name}")
        found = jobcontrol.stacks(nodes, job)
    if not found:
        console.print(f"no rank of job {job} is running a Python script now")
    for (host, rank), text in sorted(found.items(), key=lambda item: item[0][1]):
        console.print(f"[bold]rank {rank} on {escape(host)}[/]")
        console.print(visible(text), markup=False, highlight=False)
