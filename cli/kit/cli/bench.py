"""`kit bench`: how fast the cluster is, measured. Figures only: nothing here passes or fails on a time."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from kit import netbench
from kit.cluster import recorded_nodes
from kit.errors import BadInput
from kit.cli.common import CONFIG, NAME, app, connector, console, need_state, recorded, reports_errors

bench = typer.Typer(no_args_is_help=True, help="Measure the cluster: `kit bench net` (every link's TCP throughput).")
app.add_typer(bench, name="bench")


def save(folder: Path, kind: str, data: dict) -> Path:
    """The figures as JSON in the cluster's folder on this machine (bench/<kind>-<time>.json)."""
    out = folder / "bench" / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out


@bench.command()
@reports_errors
def net(
    seconds: float = typer.Option(netbench.SECONDS, help="How long each link is measured."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """TCP throughput between every two hosts, both ways, container to container on the cluster addresses.

    Pairs run in rounds where no host is in two pairs, so each figure is one link's alone."""
    if not 0.5 <= seconds <= 60:
        raise BadInput(f"--seconds {seconds:g}: each link is measured from 0.5 to 60 s", hint="use e.g. --seconds 3")
    cfg, identity, state = recorded(name, config)
    state = need_state(cfg, identity, state)
    if len(state.hosts) < 2:
        raise BadInput(f"cluster {state.cluster} has one host: there is no link to measure",
                       hint="bring it up on two hosts or more (kit up --hosts hosts.txt)")
    nodes = recorded_nodes(state.hosts, connector(cfg.connect_timeout))
    try:
        progress = None if as_json else console.status("measuring the links")
        with progress or contextlib.nullcontext():
            links = netbench.bench_net(nodes, seconds, on_link=lambda l: progress and progress.update(
                f"measuring the links: {escape(l.source)} -> {escape(l.target)} {l.gbits:.2f} Gbit/s"))
    finally:
        for n in nodes:
            n.runner.close()
    data = {"cluster": state.cluster, "seconds": seconds, **netbench.as_json(links)}
    saved = save(identity.folder, "net", data)
    if as_json:
        console.print_json(data=data)
        return
    _print_matrix(links, [n.name for n in nodes])
    low = netbench.slowest(links)
    host = netbench.slow_host(links)
    console.print(f"slowest: {escape(low[0].source)} -> {escape(low[0].target)} {low[0].gbits:.2f} Gbit/s"
                  + (f"; every link within 10% of it touches [bold]{escape(host)}[/]" if host else ""))
    console.print(f"saved {saved}", style="dim")


def _print_matrix(links: list[netbench.Link], names: list[str]) -> None:
    rate = {(l.source, l.target): l.gbits for l in links}
    low = {(l.source, l.target) for l in netbench.slowest(links)}
    table = Table(title="TCP throughput, Gbit/s (row: from, column: to)")
    table.add_column("from \\ to")
    for n in names:
        table.add_column(n, justify="right")
    for a in names:
        table.add_row(a, *("—" if a == b else (f"[red]{rate[a, b]:.2f}[/]" if (a, b) in low else f"{rate[a, b]:.2f}")
                           for b in names))
    console.print(table)
