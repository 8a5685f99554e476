"""`kit demo`: kit on this machine alone."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kit import shipped_folder
from kit.cluster import state as st
from kit.image.build import connect
from kit.cluster.lifecycle import down as down_cluster
from kit.config.settings import ClusterConfig, ConfigFile, build_config
from kit.backends.cluster import run as jobs
from kit.jobs.commands.horovod import HorovodOptions
from kit.errors import BadInput
from kit.cluster.identity import Identity
from kit.image.recipe import make_recipe
from kit.jobs.demo import SCRIPT as DEMO_SCRIPT, Training
from kit.cluster.lock import cluster_lock
from kit.cluster.local import LOCAL_NODES
from kit.cli.imagebuild import ensure_image
from kit.cli.cluster import bring_up
from kit.cluster.lifecycle import where_to_bring_up
from kit.cli.flavor import build_flavor
from kit.cli.common import CONFIG, LiveProgress, app, cluster_settings, connector, console, progress_bar, reports_errors
from kit.cli.backends.cluster import job_printer, run_job


@app.command(short_help="Try kit on this machine: a local cluster, a job")
@reports_errors
def demo(
    nodes: int = typer.Option(LOCAL_NODES, "--nodes", help="Containers of the local cluster."),
    epochs: int = typer.Option(3, help="Epochs of the CIFAR-10 example."),
    samples: int = typer.Option(6144, help="Training images of an epoch (0: all 50,000)."),
    keep: bool = typer.Option(False, help="Leave the cluster up afterwards, for kit run/status/exec --name demo."),
    config: Optional[Path] = CONFIG,
    name: str = typer.Option("demo", "--name", help="Cluster name."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the whole build log."),
) -> None:
    """Try kit on this machine: the image (built once), a local cluster of N containers, the CIFAR-10
    example trained across them, a summary, and the cluster taken down again."""
    cfg_file, cfg = cluster_settings(config, dict(name=name))
    build = build_config(cfg_file, {"flavor": build_flavor(cfg_file, cfg, None, None, local=True)})
    if build.framework != "horovod":
        raise BadInput(f"{cfg_file.where('build', 'flavor')}: kit demo trains its Horovod example, and flavor "
                       f"{build.flavor} has no Horovod", hint="run kit demo without that kit.yaml (or with flavor cpu); "
                       "on a cluster of the tf image, `kit run --launcher tf examples/tf_multiworker.py`")
    with cluster_lock(cfg.name):
        _demo(cfg_file, cfg, build, nodes, epochs, samples, keep, verbose)


def _demo(cfg_file: ConfigFile, cfg: ClusterConfig, build, nodes: int, epochs: int, samples: int, keep: bool,
          verbose: bool) -> None:
    identity = Identity(cfg.name)
    timings: list[tuple[str, float]] = []
    with _timed("image", timings):
        ensure_image(connect(), make_recipe(build), verbose)
    try:
        with _timed("up", timings):
            where = where_to_bring_up(st.load(identity.folder), cfg.name, False, True, nodes, nodes)
            bring_up(cfg_file, cfg, None, where.count, dry_run=False)
        state = st.load(identity.folder)
        training, show = Training(), job_printer("horovod")

        def on_line(rank: int | None, host: str | None, text: str) -> None:
            training.feed(rank, text)
            show(rank, host, text)
        with _timed("training", timings):
            job = run_job(cfg, state, shipped_folder("kit.examples") / DEMO_SCRIPT,
                           ["--epochs", str(epochs), "--samples", str(samples)], None, None, HorovodOptions(), (),
                           on_line)
    finally:
        made = st.load(identity.folder)  # None when up stopped before changing anything
        if made is not None and not keep:
            with _timed("down", timings), progress_bar() as bar:
                down_cluster(made, identity, connector(cfg.connect_timeout), progress=LiveProgress(bar))
    _print_demo(cfg, state, job, training, timings, keep)


@contextlib.contextmanager
def _timed(what: str, timings: list[tuple[str, float]]):
    started = time.monotonic()
    try:
        yield
    finally:
        timings.append((what, time.monotonic() - started))


def _print_demo(cfg: ClusterConfig, state: st.ClusterState, job: jobs.Job, training: Training,
                timings: list[tuple[str, float]], kept: bool) -> None:
    table = Table(show_header=False, box=None, padding=(0, 2))
    hosts = ", ".join(f"{h.name} ({h.address})" for h in state.hosts)
    table.add_row("cluster", f"{len(state.hosts)} containers on this machine: {hosts}")
    table.add_row("job", f"{job.id}: horovodrun -np {job.np}, {state.image}")
    for key, value in training.rows():
        table.add_row(key, value)
    table.add_row("time", ", ".join(f"{what} {seconds:.0f} s" for what, seconds in timings))
    console.print("[bold]summary[/]")
    console.print(table)
    if kept:
        console.print(f"the cluster is still up: `kit run SCRIPT --name {cfg.name}`, then `kit down --name {cfg.name}`")
    else:
        console.print(f"the cluster is down; the workspace {state.workspace} keeps the example and its checkpoint")
    console.print("next, on your servers: kit up --hosts hosts.txt, then kit run train.py")
