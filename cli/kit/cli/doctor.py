"""`kit doctor`: is the cluster (or are these hosts, before `kit up`) healthy? One line per check per host."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from kit.doctor import check as dr
from kit.doctor import deep as deep_check
from kit.errors import BadInput
from kit.network import measure
from kit.cluster import state as st
from kit.cluster.lifecycle import state_cfg
from kit.config.settings import AUTO_FLAVORS, build_config, cuda_line, requested_flavor, uses_gpus
from kit.cluster.identity import Identity
from kit.config.hosts import read_hosts
from kit.cluster.steps.node import Node
from kit.shown import visible
from kit.cli.common import CONFIG, NAME, app, cluster_settings, connector, console, not_recorded, reports_errors

MARKS = {dr.OK: "[green]ok  [/]", dr.WARN: "[yellow]warn[/]", dr.FAIL: "[red]fail[/]"}


@app.command(short_help="Check the hosts: SSH, Docker, GPUs, ports, network")
@reports_errors
def doctor(
    hosts: Optional[Path] = typer.Option(None, "--hosts", help="Check these hosts before `kit up` (default: the "
                                                                 "cluster's hosts, as `kit up` recorded them)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of lines."),
    deep: bool = typer.Option(False, "--deep", help="Also measure every host's compute and links (seconds), as "
                              "`kit run --preflight` does, and name a host that would hold a job back."),
) -> None:
    """Check the cluster: SSH, Docker, image, ports, NICs, clocks, disk, /dev/shm, the shared workspace, GPUs;
    Slurm (controller, nodes, munge keys) where kit.yaml has a slurm section or the primary has slurm.conf.

    One line per check per host (ok, warn, fail), each warn and fail with its fix; exit 1 when a check fails.
    Changes nothing on the hosts (the workspace check writes a file of its own there, and removes it)."""
    cfg_file, cfg = cluster_settings(config, dict(name=name))
    identity = Identity(cfg.name, persist=False)
    state = None if hosts is not None else st.load(identity.folder)
    connect = connector(cfg.connect_timeout)
    if hosts is not None:
        inventory = read_hosts(hosts)
        nodes = [Node(h, connect(h), cfg.host_place()) for h in inventory]
        image = cfg.image_tag or ""
        flavor, where = requested_flavor(cfg_file)
        cuda = _settings_cuda(cfg_file, flavor)
    elif state is None:
        raise not_recorded(cfg.name, identity, hint="check hosts before bringing them up: kit doctor --hosts hosts.txt")
    else:
        nodes = [Node(h.host, connect(h.host), h.place, address=h.address) for h in state.hosts]
        cfg, image, flavor, cuda, where = state_cfg(state), state.image, state.flavor, state.cuda or None, ""
    if deep and state is None:
        raise BadInput("--deep measures in the cluster's containers: it needs a cluster that is up",
                       hint="kit up --hosts hosts.txt first, or leave out --deep (or --hosts)")
    try:
        report = dr.examine(nodes, cfg, image, state, flavor, identity.owner, cuda=cuda, where=where,
                            slurm="slurm" in cfg_file.sections)
        baseline = deep_check.load_baseline(identity.folder) if deep else None
        if deep and (len(nodes) > 1 or baseline):  # (GPUs' health: examine read it already)
            measured = deep_check.measure_all(nodes, measure.addresses(state))
            report.findings.extend(deep_check.findings(*measured[:3], [n.name for n in nodes], baseline=baseline))
    finally:
        for n in nodes:
            n.runner.close()
    if as_json:
        console.print_json(data={"cluster": cfg.name, "hosts": report.hosts, "failed": report.failed,
                                 "warnings": report.warned, "findings": [f.as_dict() for f in report.findings]})
    else:
        _print(report, cfg.name, state is not None)
    if report.failed:
        raise typer.Exit(1)


def _settings_cuda(cfg_file, flavor: str) -> str | None:
    """The CUDA line kit.yaml's settings build for the GPU flavor that `flavor` is or may become (auto, tf)."""
    gpu = AUTO_FLAVORS[flavor][1] if flavor in AUTO_FLAVORS else flavor
    return cuda_line(gpu, build_config(cfg_file, {"flavor": gpu}).cuda) if uses_gpus(gpu) else None


def _print(report: dr.Report, cluster: str, up: bool) -> None:
    width = max(len(f.check) for f in report.findings)
    for host in report.hosts:
        console.print(f"[bold]{escape(host)}[/]")
        for f in report.of(host):
            # a finding is one line: a host's text in it cannot start a forged one (kit.shown)
            console.print(f"  {MARKS[f.level]} {f.check:<{width}}  {escape(visible(f.text, one_line=True))}")
            if f.fix:
                console.print(f"       {'':<{width}}  fix: {escape(visible(f.fix, one_line=True))}",
                              style="dim" if f.level == dr.OK else "")
    what = f"cluster {cluster}" if up else f"{len(report.hosts)} hosts (before kit up)"
    if report.failed:
        console.print(f"[red]✗[/] {what}: {report.failed} check{'s' if report.failed > 1 else ''} failed"
                      + (f", {report.warned} warning{'s' if report.warned > 1 else ''}" if report.warned else ""))
    else:
        console.print(f"[green]✓[/] {what} is healthy" + (f" ({report.warned} warning"
                                                        f"{'s' if report.warned > 1 else ''})" if report.warned else ""))
