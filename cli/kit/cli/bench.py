"""`kit bench`: how fast the cluster is, measured. Figures only: nothing here passes or fails on a time."""

from __future__ import annotations

import collections
import contextlib
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kit.bench import figures as bf
from kit import shipped_folder
from kit.backends.cluster import run as jobs
from kit.bench import net as netbench
from kit.doctor import deep
from kit.cluster import state as st
from kit.network import measure
from kit.cluster.steps.preflight import recorded_nodes
from kit.jobs.commands.horovod import HorovodOptions, check_knobs
from kit.config.settings import ClusterConfig, framework
from kit.jobs.demo import SCRIPT as CIFAR_SCRIPT, Training
from kit.errors import BadInput, KitError
from kit.cli.common import (CONFIG, NAME, app, connector, console, err_console, locked, need_state, recorded,
                            one_of, reports_errors)
from kit.cli.backends.cluster import run_job

bench = typer.Typer(no_args_is_help=True, short_help="Measure links, allreduce and training speed",
                    help="Measure the cluster: `kit bench net` (every link's TCP throughput), "
                    "`kit bench allreduce` (bus bandwidth against the link), `kit bench train` (scaling over hosts), "
                    "`kit bench baseline` (every host's figures, kept for the preflight to compare with).")
app.add_typer(bench, name="bench")
JOB_FOLDER = "kit-bench"   # the workspace's folder for the bench jobs' scripts and what they write


def results_path(folder: Path, kind: str) -> Path:
    """Where a run's figures go in the cluster's folder on this machine: bench/<kind>-<time> (.json, .png)."""
    out = folder / "bench" / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def save(path: Path, data: dict) -> Path:
    out = path.with_suffix(".json")
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
    links = _measure_links(cfg, state, seconds, None if as_json else console)
    over = _over(state)
    data = {"cluster": state.cluster, "seconds": seconds, "network": over, **netbench.as_json(links)}
    saved = save(results_path(identity.folder, "net"), data)
    if as_json:
        console.print_json(data=data)
        return
    _print_matrix(links, [h.name for h in state.hosts], over)
    low = netbench.slowest(links)
    host = netbench.slow_host(links)
    console.print(f"slowest: {escape(low[0].source)} -> {escape(low[0].target)} {low[0].gbits:.2f} Gbit/s"
                  + (f"; every link within 10% of it touches [bold]{escape(host)}[/]" if host else ""))
    console.print(f"saved {saved}", style="dim")


