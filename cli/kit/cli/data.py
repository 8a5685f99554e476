"""`kit cp`: files and folders between this machine and a host's workspace."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from kit.data import cpargs
from kit.data import transfer
from kit.cli.common import CONFIG, NAME, app, connector, console, err_console, need_state, recorded, reports_errors
from kit.cluster.steps.preflight import recorded_nodes

SHOWN_LEFT_OUT = 10


@contextlib.contextmanager
def _progress(what: str):
    """A live count of the bytes moved, on a terminal; on_bytes(n) for the copy."""
    if not err_console.is_terminal:
        yield lambda n: None
        return
    with Progress(TextColumn("{task.description}"), DownloadColumn(), TransferSpeedColumn(), console=err_console,
                  transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda n: bar.advance(task, n)


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


@app.command(short_help="Copy files between here and a host's workspace")
@reports_errors
def cp(
    src: str = typer.Argument(..., help="What to copy: a path here, or HOST:PATH (PATH relative to the cluster's "
                                        "workspace, or absolute inside it). SRC/. copies what a folder holds."),
    dest: str = typer.Argument(..., help="Where it goes: HOST:PATH, or a path here."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Copy files or folders between here and a host's workspace, as docker cp does: kit cp HOST:PATH DEST, or
    kit cp SRC HOST:PATH. HOST is a host of the cluster by name (as in hosts.txt) or address.

    What comes from a host is unpacked by kit itself: nothing lands outside DEST, no device or setuid bit, and a link
    that leads out of the copy is left out (and named)."""
    cfg, identity, state = recorded(name, config)
    state = need_state(cfg, identity, state)
    source, target = cpargs.endpoints(src, dest, state.hosts, state.workspace)
    if isinstance(source, cpargs.Remote):
        _download(cfg, state, source, target)
    else:
        _upload(cfg, state, source, target)


def _download(cfg, state, source: cpargs.Remote, dest: cpargs.Local) -> None:
    name = cpargs.source_name(source)
    landing = cpargs.local_target(dest, name, source.contents)  # bad input is found before the host is contacted
    (node,) = recorded_nodes([source.host], connector(cfg.connect_timeout))
    try:
        with _progress(f"{source.host.name} -> here") as on_bytes:
            done = transfer.download(node.runner, source, dest, state.workspace, on_bytes)
    finally:
        node.runner.close()
    where = landing.into / landing.name if landing.name else landing.into
    console.print(f"[green]✓[/] copied {escape(source.given)} to {escape(str(where))}: {done.files} files, "
                  f"{done.folders} folders, {done.links} links ({_mb(done.bytes)})")
    for member, why in done.left_out[:SHOWN_LEFT_OUT]:
        err_console.print(f"[yellow]left out[/] {escape(member)}: {escape(why)}")
    if done.left_out_count > SHOWN_LEFT_OUT:
        err_console.print(f"[yellow]left out[/] {done.left_out_count - SHOWN_LEFT_OUT} more")


def _upload(cfg, state, source: cpargs.Local, dest: cpargs.Remote) -> None:
    cpargs.local_source(source)
    (node,) = recorded_nodes([dest.host], connector(cfg.connect_timeout))
    try:
        with _progress(f"here -> {dest.host.name}") as on_bytes:
            at, sent = transfer.upload(node.runner, source, dest, state.workspace, on_bytes)
    finally:
        node.runner.close()
    console.print(f"[green]✓[/] copied {escape(source.given)} to {escape(dest.host.name)}:{escape(at)} "
                  f"({_mb(sent)} sent)")
