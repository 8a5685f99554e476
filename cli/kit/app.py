"""kit's command line. Commands parse, call a workflow, print; only this module
prints for the user and exits. KitError -> exit 1, BadInput -> exit 2."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import subprocess
import tempfile
import time
from ipaddress import IPv4Network
from pathlib import Path
from typing import Callable, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, TextColumn
from rich.table import Table
from rich.text import Text

from kit import __version__, shipped_folder
from kit import state as st
from kit import pipconfig
from kit.build import Step, build_image, connect, find_built, resolve_sources, scratch
from kit.cluster import (HostStatus, Up, down as down_cluster, recorded_nodes, status as cluster_status,
                         what_may_remain)
from kit.config import (CONTENTS, FLAVORS, ClusterConfig, ConfigFile, build_config, cluster_config, framework,
                        read_config)
from kit import jobenv, jobs
from kit.commands.docker import command, exec_argv
from kit.commands.launchers import FRAMEWORK_LAUNCHERS, LAUNCHERS
from kit.commands.horovod import (ENV_DIR, HorovodOptions, Slot, check_np, common_interfaces, exit_report,
                                  rank_command, split_rank)
from kit.errors import BadInput, KitError
from kit.identity import Identity, state_root
from kit.inventory import read_hosts
from kit.recipe import EXPECTED_BUILD, Recipe, make_recipe
from kit.demo import SCRIPT as DEMO_SCRIPT, Training
from kit.lock import cluster_lock
from kit.local import LOCAL_NODES, check_count, docker_subnets, free_subnet, local_cluster, network_name, routes
from kit import prepare as prepare_hosts
from kit.runners.local import LocalRunner
from kit.runners.ssh import SshRunner, ssh_hostname
from kit.steps.image import archive, local_image
from kit.steps.node import Node
from kit.verify import ImageReport, verify_image

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Turn a few Linux servers into a Horovod / PyTorch cluster of Docker containers.")
# soft_wrap: long lines (Dockerfile, commands) stay whole, so they can be copied.
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def reports_errors(command: Callable) -> Callable:
    """Print a KitError as `error:` / output tail / `fix:` lines and exit with its code. Anything else is a bug
    of kit's: one line saying so, not a traceback (KIT_DEBUG=1 shows the traceback)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KitError as e:
            _report(e)
        except (KeyboardInterrupt, typer.Exit):
            raise
        except Exception as e:  # noqa: BLE001
            if os.environ.get("KIT_DEBUG"):
                raise
            _report(KitError(f"kit failed unexpectedly: {type(e).__name__}: {pipconfig.redact_text(str(e))}",
                             hint="this is a bug in kit: run the command again with KIT_DEBUG=1 for the traceback, "
                                  "and report it"))

    return wrapper


def _report(e: KitError) -> None:
    err_console.print(f"[bold red]error:[/] {escape(str(e))}")
    for host, failure in getattr(e, "failures", {}).items():
        err_console.print(f"  [bold]{escape(host)}[/]: {escape(failure.message)}")
        _details(failure, indent="    ", shown_hint=e.hint)
    _details(e, indent="  ", shown_hint=e.hint)
    if e.hint:
        err_console.print(f"[bold]fix:[/] {escape(e.hint)}")
    raise typer.Exit(e.exit_code) from None


def _details(e: KitError, indent: str, shown_hint: str | None) -> None:
    """Command and output tail of a failure; its own fix only when it is not the one shown for all."""
    if e.command:
        err_console.print(f"{indent}command: {escape(e.command)}")
    if e.output_tail:
        err_console.print(indent + escape(e.output_tail).replace("\n", "\n" + indent), style="dim")
    if e.hint and e.hint != shown_hint:
        err_console.print(f"{indent}fix: {escape(e.hint)}")


def _version(value: bool) -> None:
    if value:
        console.print(f"kit {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print kit's version."),
) -> None:
    pass


