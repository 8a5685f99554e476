"""`kit jobs`, `kit stop`: the cluster's jobs and stopping one; the job a command names (kit.cli.joblogs' too)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from kit.cluster import state as st
from kit.cluster.steps.preflight import recorded_nodes
from kit.backends.cluster import control as jobcontrol
from kit.backends.cluster import records as jobrecords
from kit.backends.k8s import jobs as k8sjobs
from kit.backends.slurm import jobs as slurmjobs
from kit.shown import visible
from kit.cli.common import CONFIG, NAME, app, connector, console, need_state, recorded, reports_errors
from kit.cli import k8s as k8s_cli, slurm as slurm_cli


@app.command("jobs", short_help="The jobs: running, ended, and how each ended")
@reports_errors
def jobs_(
    as_json: bool = typer.Option(False, "--json", help="One JSON object a job."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """The cluster's jobs, as their folders on the primary record them: running, ended, stopped or lost; and the jobs
    kit submitted to Slurm or Kubernetes, in the state the scheduler gives them."""
    cfg, identity, state = recorded(name, config)
    scheduled = False
    for on, found, table_of in (("slurm", slurm_cli.rows(cfg.connect_timeout), slurm_cli.table),
                                ("k8s", k8s_cli.rows(), k8s_cli.table)):
        if found:
            scheduled = True
            if as_json:
                for row in found:
                    print(json.dumps({"on": on, **row}))
            else:
                console.print(table_of(found))
    if scheduled and state is None:
        return
    state = need_state(cfg, identity, state)
    (node,) = recorded_nodes([state.primary], connector(cfg.connect_timeout))
    try:
        records = jobrecords.read_records(node)
    finally:
        node.runner.close()
    now = time.time()
    rows = [dict(id=r.id, launcher=r.launcher, np=len(r.hosts), hosts=sorted(set(r.hosts)), state=r.state,
                 started=r.started, seconds=r.seconds(now), exit=r.exit_code, restarts=r.restarts,
                 left_out=list(r.left_out), hang=r.hang, environment=r.environment)
            for r in records]
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    if not rows:
        console.print(f"no jobs on cluster {state.cluster} yet: `kit run train.py` starts one")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("job", "launcher", "np", "hosts", "state", "started", "duration", "exit", "restarts"):
        table.add_column(column)
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["started"])) if row["started"] else "?"
        restarts = str(row["restarts"] or "") + (f" (left out {' '.join(row['left_out'])})" if row["left_out"] else "")
        table.add_row(escape(row["id"]), escape(row["launcher"]), str(row["np"]), escape(" ".join(row["hosts"])),
                      escape(row["state"]) + (" (hung)" if row["hang"] and row["state"] == "failed" else ""), started,
                      _duration(row["seconds"]),
                      "" if row["exit"] is None else str(row["exit"]), escape(restarts))
    console.print(table)
    for row in rows:
        if row["hang"]:
            console.print(f"{escape(row['id'])} hung: {escape(visible(row['hang'], one_line=True))}", highlight=False)


@contextlib.contextmanager
def the_job(job: str, name: Optional[str], config: Optional[Path]):
    """(the cluster's state, a node a host (the primary first), the job's record), the nodes closed afterwards."""
    jobrecords.check_job_ref(job)
    cfg, identity, state = recorded(name, config)
    state = need_state(cfg, identity, state)
    nodes = recorded_nodes(state.hosts, connector(cfg.connect_timeout))
    try:
        records = {r.id: r for r in jobrecords.read_records(nodes[0], job)}
        yield state, nodes, records[jobrecords.resolve_job(job, list(records), state.cluster)]
    finally:
        for n in nodes:
            n.runner.close()


def slurm_job(ref: str, state: st.ClusterState | None) -> slurmjobs.SlurmRecord | None:
    """The Slurm job a reference names: by its id or Slurm id; `last`, the newest, when no cluster is up here."""
    return None if ref == "last" and state is not None else slurmjobs.resolve(ref)


def k8s_job(ref: str, state: st.ClusterState | None) -> k8sjobs.K8sRecord | None:
    """The Kubernetes job a reference names, as slurm_job."""
    return None if ref == "last" and state is not None else k8sjobs.resolve(ref)


JOB = typer.Argument(..., help="The job: its id, a unique start of it, its last 4 characters, or last (the newest); "
                     "`kit jobs` lists them.")


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@app.command(short_help="Stop a running job everywhere")
@reports_errors
def stop(
    job: str = JOB,
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Stop a running job on every host: its launcher first, as Ctrl-C does, then whatever is left of it. A Slurm
    job: scancel, and kit waits until Slurm says it ended. A Kubernetes job: its objects are deleted."""
    jobrecords.check_job_ref(job)
    cfg, _, state = recorded(name, config)
    if slurm_record := slurm_job(job, state):
        console.print(slurm_cli.stop(slurm_record, cfg.connect_timeout))
        return
    if k8s_record := k8s_job(job, state):
        console.print(k8s_cli.stop(k8s_record))
        return
    with the_job(job, name, config) as (state, nodes, record):
        job = record.id
        if record.state not in jobrecords.ACTIVE:
            console.print(f"job {job} is not running ({record.state}); nothing to stop")
            return
        done = jobcontrol.stop(nodes, record.id)
    killed = ", ".join(f"{c} on {h}" for h, c in done.killed.items())
    how = "its launcher stopped its ranks" if done.ended_by_itself else \
        f"its launcher did not end within {jobcontrol.STOP_WAIT_S} s"
    console.print(f"[green]✓[/] job {job} stopped on every host: {how}; "
                  + (f"processes kit had to kill: {killed}" if killed else "nothing was left to kill"))

