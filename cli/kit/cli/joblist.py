"""`kit jobs`, `kit stop`: every back end's jobs, and stopping one where its back end runs it (kit.cli.backends)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kit.cli import backends
from kit.cli.common import CONFIG, NAME, app, console, need_state, reports_errors, where
from kit.errors import BadInput, KitError
from kit.jobs import pace
from kit.jobs.model import check_job_ref


RANKS_WAIT_S = 10.0  # --ranks: the heartbeats (written every 2 s) are read twice, this far apart


@app.command("jobs", short_help="The jobs, how each ended; --ranks: a job's ranks now")
@reports_errors
def jobs_(
    job: Optional[str] = typer.Argument(None, help="With --ranks: the job (its id, a unique start of it, its last 4 "
                                        "characters, or last: the default)."),
    ranks: bool = typer.Option(False, "--ranks", help="A running job's ranks now: step, steps/s, time a step "
                               "outside collectives, share of time waiting for data and in collectives, and how "
                               "each host compares with the others (read over 10 s)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object a job (with --ranks: a rank)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """The cluster's jobs, as their folders on the primary record them: running, ended, stopped or lost; and the jobs
    kit submitted to Slurm or Kubernetes, in the state the scheduler gives them. With --ranks, one running job's ranks
    (docs/jobs.md, Slow ranks)."""
    if job is not None and not ranks:
        raise BadInput(f"kit jobs {job}: a job is named only with --ranks",
                       hint=f"`kit jobs` lists every job; `kit jobs {job} --ranks` shows that job's ranks")
    at = where(name, config)
    if ranks:
        ref = check_job_ref(job or "last")
        b, found = backends.find(ref, at)
        backends.needs(b, "ranks", ref)
        show_ranks(*measure_ranks(b, found, at), as_json)
        return
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


def measure_ranks(b, found, at, sleep: Callable[[float], None] = time.sleep) -> tuple[str, list[pace.RankPace]]:
    """(the job's id, each rank's pace over RANKS_WAIT_S), from the back end that runs it."""
    return b.ranks(found, at, lambda read: pace.two_readings(
        lambda: [(x.rank, x.host, x.t, x.steps, x.data_s, x.comm_s) for x in read() if x.t is not None],
        RANKS_WAIT_S, sleep, time.monotonic))


@contextlib.contextmanager
def live_ranks(b, found, at, every: float) -> Iterator[None]:
    """While the body follows a job's output (kit attach, kit logs -f): its ranks' table every `every` seconds, from
    a thread of its own; it ends with the body, or when the job no longer runs (quietly), or at kit's first failure
    to read the heartbeats (said once)."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every):
            try:
                job_id, paces = measure_ranks(b, found, at, sleep=done.wait)
            except BadInput:
                return  # (the job ended meanwhile: its end follows in the output)
            except KitError as e:
                console.print(f"[yellow]warning[/] kit stops showing the ranks' pace: {escape(str(e))}",
                              highlight=False)
                return
            if not done.is_set():
                show_ranks(job_id, paces)

    thread = threading.Thread(target=loop, name="kit-ranks", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def show_ranks(job_id: str, paces: list[pace.RankPace], as_json: bool = False) -> None:
    """The table of `kit jobs ID --ranks`: a row a rank; `vs others` is its host's time a step outside collectives
    over the other hosts' (on one host: the rank's over the other ranks'), as kit's straggler check compares them."""
    against = pace.against_others(paces)
    if as_json:
        for p in paces:
            print(json.dumps(dict(rank=p.rank, host=p.host, step=p.steps, steps_per_s=round(p.steps_per_s, 4),
                                  busy_s=round(p.busy_s, 6), data=round(p.data, 4), comm=round(p.comm, 4),
                                  vs_others=round(against[p.rank], 3) if p.rank in against else None)))
        return
    if not paces:
        console.print(f"no rank of job {job_id} made a step in the last {RANKS_WAIT_S:.0f} s that kit could see: "
                      "kit counts a script's steps where it marks them (import kit_pace; kit_pace.step() after each "
                      "step: docs/jobs.md, Slow ranks)")
        return
    table = Table(box=None, pad_edge=False, title=f"job {job_id}: its ranks over {RANKS_WAIT_S:.0f} s",
                  title_justify="left")
    for column in ("rank", "host", "step", "steps/s", "busy s/step", "waits for data", "waits in collectives",
                   "vs others"):
        table.add_column(column, justify="left" if column == "host" else "right")
    for p in paces:
        ratio = against.get(p.rank)
        shown = "" if ratio is None else f"{ratio:.2f}x"
        table.add_row(str(p.rank), escape(p.host), str(p.steps), f"{p.steps_per_s:.2f}", f"{p.busy_s:.3f}",
                      f"{p.data:.0%}", f"{p.comm:.0%}",
                      f"[bold red]{shown}[/]" if ratio is not None and ratio >= pace.FACTOR else shown)
    console.print(table)
    if not pace.counted(paces):
        console.print("no wait in collectives is counted for these ranks, so none can be told from the others (`vs "
                      "others`, and kit's straggler check): Horovod's are counted by themselves; mark a wait kit "
                      "cannot see with `with kit_pace.comm():` (docs/jobs.md, Slow ranks)", highlight=False)


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