@app.command()
@reports_errors
def build(
    flavor: Optional[str] = typer.Option(None, help="cpu (Debian, torch CPU, Horovod with Gloo), gpu (CUDA, NCCL + "
                                                     "Gloo), tf-cpu or tf-gpu (TensorFlow, no torch or Horovod)."),
    image: Optional[str] = typer.Option(None, help="Repository name of the image; kit derives the tag."),
    base_image: Optional[str] = typer.Option(None, help="Base of the final image (and, for cpu, of the build)."),
    builder_image: Optional[str] = typer.Option(None, help="Base of the gpu build stage (a CUDA devel image)."),
    python: Optional[str] = typer.Option(None, help="Python minor version from the base's packages, e.g. 3.11."),
    torch: Optional[str] = typer.Option(None, help="torch version, e.g. 2.13.0."),
    torch_index_url: Optional[str] = typer.Option(None, help="Extra pip index for torch builds; '' for none."),
    index_url: List[str] = typer.Option([], help="pip index URL (repeat: the first is the index, others extra)."),
    wheelhouse: Optional[Path] = typer.Option(None, help="Folder of .whl files, copied into the build and preferred."),
    ca_bundle: Optional[Path] = typer.Option(None, help="PEM CA bundle the image trusts (proxies, private mirrors)."),
    horovod_version: Optional[str] = typer.Option(None, help="Horovod release from PyPI (default 0.28.1)."),
    tensorflow: Optional[str] = typer.Option(None, help="TensorFlow release of the tf flavors (default 2.21.0)."),
    horovod_source: Optional[str] = typer.Option(None, help="Build Horovod from this pip URL instead (pin a commit)."),
    pip: List[str] = typer.Option([], help="Extra pip package for the image (repeat)."),
    apt: List[str] = typer.Option([], help="Extra apt package for the image (repeat)."),
    with_mpi: Optional[bool] = typer.Option(None, "--with-mpi/--without-mpi", help="Also build Open MPI support."),
    cuda: Optional[str] = typer.Option(None, help="gpu: the CUDA line of torch's build: 13.0 (default) or 12.8."),
    cuda_arch: List[str] = typer.Option([], help="gpu: build Horovod's kernels for this compute capability only, "
                                                 "e.g. 90 (repeat; default: every GPU nvcc knows)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="kit.yaml to read (default ./kit.yaml)."),
    single_stage: bool = typer.Option(False, help="Build one stage with the compilers left in (for comparison)."),
    verify: bool = typer.Option(True, help="Check after building that the image's processes all-reduce."),
    dry_run: bool = typer.Option(False, help="Print the Dockerfile and the plan; touch no Docker engine."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the whole build log."),
) -> None:
    """Build (or reuse) the training image and check that its processes all-reduce (Horovod or TensorFlow)."""
    flags = dict(flavor=flavor, image=image, base_image=base_image, builder_image=builder_image, python=python,
                 torch=torch, torch_index_url=torch_index_url, pip_index_urls=tuple(index_url),
                 wheelhouse=wheelhouse, ca_bundle=ca_bundle, horovod_version=horovod_version, tensorflow=tensorflow,
                 horovod_source=horovod_source, pip_packages=tuple(pip), apt_packages=tuple(apt), with_mpi=with_mpi,
                 cuda=cuda, cuda_archs=tuple(cuda_arch))
    plan = make_recipe(build_config(read_config(config), flags), single_stage=single_stage)
    if dry_run:
        _print_plan(plan, verify)
        return
    client = connect()
    tag = _ensure_image(client, plan, verbose)
    if verify:
        with console.status(f"verifying: {VERIFIES[plan.config.framework]}"):
            report = verify_image(client, tag, plan.config.flavor, cuda=plan.config.cuda)
        _print_report(report)


# What `kit build` checks in a new image, per framework.
VERIFIES = {"horovod": "horovodrun --check-build and a 2-process Horovod allreduce",
            "tensorflow": "a 2-worker MultiWorkerMirroredStrategy allreduce"}


def _ensure_image(client, plan: Recipe, verbose: bool) -> str:
    """The image of these settings: the one built before from them (its key), else resolved and built now. Its tag."""
    built = find_built(client, plan)
    if built:
        console.print(f"[green]✓[/] {built} is up to date (built before from the same settings)")
        return built
    with tempfile.TemporaryDirectory(prefix="kit-build-", dir=scratch()) as work:
        with console.status("finding the base image and the Python packages") as status:
            sources = resolve_sources(client, plan.config, Path(work), on_status=status.update)
        _print_rows("sources", sources.lines())
        recipe = make_recipe(plan.config, single_stage=plan.single_stage, base=sources.base.ref,
                             builder=sources.builder.ref if sources.builder else None,
                             wheelhouse=sources.wheelhouse, ca_bundle=sources.ca_bundle)
        console.print(f"building {recipe.tag} ({recipe.config.flavor}, {len(recipe.files)} files in the context)")
        with console.status("starting the build") as status:
            build_image(client, recipe, on_step=functools.partial(_show_step, status),
                        on_line=(lambda line: console.print(escape(line), style="dim")) if verbose else None)
    console.print(f"[green]✓[/] built {recipe.tag}")
    return recipe.tag


def _print_rows(title: str, rows: list[tuple[str, str]]) -> None:
    """A titled list of `name  value` lines, each whole (soft-wrapped: URLs and paths stay copyable)."""
    console.print(f"[bold]{title}[/]")
    for key, value in rows:
        console.print(f"  {key:<8}  {escape(value)}")


def _show_step(status, step: Step) -> None:
    how = "cached" if step.cached else f"{step.seconds:.0f}s"
    width = max(20, console.width - 16)
    label = step.label if len(step.label) <= width else step.label[: width - 1] + "…"
    console.print(f"  [dim]{how:>6}[/]  {escape(label)}")
    status.update(f"step {step.number + 1}/{step.total}" if step.number < step.total else "finishing")


def _print_plan(recipe: Recipe, verify: bool) -> None:
    console.print(recipe.dockerfile, markup=False)
    console.print("[bold]plan[/] (dry run: no Docker engine or package index was contacted)")
    console.print(f"  key      {recipe.key} (the image of these settings carries it as io.kit.key)")
    bases = [b for b in (recipe.config.base_image, recipe.config.builder_image) if b]
    console.print(f"  bases    {', '.join(bases)} (this machine's, else its registry's; debian and ubuntu "
                  "are made from this machine's apt mirror when no registry answers)")
    console.print(f"  wheels   resolved with this machine's pip for the image's Python: "
                  f"{'; '.join(pipconfig.read().describe())}")
    for f in recipe.files:
        console.print(f"  context  {f.name} ({f.size():,} bytes)")
    if verify and recipe.config.framework == "horovod":
        frameworks, controllers, operations = EXPECTED_BUILD[recipe.config.flavor]
        console.print(f"  verify   horovodrun --check-build lists {', '.join(sorted(frameworks | controllers))} "
                      f"and operations {', '.join(sorted(operations))}; a 2-process allreduce sums to 3")
    elif verify:
        console.print(f"  verify   {VERIFIES['tensorflow']} sums to 3"
                      + ("; TensorFlow is a CUDA build" if recipe.config.gpu else ""))


def _print_report(r: ImageReport) -> None:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("image", r.tag)
    table.add_row("id", r.image_id.removeprefix("sha256:")[:12])
    table.add_row("size", f"{r.size_bytes / 1e9:.2f} GB")
    table.add_row("versions", ", ".join(f"{name} {version}" for name, version in r.versions.items()))
    if r.check:
        table.add_row("frameworks", ", ".join(sorted(r.check.frameworks)))
        table.add_row("controllers", ", ".join(sorted(r.check.controllers)))
        table.add_row("operations", ", ".join(sorted(r.check.operations)))
    sums = ", ".join(f"rank {a.rank} = {a.total:g}" for a in r.allreduce)
    table.add_row("allreduce", f"{len(r.allreduce)} processes, sum {sums} (expected {r.allreduce[0].expected:g}) ✓")
    for key, value in cuda_rows(r):
        table.add_row(key, escape(value))
    console.print("[green]✓[/] verified")
    console.print(table)


def cuda_rows(r: ImageReport) -> list[tuple[str, str]]:
    """The gpu flavor's lines of the build summary: what the image is built for, and whether its NCCL path ran."""
    if r.cuda is None:
        return []
    rows = [("CUDA", f"{r.cuda.cuda} (torch's build), GPU architectures {' '.join(r.cuda.archs)}"),
            ("NCCL", f"{r.cuda.nccl} (torch's), built into Horovod")]
    g = r.gpu_check
    if g is not None and g.verified:
        first = g.horovod[0]
        rows.append(("GPU check", f"{len(g.horovod)} GPUs ({first.fact('gpu').replace('_', ' ')}, driver "
                                  f"{first.fact('driver')}, CUDA {first.fact('cuda')}, NCCL {first.fact('nccl')}): "
                                  f"CUDA tensors allreduced through NCCL by Horovod and by torch.distributed ✓"))
    elif g is not None:
        rows.append(("GPU check", f"the NCCL path was not verified: {g.why_not}; kit up checks it on the hosts' GPUs"))
    return rows


# ---------------------------------------------------------------- cluster

CONFIG = typer.Option(None, "--config", "-c", help="kit.yaml to read (default ./kit.yaml).")
NAME = typer.Option(None, "--name", help="Cluster name (default kit).")


class LiveProgress:
    """A live line per host (what it is doing) and a bar while the image is copied."""

    def __init__(self, progress) -> None:
        self.bar = progress
        self.tasks: dict[str, int] = {}

    def _task(self, host: str) -> int:
        if host not in self.tasks:
            self.tasks[host] = self.bar.add_task(host, total=None, what="")
        return self.tasks[host]

    def status(self, host: str, text: str) -> None:
        self.bar.update(self._task(host), what=text)

    def transfer(self, host: str, done: int, total: int) -> None:
        self.bar.update(self._task(host), completed=done, total=total)


class _WhileCopying(ProgressColumn):
    """A column shown only for hosts that are being sent the image."""

    def __init__(self, column: ProgressColumn) -> None:
        super().__init__()
        self.column = column

    def render(self, task):
        return self.column.render(task) if task.total else Text("")


def _live() -> Progress:
    return Progress(TextColumn("{task.description:<24}"), TextColumn("{task.fields[what]:<32}"),
                    _WhileCopying(BarColumn()), _WhileCopying(DownloadColumn()), console=console)


def _connect(timeout: int):
    """How kit reaches a host: over SSH, or directly for a container of the local cluster."""
    return lambda host: LocalRunner(host.name) if host.local else SshRunner(host, connect_timeout=timeout)


def _cluster_cfg(config: Optional[Path], flags: dict) -> tuple[ConfigFile, ClusterConfig]:
    cfg_file = read_config(config)
    return cfg_file, cluster_config(cfg_file, flags)


def _image_tag(client, cfg_file: ConfigFile, cfg: ClusterConfig) -> tuple[str, str]:
    """The image the cluster runs (cluster.image_tag, or the one `kit build` made from kit.yaml's settings), and
    kit.yaml's build flavor: what an image without kit's flavor label is taken to be."""
    build = build_config(cfg_file, {})
    tag = cfg.image_tag or find_built(client, make_recipe(build))
    if tag is None:
        raise BadInput(f"no image built from the build settings of {cfg_file.path or 'the defaults (no kit.yaml)'} "
                       "is on this machine", hint="run `kit build` first with the same kit.yaml, or set "
                                                 "cluster.image_tag")
    return tag, build.flavor


def _print_changes(nodes: list[Node], dry_run: bool) -> None:
    for n in nodes:
        planned = getattr(n.runner, "planned", None)
        lines = planned if dry_run else n.changes
        if not lines:
            console.print(f"  {escape(n.name)}: no change")
        for line in lines:
            console.print(f"  {escape(n.name)}: {escape(line)}")


@app.command()
@reports_errors
def up(
    hosts: Optional[Path] = typer.Option(None, "--hosts", help="hosts.txt: one host a line (host, host:slots, "
                                                                 "user@host...). Without it: a local cluster."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Containers of the local cluster (when there is no "
                                                                 "--hosts; default 3)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    ssh_port: Optional[int] = typer.Option(None, help="Port of the containers' sshd (default 12345)."),
    workspace: Optional[str] = typer.Option(None, help="Folder mounted at the same path in every container."),
    shm_size: Optional[str] = typer.Option(None, help="Size of /dev/shm (default: share the host's IPC)."),
    image_tag: Optional[str] = typer.Option(None, help="Image to run (default: the one kit build makes)."),
    dry_run: bool = typer.Option(False, help="Check the hosts and print what would change; change nothing."),
) -> None:
    """Bring the cluster up: keys, image, containers on every host, then verify it.

    Without --hosts, the cluster is N containers on this machine, on a private Docker network."""
    cfg_file, cfg = _cluster_cfg(config, dict(name=name, ssh_port=ssh_port, workspace=workspace,
                                              shm_size=shm_size, image_tag=image_tag))
    if hosts is not None and nodes is not None:
        raise BadInput("--nodes is for the local cluster; with --hosts, hosts.txt lists the hosts",
                       hint="drop --nodes, or drop --hosts to make a local cluster of N containers")
    with cluster_lock(cfg.name):
        _bring_up(cfg_file, cfg, hosts, LOCAL_NODES if nodes is None else nodes, dry_run)


def _bring_up(cfg_file: ConfigFile, cfg: ClusterConfig, hosts: Optional[Path], count: int, dry_run: bool) -> None:
    inventory = read_hosts(hosts) if hosts is not None else None
    count = check_count(count)  # bad input is found before anything is contacted
    st.load(Identity(cfg.name, persist=False).folder)  # a damaged record too
    client = connect()
    if inventory is None:
        inventory, places = local_cluster(cfg, count, _local_subnet(client, cfg))
        if cfg.storage != "copy":
            console.print(f"[yellow]note[/] the local cluster's containers share one folder of this machine; "
                          f"storage: {cfg.storage} is for clusters of hosts")
            cfg = cfg.model_copy(update={"storage": "copy", "nfs_server": None})
    else:
        places = {h.name: cfg.host_place() for h in inventory}
    tag, flavor = _image_tag(client, cfg_file, cfg)
    image = local_image(client, tag)
    flavor = image.flavor or flavor
    identity = Identity(cfg.name, persist=not dry_run)
    with _live() as bar:
        workflow = Up(cfg, flavor, image, identity, archive=lambda: archive(client, image, state_root() / ".images"),
                      connect=_connect(cfg.connect_timeout), places=places, dry_run=dry_run,
                      progress=LiveProgress(bar))
        nodes = workflow.run(inventory)
    changed = any(n.changes for n in nodes + workflow.left) or dry_run
    where = "on this machine in " if hosts is None else "on "
    console.print(("[bold]plan[/] (dry run: nothing was changed)" if dry_run else
                   f"[green]✓[/] cluster {cfg.name} is up {where}{len(nodes)} {'containers' if hosts is None else 'hosts'}"
                   + ("" if changed else ": no change")))
    if changed:
        _print_changes(nodes, dry_run)
    for n in workflow.left:
        console.print(f"  {escape(n.name)} (no longer in hosts.txt): {escape('; '.join(n.changes) or 'nothing of the cluster was there')}")
    if workflow.copied and not dry_run:
        console.print(f"  {workflow.copied}")
    _print_notes(nodes)


def _local_subnet(client, cfg: ClusterConfig) -> IPv4Network:
    """The local cluster's network keeps its subnet; a new one gets a /24 nothing here uses."""
    networks = client.networks.list()
    kept = docker_subnets([n.attrs for n in networks if n.name == network_name(cfg)])
    taken = routes(Path("/proc/net/route").read_text()) + docker_subnets([n.attrs for n in networks])
    return kept[0] if kept else free_subnet(taken)


@app.command()
@reports_errors
def prepare(
    hosts: Path = typer.Option(..., "--hosts", help="hosts.txt: the hosts to prepare."),
    check: bool = typer.Option(False, "--check", help="Say what would change (Ansible check mode); change nothing."),
    storage: Optional[str] = typer.Option(None, help="copy, sshfs or nfs (default: cluster.storage in kit.yaml)."),
    nfs_server: Optional[str] = typer.Option(None, help="An existing NFS export, server:/path (default: "
                                                        "cluster.nfs_server; without one the primary exports)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Prepare the hosts with Ansible: Docker, NVIDIA Container Toolkit (gpu), firewall, NFS or sshfs."""
    cfg_file, cfg = _cluster_cfg(config, dict(name=name, storage=storage, nfs_server=nfs_server))
    inventory = read_hosts(hosts)
    program = prepare_hosts.ansible_playbook()
    addresses = {h.name: prepare_hosts.resolve(h, ssh_hostname(h)) for h in inventory}
    data = prepare_hosts.inventory(inventory, addresses, cfg, gpu=build_config(cfg_file, {}).gpu)
    with tempfile.TemporaryDirectory(prefix="kit-prepare-") as folder:
        argv = prepare_hosts.playbook_argv(program, prepare_hosts.write_inventory(Path(folder), data), check=check)
        console.print(f"running {shlex.join(argv)}", style="dim")
        code = subprocess.run(argv, env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"}).returncode
    if code != 0:
        raise KitError(f"ansible-playbook failed (exit {code}) on the hosts named in its recap above",
                       hint="fix what its failed tasks say, then run kit prepare again (it skips what is done)")
    console.print("[green]✓[/] " + ("check mode: nothing was changed" if check else "hosts are prepared"))


def _print_notes(nodes: list[Node]) -> None:
    """Each note once, with the hosts it applies to."""
    by_note: dict[str, list[str]] = {}
    for n in nodes:
        for note in n.notes:
            by_note.setdefault(note, []).append(n.name)
    for note, hosts in by_note.items():
        console.print(f"  [yellow]note[/] ({escape(', '.join(hosts))}): {escape(note)}")


@contextlib.contextmanager
def _locked(name: Optional[str], config: Optional[Path]):
    """(cluster settings, identity, recorded state) read while holding the cluster's lock (kit.lock)."""
    _, cfg = _cluster_cfg(config, dict(name=name))
    with cluster_lock(cfg.name):
        identity = Identity(cfg.name)
        yield cfg, identity, st.load(identity.folder)


def _recorded(name: Optional[str], config: Optional[Path]) -> tuple[ClusterConfig, Identity, st.ClusterState | None]:
    _, cfg = _cluster_cfg(config, dict(name=name))
    identity = Identity(cfg.name)
    return cfg, identity, st.load(identity.folder)


@app.command()
@reports_errors
def status(
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Each host of the cluster: reachable, container, image, port, GPUs."""
    cfg, identity, state = _recorded(name, config)
    if state is None:
        raise KitError(f"no cluster {cfg.name} is recorded here ({identity.folder})",
                       hint="bring it up with `kit up --hosts hosts.txt`")
    rows = cluster_status(state, _connect(cfg.connect_timeout), identity.owner)
    if as_json:
        console.print_json(data={"cluster": state.cluster, "image": state.image, "ssh_port": state.ssh_port,
                                 "hosts": [r.as_dict() for r in rows]})
    else:
        _print_status(state, rows)
    if not all(r.reachable and r.container == "running" and r.image_matches for r in rows):
        raise typer.Exit(1)


def _print_status(state: st.ClusterState, rows: list[HostStatus]) -> None:
    table = Table(title=f"cluster {state.cluster}: {state.image}, port {state.ssh_port}")
    for column in ("host", "address", "reachable", "container", "image", "port", "GPUs", "slots"):
        table.add_column(column)
    for r in rows:
        mark = lambda ok: "[green]yes[/]" if ok else "[red]no[/]"  # noqa: E731
        table.add_row(r.name + (" (primary)" if r.primary else ""), r.address,
                      mark(r.reachable) if r.reachable else f"[red]no[/]: {escape(r.error)}",
                      r.container, mark(r.image_matches), "listening" if r.port_listening else "closed", str(r.gpus),
                      str(r.slots))
    console.print(table)


@app.command()
@reports_errors
def down(
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    dry_run: bool = typer.Option(False, help="Print what would be removed; remove nothing."),
    force: bool = typer.Option(False, help="Forget hosts that cannot be cleaned (gone for good), saying what "
                                           "may be left there."),
) -> None:
    """Remove exactly what `kit up` made: containers, kit's folders and files. Safe to run twice."""
    with _locked(name, config) as (cfg, identity, state):
        if state is None:
            console.print(f"nothing to remove: no cluster {cfg.name} is recorded here ({identity.folder})")
            return
        with _live() as bar:
            done = down_cluster(state, identity, _connect(cfg.connect_timeout), dry_run=dry_run, force=force,
                                progress=LiveProgress(bar))
    console.print("[bold]plan[/] (dry run: nothing was removed)" if dry_run else
                  f"[green]✓[/] cluster {cfg.name} is down; images were kept on the hosts"
                  + (f", except on {len(done.forgotten)} forgotten" if done.forgotten else ""))
    _print_changes([n for n in done.nodes if n.name not in done.forgotten], dry_run)
    for host, why in done.forgotten.items():
        err_console.print(f"[yellow]forgot[/] {escape(host)} ({escape(why.message)}): what kit made there may "
                          f"remain: {escape(what_may_remain(state.host(host)))}; remove it by hand if "
                          "the host comes back")


# ---------------------------------------------------------------- jobs

def _need_state(cfg: ClusterConfig, identity: Identity, state: st.ClusterState | None) -> st.ClusterState:
    if state is None:
        raise BadInput(f"no cluster {cfg.name} is recorded here ({identity.folder})",
                       hint="bring it up first: kit up --hosts hosts.txt")
    return state


def _job_printer(launcher: str) -> Callable[[int | None, str | None, str], None]:
    """Prints a job's line: a rank's with its host and rank, the launcher's own with the launcher's name."""
    label = "[horovodrun]" if launcher == "horovod" else f"[{launcher}]"

    def show(rank: int | None, host: str | None, text: str) -> None:
        prefix = f"[{host} rank {rank}]" if rank is not None else label
        console.print(f"{prefix} {text}", markup=False, highlight=False)
    return show


@app.command()
@reports_errors
def run(
    script: Path = typer.Argument(..., help="The training script (python), inside the job's folder."),
    args: Optional[List[str]] = typer.Argument(None, help="Arguments for the script (after --)."),
    launcher: str = typer.Option("horovod", help="horovod (horovodrun), torchrun (PyTorch DDP) or tf "
                                                 "(MultiWorkerMirroredStrategy, one worker a host)."),
    np: Optional[int] = typer.Option(None, "--np", help="horovod: processes (default: every slot of the cluster)."),
    nproc_per_node: Optional[int] = typer.Option(None, help="torchrun: processes on each host (default: its slots)."),
    workdir: Optional[Path] = typer.Option(None, help="Folder copied to every host (default: the script's)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    fusion_threshold_mb: Optional[int] = typer.Option(None, help="Horovod tensor fusion buffer (MB)."),
    cycle_time_ms: Optional[float] = typer.Option(None, help="Horovod cycle time (ms)."),
    fp16_allreduce: bool = typer.Option(False, help="Hint the script to compress gradients to fp16 "
                                                     "(sets KIT_FP16_ALLREDUCE=1)."),
    timeline: Optional[str] = typer.Option(None, help="Write a Horovod timeline to this file (in the workspace)."),
    verbose_horovod: bool = typer.Option(False, help="horovodrun --verbose."),
    start_timeout: int = typer.Option(60, help="Seconds for every rank to start."),
    env: Optional[List[str]] = typer.Option(None, "--env", "-e", help="A variable for every rank: NAME=VALUE, or "
                                            "NAME for this shell's value (repeatable)."),
    env_file: Optional[List[Path]] = typer.Option(None, help="Variables for every rank from a file of NAME=VALUE "
                                                  "lines (docker's format; repeatable; -e wins)."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start the job and return: `kit logs ID -f` follows "
                                "it, `kit jobs` lists it, `kit stop ID` stops it."),
    restarts: int = typer.Option(0, help="After a failure, start the job again (this many times) on the hosts that "
                                 "still answer, with KIT_RESTART=<n> set: the script resumes from its checkpoint."),
    min_np: Optional[int] = typer.Option(None, help="The fewest processes a restart may have (default: all of them); "
                                         "horovod: processes, torchrun: all hosts' processes together."),
    hang_timeout: str = typer.Option("10m", help="When no rank has made progress for this long (30s, 10m, 2h; 0: "
                                     "never), every rank's stack goes in the job's folder and the job is stopped "
                                     "(or restarted)."),
) -> None:
    """Run a training script across the cluster (horovodrun, torchrun or TF workers); its output streams here."""
    if launcher not in LAUNCHERS:
        raise BadInput(f"--launcher: '{launcher}' is not a launcher", hint=f"use one of: {', '.join(LAUNCHERS)}")
    if launcher != "horovod" and np is not None:
        raise BadInput(f"--np is horovodrun's; {launcher} runs on every host",
                       hint="drop --np" + ("; --nproc-per-node sets the processes of each host"
                                           if launcher == "torchrun" else ""))
    knobs = {"--fusion-threshold-mb": fusion_threshold_mb, "--cycle-time-ms": cycle_time_ms, "--timeline": timeline,
             "--verbose-horovod": verbose_horovod or None}
    if launcher != "horovod" and (given := [flag for flag, value in knobs.items() if value is not None]):
        raise BadInput(f"{', '.join(given)}: Horovod's, and --launcher {launcher} does not start Horovod",
                       hint=f"drop {', '.join(given)}, or run the job with --launcher horovod")
    if nproc_per_node is not None and (launcher != "torchrun" or not 1 <= nproc_per_node <= 256):
        raise BadInput(f"--nproc-per-node: {nproc_per_node} is not for --launcher {launcher}" if launcher != "torchrun"
                       else f"--nproc-per-node: {nproc_per_node} is not from 1 to 256",
                       hint="use it with --launcher torchrun, from 1 to 256 (default: each host's slots)")
    hang = jobs.parse_duration(hang_timeout, "--hang-timeout")
    if not 0 <= restarts <= 100:
        raise BadInput(f"--restarts: {restarts} is not from 0 to 100", hint="give how often the job may start again")
    if restarts and launcher == "tf":
        raise BadInput("--restarts: kit does not start TF workers again (MultiWorkerMirroredStrategy fixes its "
                       "workers at start)", hint="drop --restarts; a TF job resumes from its checkpoint when run again")
    if min_np is not None and (not restarts or min_np < 1):
        raise BadInput(f"--min-np: {min_np} " + ("is below 1" if min_np < 1 else "is for a job that restarts"),
                       hint="give --restarts N with --min-np M, M from 1 to the job's processes")
    variables = jobenv.parse(env or [], env_file or [], os.environ)
    if fp16_allreduce:
        variables = (("KIT_FP16_ALLREDUCE", "1"), *((k, v) for k, v in variables if k != "KIT_FP16_ALLREDUCE"))
    with _locked(name, config) as (cfg, identity, state):  # no up or down changes the cluster under the job
        state = _need_state(cfg, identity, state)
        _check_launcher(launcher, state)
        options = HorovodOptions(fusion_threshold_mb, cycle_time_ms, timeline, verbose_horovod, start_timeout)
        _run_job(cfg, state, script, args or [], np, workdir, options, variables, _job_printer(launcher), launcher,
                 nproc_per_node, detach, jobs.Policy(restarts, min_np, hang))


def _check_launcher(launcher: str, state: st.ClusterState) -> None:
    """The cluster's image must have what the launcher starts (torch and Horovod, or TensorFlow)."""
    kind = framework(state.flavor)
    if launcher not in FRAMEWORK_LAUNCHERS[kind]:
        needs = [f for f in FLAVORS if launcher in FRAMEWORK_LAUNCHERS[framework(f)]]
        raise BadInput(f"--launcher {launcher}: cluster {state.cluster} runs {state.image}, a {state.flavor} image "
                       f"({CONTENTS[kind]})",
                       hint=f"use --launcher {' or '.join(FRAMEWORK_LAUNCHERS[kind])} on it, or bring up a cluster "
                            f"of a {' or '.join(needs)} image (another --name) for this launcher")


def _run_job(cfg: ClusterConfig, state: st.ClusterState, script: Path, args: list[str], np: Optional[int],
             workdir: Optional[Path], options: HorovodOptions, env: tuple[tuple[str, str], ...],
             on_line: Callable[[int | None, str | None, str], None], launcher: str = "horovod",
             nproc_per_node: Optional[int] = None, detach: bool = False,
             policy: jobs.Policy = jobs.Policy()) -> jobs.Job:
    """Copy the job's folder, run it, say how it ended; raise unless it succeeded. Detached: start it and return."""
    folder = (workdir or script.parent).resolve()
    if not script.is_file():
        raise BadInput(f"{script}: no such file", hint="give the path of your training script")
    if not script.resolve().is_relative_to(folder):
        raise BadInput(f"{script} is not inside --workdir {folder}", hint="put the script in the folder kit copies")
    slots = [Slot(h.name, h.address, h.slots or 1) for h in state.hosts]
    count = check_np(np, slots)
    nics = common_interfaces({h.name: [tuple(i) for i in h.interfaces] for h in state.hosts},
                             {h.name: h.address for h in state.hosts})
    rank_cmd = rank_command(script.resolve().relative_to(folder).as_posix(), args)
    if len(nics) > 1 and launcher == "horovod":
        console.print(f"[yellow]note[/] interface names differ between hosts ({', '.join(nics)}); "
                      "kit chose each by subnet and passes them all")
    nodes = recorded_nodes(state.hosts, _connect(cfg.connect_timeout))
    try:
        fanout, placed = jobs.fanout(launcher, state, nodes, slots, rank_cmd, nproc_per_node) \
            if launcher != "horovod" else ((), ())
        job = jobs.Job(jobs.new_job_id(), state, len(placed) if fanout else count, tuple(slots), tuple(nics),
                       tuple(rank_cmd), options, env, launcher, fanout, placed, nproc_per_node, policy)
        if policy.min_np is not None and policy.min_np > job.np:
            raise BadInput(f"--min-np: {policy.min_np} is more than the job's {job.np} processes",
                           hint=f"give --min-np from 1 to {job.np}")
        synced = jobs.sync_workspace(nodes, folder, state)
        console.print(f"job {job.id}: {job.np} processes on {len({r.host for r in job.ranks})} hosts; "
                      f"copied {sum(synced.sent.values())} changed files of {folder}")
        if env:
            console.print(f"environment: {escape(jobenv.shown(env))}", highlight=False)
        if detach:
            jobs.start(job, nodes)
            console.print(f"[green]✓[/] job {job.id} started (detached): `kit logs {job.id} -f` follows it, "
                          f"`kit jobs` lists it, `kit stop {job.id}` stops it" +
                          ("" if state.workspace_shared else "; what its ranks write stays on the host that wrote "
                           "it (copy storage spreads it only for a job kit run waits for)"))
            return job
        outcome = jobs.run(job, nodes, on_line)
        try:
            spread = jobs.spread_outputs(nodes, state, synced.manifests)
        except KitError as e:
            if outcome.exit_code == 0:
                raise
            spread = 0  # the job's own failure, said below, comes first; a host that went away has nothing to give
            console.print(f"[yellow]note[/] what the failed job wrote was not copied between the hosts: {escape(str(e))}")
        if spread:
            console.print(f"copied {spread} files the job wrote to every host's {state.workspace}")
    finally:
        for n in nodes:
            n.runner.close()
    if outcome.env_kept:
        console.print(f"[yellow]note[/] the job's variables may remain in the container on "
                      f"{', '.join(outcome.env_kept)} ({ENV_DIR}/{job.id}): it could not be reached to remove them; "
                      "`kit down` removes the containers")
    if outcome.leftovers:
        console.print("stopped what was left of the job: " +
                      ", ".join(f"{c} processes on {h}" for h, c in outcome.leftovers.items()))
    restarted = f" after {outcome.restarts} restart{'s' if outcome.restarts > 1 else ''}" if outcome.restarts else ""
    if outcome.exit_code == 0:
        console.print(f"[green]✓[/] job {job.id} finished{restarted}")
        return job
    if outcome.hang:
        hung = KitError(f"job {job.id} hung{restarted}: {outcome.hang}; it was stopped on every host",
                        hint=f"every rank's stack is in {job.folder}/stacks on {state.primary.name}; "
                             f"`kit logs {job.id}` shows its output")
        hung.exit_code = 1
        raise hung
    if outcome.failure:
        rank, code = outcome.failure
        how = f"exit {code}" if code != 255 else "its process, container or host went away"
        host = outcome.ranks[rank] if rank < len(outcome.ranks) else "?"
        failed = KitError(f"rank {rank} on {host} failed first ({how}); the job was stopped "
                          "on every host", hint=f"its output is above; `kit logs {job.id} --rank {rank}` shows it alone")
        failed.exit_code = code if 0 < code < 255 else 1  # the job's own exit code, as if it ran here
        raise failed
    if outcome.exit_code is None:
        raise KitError(f"job {job.id} left no exit code on {state.primary.name}: it did not start, or its container "
                       "was restarted or removed while it ran", hint=f"`kit status` shows the containers; "
                       f"`kit logs {job.id}` shows what it printed")
    program = "horovodrun" if job.launcher == "horovod" else job.launcher
    raise KitError(f"job {job.id} failed ({program} exit {outcome.exit_code})",
                   hint=f"its output is above; `kit logs {job.id}` shows it again")


@app.command()
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
    cfg_file, cfg = _cluster_cfg(config, dict(name=name))
    build = build_config(cfg_file, {})
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
        _ensure_image(connect(), make_recipe(build), verbose)
    try:
        with _timed("up", timings):
            _bring_up(cfg_file, cfg, None, nodes, dry_run=False)
        state = st.load(identity.folder)
        training, show = Training(), _job_printer("horovod")

        def on_line(rank: int | None, host: str | None, text: str) -> None:
            training.feed(rank, text)
            show(rank, host, text)
        with _timed("training", timings):
            job = _run_job(cfg, state, shipped_folder("kit.examples") / DEMO_SCRIPT,
                           ["--epochs", str(epochs), "--samples", str(samples)], None, None, HorovodOptions(), (),
                           on_line)
    finally:
        made = st.load(identity.folder)  # None when up stopped before changing anything
        if made is not None and not keep:
            with _timed("down", timings), _live() as bar:
                down_cluster(made, identity, _connect(cfg.connect_timeout), progress=LiveProgress(bar))
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


@app.command(name="exec", context_settings={"allow_interspersed_args": False})
@reports_errors
def exec_(
    host: str = typer.Argument(..., help="A host of the cluster, as in hosts.txt or by address."),
    argv: List[str] = typer.Argument(..., help="The command (after --)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Run a command in a host's container; exit with its exit code."""
    cfg, identity, state = _recorded(name, config)
    state = _need_state(cfg, identity, state)
    found = next((h for h in state.hosts if host in (h.name, h.address)), None)
    if found is None:
        raise BadInput(f"{host} is not a host of cluster {state.cluster}",
                       hint=f"use one of: {', '.join(h.name for h in state.hosts)}")
    argv = argv[1:] if argv[:1] == ["--"] else argv  # `kit exec HOST -- CMD`: the -- only ends kit's options
    (node,) = recorded_nodes([found], _connect(cfg.connect_timeout))
    try:
        code = node.runner.stream_out(command(exec_argv(found.place.container, argv)),
                                      lambda line: console.print(f"[{found.name}] {line}", markup=False))
    finally:
        node.runner.close()
    raise typer.Exit(code)


@app.command()
@reports_errors
def logs(
    job: Optional[str] = typer.Argument(None, help="Job id (default: the last job)."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Only this rank's lines."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing while the job runs."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Output of a job, kept on the primary; per rank with --rank."""
    cfg, identity, state = _recorded(name, config)
    state = _need_state(cfg, identity, state)
    primary = state.primary
    (node,) = recorded_nodes([primary], _connect(cfg.connect_timeout))
    try:
        records = {r.id: r for r in jobs.read_records(node)}
        job = jobs.check_job_id(job) if job else next(reversed(records), None)
        if job not in records:
            raise BadInput(f"no job {job or ''} on cluster {state.cluster}".replace("  ", " "),
                           hint="run one with kit run; `kit jobs` lists the cluster's jobs")
        record, folder = records[job], primary.place.job_dir(job)
        printer = _job_printer(record.launcher)
        follower = jobs.follow_command(primary.place.container, folder, job) if follow else \
            command(exec_argv(primary.place.container, ["cat", f"{folder}/output.log"]))

        hosts = list(record.hosts)

        def show(line: str) -> None:
            nonlocal hosts
            if line.startswith(jobs.END_MARK):
                return
            if (launched := jobs.launch_ranks(line)) is not None:  # a launch: the host of each of its ranks
                hosts = launched
                return
            r, text = split_rank(line)
            if (rank is None or r == rank) and exit_report(text) is None:
                printer(r, hosts[r] if r is not None and r < len(hosts) else None, text)
        node.runner.stream_out(follower, show)
    finally:
        node.runner.close()


@app.command("jobs")
@reports_errors
def jobs_(
    as_json: bool = typer.Option(False, "--json", help="One JSON object a job."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """The cluster's jobs, as their folders on the primary record them: running, ended, stopped or lost."""
    cfg, identity, state = _recorded(name, config)
    state = _need_state(cfg, identity, state)
    (node,) = recorded_nodes([state.primary], _connect(cfg.connect_timeout))
    try:
        records = jobs.read_records(node)
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
        table.add_row(row["id"], escape(row["launcher"]), str(row["np"]), escape(" ".join(row["hosts"])),
                      row["state"] + (" (hung)" if row["hang"] and row["state"] == "failed" else ""), started, _duration(row["seconds"]),
                      "" if row["exit"] is None else str(row["exit"]), escape(restarts))
    console.print(table)
    for row in rows:
        if row["hang"]:
            console.print(f"{row['id']} hung: {escape(row['hang'])}", highlight=False)


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


@app.command()
@reports_errors
def stop(
    job: str = typer.Argument(..., help="Job id (`kit jobs` lists them)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Stop a running job on every host: its launcher first, as Ctrl-C does, then whatever is left of it."""
    jobs.check_job_id(job)
    cfg, identity, state = _recorded(name, config)
    state = _need_state(cfg, identity, state)
    nodes = recorded_nodes(state.hosts, _connect(cfg.connect_timeout))
    try:
        record = next((r for r in jobs.read_records(nodes[0]) if r.id == job), None)
        if record is None:
            raise BadInput(f"no job {job} on cluster {state.cluster}", hint="`kit jobs` lists its jobs")
        if record.state not in ("running", "stopping"):
            console.print(f"job {job} is not running ({record.state}); nothing to stop")
            return
        done = jobs.stop(nodes, record.id)
    finally:
        for n in nodes:
            n.runner.close()
    killed = ", ".join(f"{c} on {h}" for h, c in done.killed.items())
    how = "its launcher stopped its ranks" if done.ended_by_itself else \
        f"its launcher did not end within {jobs.STOP_WAIT_S} s"
    console.print(f"[green]✓[/] job {job} stopped on every host: {how}; "
                  + (f"processes kit had to kill: {killed}" if killed else "nothing was left to kill"))


@app.command()
@reports_errors
def stacks(
    job: str = typer.Argument(..., help="Job id (`kit jobs` lists them)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Every rank's Python stack now (py-spy dump in each host's container): where a slow or stuck job is."""
    jobs.check_job_id(job)
    cfg, identity, state = _recorded(name, config)
    state = _need_state(cfg, identity, state)
    nodes = recorded_nodes(state.hosts, _connect(cfg.connect_timeout))
    try:
        record = next((r for r in jobs.read_records(nodes[0]) if r.id == job), None)
        if record is None:
            raise BadInput(f"no job {job} on cluster {state.cluster}", hint="`kit jobs` lists its jobs")
        if record.state not in ("running", "restarting", "stopping"):
            raise BadInput(f"job {job} is not running ({record.state})",
                           hint=f"a hung job's stacks, taken when it was stopped, are in "
                                f"{state.primary.place.job_dir(job)}/stacks on {state.primary.name}")
        found = jobs.stacks(nodes, job)
    finally:
        for n in nodes:
            n.runner.close()
    if not found:
        console.print(f"no rank of job {job} is running a Python script now")
    for (host, rank), text in sorted(found.items(), key=lambda item: item[0][1]):
        console.print(f"[bold]rank {rank} on {escape(host)}[/]")
        console.print(text, markup=False, highlight=False)


def main() -> None:
    app()