@bench.command()
@reports_errors
def baseline(
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every host's compute and links, measured as `kit run --preflight` measures them (a matrix product in each
    container; a ring of links, all at once), and kept as the cluster's baseline: the preflight and `kit doctor
    --deep` then name a host that runs well below its own figures ("its matrix product runs at 0.55 of its
    baseline"). Run it when the cluster is healthy, and again after a change of hardware."""
    with locked(name, config) as (cfg, identity, state):  # no up or down changes the cluster under it
        state = need_state(cfg, identity, state)
        names = [h.name for h in state.hosts]
        nodes = recorded_nodes(state.hosts, connector(cfg.connect_timeout))
        try:
            at = measure.addresses(state)
            with (err_console if as_json else console).status("measuring every host's compute and links"):
                compute, ring, pairs, _ = deep.measure_all(nodes, at)
        finally:
            for n in nodes:
                n.runner.close()
        named = {f.host: f.text for f in deep.findings(compute, ring, pairs, names) if f.level != "ok"}
        figures = deep.figures_of(compute, ring, names)
        saved = deep.save_baseline(identity.folder, figures)
    data = {"cluster": state.cluster, "network": _over(state), "saved": str(saved),
            "hosts": {h: {"gflops": f.gflops, "device": f.device, "gbits": f.gbits} for h, f in figures.items()},
            "outliers": named}
    if as_json:
        console.print_json(data=data)
        return
    table = Table(title=f"baseline of {escape(state.cluster)} over {escape(_over(state))}")
    for column, justify in (("host", "left"), ("matrix product, GFLOP/s", "right"), ("device", "left"),
                            ("fastest ring link, Gbit/s", "right")):
        table.add_column(column, justify=justify)
    for h, f in figures.items():
        table.add_row(escape(h), "—" if f.gflops is None else f"{f.gflops:.1f}", escape(f.device),
                      "—" if f.gbits is None else f"{f.gbits:.2f}")
    console.print(table)
    for host, text in named.items():  # (kept all the same: the user says when the cluster is as it should be)
        console.print(f"[yellow]warning[/] {escape(host)} is an outlier already: {escape(text)}; the baseline keeps "
                      "its figure as it is: run `kit bench baseline` again once it is seen to", highlight=False)
    console.print(f"saved {saved}: `kit run --preflight` and `kit doctor --deep` compare with it", style="dim")


def _measure_links(cfg: ClusterConfig, state: st.ClusterState, seconds: float,
                   shown: Console | None) -> list[netbench.Link]:
    """Every link of the cluster, a spinner on `shown` saying the last one measured."""
    nodes = recorded_nodes(state.hosts, connector(cfg.connect_timeout))
    try:
        progress = shown.status("measuring the links") if shown else None
        with progress or contextlib.nullcontext():
            return netbench.bench_net(nodes, seconds, on_link=lambda l: progress and progress.update(
                f"measuring the links: {escape(l.source)} -> {escape(l.target)} {l.gbits:.2f} Gbit/s"),
                at=measure.addresses(state))
    finally:
        for n in nodes:
            n.runner.close()


def _over(state: st.ClusterState) -> str:
    """The network the figures are of: the training network, as `kit up` chose it."""
    return measure.described(state, {h.name for h in state.hosts}) or "the cluster's network"


def _print_matrix(links: list[netbench.Link], names: list[str], over: str) -> None:
    rate = {(l.source, l.target): l.gbits for l in links}
    low = {(l.source, l.target) for l in netbench.slowest(links)}
    table = Table(title=f"TCP throughput over {escape(over)}, Gbit/s (row: from, column: to)")
    table.add_column("from \\ to")
    for n in names:
        table.add_column(n, justify="right")
    for a in names:
        table.add_row(a, *("—" if a == b else (f"[red]{rate[a, b]:.2f}[/]" if (a, b) in low else f"{rate[a, b]:.2f}")
                           for b in names))
    console.print(table)


# kit bench allreduce: each backend, and the launcher that starts it
BACKENDS = {"horovod": "horovod", "torch": "torchrun"}


@bench.command()
@reports_errors
def allreduce(
    backend: str = typer.Option("all", autocompletion=one_of("horovod", "torch", "all"),
                                help="horovod (Horovod under horovodrun), torch (torch.distributed under torchrun) "
                                     "or all. CPU tensors go over Gloo, CUDA tensors (gpu images) over NCCL."),
    min_size: str = typer.Option("1K", help="The smallest message (e.g. 1K, 64M)."),
    max_size: str = typer.Option("256M", help="The largest message; each size is the last one times 4."),
    seconds: float = typer.Option(1.0, help="How long each size is timed, about."),
    link_gbits: Optional[float] = typer.Option(None, help="The link rate busbw is compared with, Gbit/s (default: "
                                               "the slowest link, as `kit bench net` measures it first)."),
    fusion_threshold_mb: Optional[int] = typer.Option(None, help="Horovod tensor fusion buffer (MB), to try one."),
    cycle_time_ms: Optional[float] = typer.Option(None, help="Horovod cycle time (ms), to try one."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Allreduce over message sizes (1 KiB to 256 MiB) on every slot: time, algorithm and bus bandwidth, as
    nccl-tests defines them, and busbw against the link rate, the headline (1.0: the network used to the full)."""
    chosen = list(BACKENDS) if backend == "all" else [backend]
    if not set(chosen) <= set(BACKENDS):
        raise BadInput(f"--backend: '{backend}' is not a backend", hint="use horovod, torch or all")
    low, high = bf.parse_size(min_size, "--min-size"), bf.parse_size(max_size, "--max-size")
    if low > high:
        raise BadInput(f"--min-size {min_size} --max-size {max_size}: the sizes go from the first up to the second",
                       hint="use e.g. --min-size 1K --max-size 256M")
    if not 0.1 <= seconds <= 30:
        raise BadInput(f"--seconds {seconds:g}: each size is timed from 0.1 to 30 s", hint="use e.g. --seconds 1")
    if link_gbits is not None and not link_gbits > 0:
        raise BadInput(f"--link-gbits {link_gbits:g}: a link rate is above 0", hint="give e.g. --link-gbits 10")
    check_knobs(fusion_threshold_mb, cycle_time_ms)
    if (fusion_threshold_mb is not None or cycle_time_ms is not None) and "horovod" not in chosen:
        raise BadInput("--fusion-threshold-mb, --cycle-time-ms: Horovod's, and --backend torch does not start Horovod",
                       hint="drop them, or use --backend horovod")
    out = err_console if as_json else console
    with locked(name, config) as (cfg, identity, state):  # no up or down changes the cluster under the jobs
        state = need_state(cfg, identity, state)
        _check_torch(state, "allreduce")
        if sum(h.slots or 1 for h in state.hosts) < 2:
            raise BadInput(f"cluster {state.cluster} has one process: an allreduce needs two",
                           hint="bring it up on two hosts or more, or give its host two slots (host:2 in hosts.txt)")
        measured = link_gbits is None and len(state.hosts) > 1
        link = min(l.gbits for l in _measure_links(cfg, state, 2.0, out)) if measured else link_gbits
        results: list[bf.Allreduce] = []
        args = ["--min-bytes", str(low), "--max-bytes", str(high), "--seconds", f"{seconds:g}"]
        for b in chosen:
            status = out.status(f"allreduce, {b}")
            with status:
                def take(rank: int | None, text: str) -> None:
                    if rank == 0 and (found := bf.parse_result(text)):
                        results.append(found)
                        status.update(f"allreduce, {found.label}: {bf.size_text(found.bytes)} "
                                      f"busbw {found.busbw_gbits:.2f} Gbit/s")
                job = _bench_job(cfg, state, shipped_folder("kit.bench.jobs") / "allreduce.py", [b, *args],
                                 BACKENDS[b], HorovodOptions(fusion_threshold_mb, cycle_time_ms), out, take)
            if not any(r.backend == b for r in results):
                raise KitError(f"the allreduce job of {b} ({job.id}) finished without printing a figure",
                               hint=f"`kit logs {job.id}` shows what it printed")
    path = results_path(identity.folder, "allreduce")
    title = f"allreduce on {state.cluster}: {results[0].ranks} ranks, {len(state.hosts)} hosts"
    png = bf.plot_allreduce(results, link, title, path.with_suffix(".png"))
    heads = bf.headline(results, link)
    data = {"cluster": state.cluster, "hosts": len(state.hosts), "network": _over(state), "link_gbits": link,
            "link_from": "kit bench net" if measured else "--link-gbits" if link else None,
            "headline_bytes": bf.headline_size(results), "headline": heads,
            "results": [r.as_dict(link) for r in results], "png": str(png)}
    saved = save(path, data)
    if as_json:
        console.print_json(data=data)
        return
    _print_allreduce(results, link, measured, heads, _over(state))
    console.print(f"saved {saved} and {png}", style="dim")


def _print_allreduce(results: list[bf.Allreduce], link: float | None, measured: bool, heads: dict[str, float],
                     over: str) -> None:
    for label in dict.fromkeys(r.label for r in results):
        mine = [r for r in results if r.label == label]
        table = Table(title=f"{label} allreduce, {mine[0].ranks} ranks")
        for column in ("size", "iters", "time", "algbw Gbit/s", "busbw Gbit/s", *(["busbw / link"] if link else [])):
            table.add_column(column, justify="right")
        for r in mine:
            table.add_row(bf.size_text(r.bytes), str(r.iters), _seconds(r.seconds), f"{r.algbw_gbits:.3f}",
                          f"{r.busbw_gbits:.3f}", *([f"{r.busbw_gbits / link:.2f}"] if link else []))
        console.print(table)
    if link is None:
        console.print("one host: no link to compare busbw with (--link-gbits gives one)")
        return
    at = bf.size_text(bf.headline_size(results))
    console.print(f"link: {link:.3f} Gbit/s, "
                  + (f"the slowest `kit bench net` measured over {escape(over)}" if measured else "--link-gbits"))
    for label, ratio in heads.items():
        console.print(f"[bold]{label}[/]: busbw / link at {at} = [bold]{ratio:.2f}[/]")


def _seconds(s: float) -> str:
    return f"{s * 1e6:.0f} µs" if s < 1e-3 else f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


@bench.command()
@reports_errors
def train(
    hosts: Optional[str] = typer.Option(None, "--hosts", help="How many hosts each run trains on, e.g. 1,2,3 "
                                        "(default: 1, 2, ... all); a run on N hosts uses the cluster's first N."),
    epochs: int = typer.Option(2, help="Epochs of each run; the last one's speed is the figure (the first warms up)."),
    samples: int = typer.Option(12800, help="Training images of an epoch, the same for every run (0: all 50,000)."),
    batch_size: int = typer.Option(64, help="Images a rank takes a step."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The CIFAR-10 example on 1, 2, ... N hosts (every slot of each): images/s, speedup and scaling efficiency."""
    if not 1 <= epochs <= 100:
        raise BadInput(f"--epochs {epochs}: from 1 to 100", hint="use e.g. --epochs 2")
    if not 1 <= batch_size <= 4096 or not 0 <= samples <= 50000:
        raise BadInput(f"--batch-size {batch_size} --samples {samples}: a batch of 1 to 4096, samples from 0 (all) "
                       "to 50,000 (CIFAR-10's training set)", hint="use e.g. --batch-size 64 --samples 12800")
    out = err_console if as_json else console
    with locked(name, config) as (cfg, identity, state):
        state = need_state(cfg, identity, state)
        _check_torch(state, "train")
        counts = _host_counts(hosts, len(state.hosts))
        runs: list[bf.TrainRun] = []
        generated = False
        for count in counts:
            part = replace(state, hosts=state.hosts[:count])  # the primary is the first
            training = Training()
            with out.status(f"training on {count} host{'s' if count > 1 else ''}"):
                job = _bench_job(cfg, part, shipped_folder("kit.examples") / CIFAR_SCRIPT,
                                 ["--epochs", str(epochs), "--samples", str(samples), "--batch-size", str(batch_size),
                                  "--checkpoint", f"{JOB_FOLDER}/cifar10_cnn.pt"], "horovod", HorovodOptions(), out,
                                 training.feed)
            if not training.epochs:
                raise KitError(f"job {job.id} on {count} hosts finished without saying its speed",
                               hint=f"`kit logs {job.id}` shows what it printed")
            generated |= training.generated_data
            runs.append(bf.TrainRun(count, job.np, training.epochs[-1].images_per_sec, job.id))
    rows = bf.scaling(runs)
    path = results_path(identity.folder, "train")
    png = bf.plot_train(rows, f"CIFAR-10 CNN on {state.cluster}: scaling over hosts", path.with_suffix(".png"))
    data = {"cluster": state.cluster, "epochs": epochs, "samples": samples, "batch_size": batch_size,
            "data": "generated" if generated else "CIFAR-10", "runs": rows, "png": str(png)}
    saved = save(path, data)
    if as_json:
        console.print_json(data=data)
        return
    table = Table(title=f"CIFAR-10 CNN, {samples or 50000} images an epoch, the last of {epochs} epochs")
    for column in ("hosts", "ranks", "images/s", "speedup", "efficiency", "job"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(str(r["hosts"]), str(r["ranks"]), f"{r['images_per_sec']:,.0f}", f"{r['speedup']:.2f}x",
                      f"{r['efficiency']:.0%}", r["job"])
    console.print(table)
    if generated:
        console.print("data: generated images of CIFAR-10's shape (put the CIFAR-10 python batches in the "
                      "workspace's data/cifar-10-batches-py to train on the real ones)")
    console.print(f"saved {saved} and {png}", style="dim")


def _host_counts(text: str | None, hosts: int) -> list[int]:
    if text is None:
        return list(range(1, hosts + 1))
    try:
        counts = sorted({int(c) for c in text.split(",") if c.strip()})
    except ValueError:
        counts = []
    if not counts or not all(1 <= c <= hosts for c in counts):
        raise BadInput(f"--hosts '{text}': host counts from 1 to {hosts}, the cluster's hosts",
                       hint="give e.g. --hosts " + ",".join(str(c) for c in range(1, hosts + 1)))
    return counts


def _check_torch(state: st.ClusterState, what: str) -> None:
    if framework(state.flavor) != "horovod":
        raise BadInput(f"kit bench {what} runs PyTorch and Horovod, and cluster {state.cluster} runs {state.image}, "
                       f"a {state.flavor} image", hint="use it on a cluster of a cpu or gpu image")


def _bench_job(cfg: ClusterConfig, state: st.ClusterState, source: Path, args: list[str], launcher: str,
               options: HorovodOptions, out: Console, take: Callable[[int | None, str], None]) -> jobs.Job:
    """Run one of kit's own jobs from the workspace's kit-bench folder, handing take() each line of its output; only
    when it fails are lines shown: the last of each rank's and of its launcher's."""
    tails: dict[int | None, collections.deque[str]] = collections.defaultdict(lambda: collections.deque(maxlen=12))
    unread: list[str] = []

    def on_line(rank: int | None, host: str | None, text: str) -> None:
        tails[rank].append(text if rank is None else f"[{host} rank {rank}] {text}")
        try:
            take(rank, text)
        except Exception as e:  # said when the job has ended: raising here would leave it running
            unread.append(str(e))
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as folder:
        script = Path(folder) / JOB_FOLDER / source.name
        script.parent.mkdir()
        shutil.copyfile(source, script)
        try:
            job = run_job(cfg, state, script, args, None, Path(folder), options, (), on_line, launcher, out=out)
        except KitError:
            for rank in sorted(tails, key=lambda r: -1 if r is None else r):
                for line in tails[rank]:
                    out.print(line, markup=False, highlight=False)
            raise
    if unread:
        raise KitError(unread[0], hint=f"`kit logs {job.id}` shows what the job printed")
    return job
