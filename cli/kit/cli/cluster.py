"""`kit up`, `kit prepare`, `kit status`, `kit down`, `kit exec`: the cluster and its hosts."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from ipaddress import IPv4Network
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kit.cluster import state as st
from kit.image.build import connect
from kit.cluster.lifecycle import (HostStatus, ImageChoice, Up, kept_settings, down as down_cluster,
                                   status as cluster_status, what_may_remain, where_to_bring_up)
from kit.config.settings import ClusterConfig, ConfigFile, requested_flavor
from kit.jobs.commands.docker import command, exec_argv
from kit.errors import BadInput, KitError
from kit.cluster.fanout import fan_out
from kit.cluster.identity import Identity, new_munge_key, state_root, write_secret
from kit.config.hosts import Host, read_hosts
from kit.cluster.lock import cluster_lock
from kit.cluster.local import LOCAL_NODES, check_count, docker_subnets, free_subnet, local_cluster, network_name, routes
from kit.cluster import prepare as prepare_hosts
from kit.cluster.steps.image import layers
from kit.cluster.steps.network import EARLIER
from kit.cluster.steps.node import Node
from kit.shown import visible
from kit.cluster.steps.preflight import recorded_nodes
from kit.cli.flavor import UpImage
from kit.cli.common import (CONFIG, NAME, LiveProgress, app, cluster_settings, connector, console, err_console, locked,
                            need_state, progress_bar, recorded, recorded_clusters, reports_errors)


def _print_changes(nodes: list[Node], dry_run: bool) -> None:
    for n in nodes:
        planned = getattr(n.runner, "planned", None)
        lines = planned if dry_run else n.changes
        if not lines:
            console.print(f"  {escape(n.name)}: no change")
        for line in lines:
            console.print(f"  {escape(n.name)}: {escape(line)}")

def _print_notes(nodes: list[Node]) -> None:
    """Each note once, with the hosts it applies to."""
    by_note: dict[str, list[str]] = {}
    for n in nodes:
        for note in n.notes:
            by_note.setdefault(note, []).append(n.name)
    for note, hosts in by_note.items():
        console.print(f"  [yellow]note[/] ({escape(', '.join(hosts))}): {escape(note)}")


@app.command(short_help="Bring the cluster's containers up on every host")
@reports_errors
def up(
    hosts: Optional[Path] = typer.Option(None, "--hosts", help="hosts.txt: one host a line (host, host:slots, "
                                                                 "user@host...). Without it: the hosts the cluster "
                                                                 "was brought up on, or a local cluster when it has "
                                                                 "none."),
    local: bool = typer.Option(False, "--local", help="A cluster of containers on this machine (the default when "
                                                      "no cluster of this name is recorded on servers)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Containers of the local cluster (default: as many "
                                                                 "as it has, else 3)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    ssh_port: Optional[int] = typer.Option(None, help="Port of the containers' sshd (default 12345)."),
    workspace: Optional[str] = typer.Option(None, help="Folder mounted at the same path in every container."),
    shm_size: Optional[str] = typer.Option(None, help="Size of /dev/shm (default: share the host's IPC)."),
    image_tag: Optional[str] = typer.Option(None, help="Image to run (default: the one kit build makes)."),
    dry_run: bool = typer.Option(False, help="Check the hosts and print what would change; change nothing."),
) -> None:
    """Bring the cluster up: keys, image, containers on every host, then verify it.

    Without --hosts, on the hosts it was brought up on before; a cluster that has none (or --local) is N containers
    on this machine, on a private Docker network. A left-out flag never removes a cluster from its hosts."""
    flags = dict(name=name, ssh_port=ssh_port, workspace=workspace, shm_size=shm_size, image_tag=image_tag)
    cfg_file, cfg = cluster_settings(config, flags)
    with cluster_lock(cfg.name):
        state = st.load(Identity(cfg.name, persist=False).folder)
        where = where_to_bring_up(state, cfg.name, hosts is not None, local, nodes, LOCAL_NODES)
        if where.recorded:
            console.print(f"cluster {cfg.name} was brought up on {', '.join(h.name for h in where.recorded)}: "
                          "bringing it up there (--hosts FILE changes its hosts)")
        given = {k for k, v in flags.items() if v is not None} | set(cfg_file.sections.get("cluster", {}))
        if kept := kept_settings(state, cfg, given):
            console.print(f"cluster {cfg.name} keeps the settings it was brought up with: "
                          + ", ".join(f"{k} {v if v is not None else 'not set'}" for k, v in kept.items())
                          + " (a flag or kit.yaml changes them)")
            cfg = cfg.model_copy(update=kept)
        bring_up(cfg_file, cfg, hosts, where.count, dry_run, where.recorded)


def bring_up(cfg_file: ConfigFile, cfg: ClusterConfig, hosts: Optional[Path], count: Optional[int], dry_run: bool,
             recorded: Optional[list[Host]] = None) -> None:
    """Up on the hosts of a hosts file, on recorded hosts, or (neither) as a local cluster of count containers."""
    inventory = read_hosts(hosts) if hosts is not None else recorded
    count = check_count(count) if inventory is None else count  # bad input is found before anything is contacted
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
    choice = UpImage(client, cfg_file, cfg, dry_run)  # the flavor follows the hosts' GPUs (build.flavor auto)
    identity = Identity(cfg.name, persist=not dry_run)
    with progress_bar() as bar:
        cache = state_root() / ".images"
        choice.bar = bar
        workflow = Up(cfg, ImageChoice(choice.flavor, choice.image), identity,
                      layers=lambda start: layers(client, workflow.image, cache, start),
                      connect=connector(cfg.connect_timeout), places=places, dry_run=dry_run,
                      progress=LiveProgress(bar), network_where=cfg_file.where("cluster", "network") + ": cluster.network"
                      if "network" in cfg_file.sections.get("cluster", {}) else "cluster.network")
        nodes = workflow.run(inventory)
    changed = any(n.changes for n in nodes + workflow.left) or dry_run
    where = f"on this machine in {len(nodes)} containers" if all(h.local for h in inventory) else \
        f"on {len(nodes)} hosts"
    console.print(("[bold]plan[/] (dry run: nothing was changed)" if dry_run else
                   f"[green]✓[/] cluster {cfg.name} is up {where}" + ("" if changed else ": no change")))
    if changed:
        _print_changes(nodes, dry_run)
    for n in workflow.left:
        console.print(f"  {escape(n.name)} (no longer in hosts.txt): {escape('; '.join(n.changes) or 'nothing of the cluster was there')}")
    if workflow.sent and not dry_run:
        console.print(escape(f"  {workflow.sent}").replace("\n", "\n  "))
    if workflow.network is not None and not all(h.local for h in inventory):
        _print_network(workflow.network, len(nodes), workflow.network_note)
    _print_notes(nodes)


def _print_network(decision, hosts: int, note: str) -> None:
    """The training network in one line; each network that misses hosts, and why it was left."""
    console.print(f"  {visible(decision.summary(hosts, earlier=note == EARLIER))}", markup=False, highlight=False)
    for line in decision.unjoined:
        console.print(f"  [yellow]note[/] {escape(visible(line))}: not used" + (
            " (a firewall on the way? `kit prepare --hosts hosts.txt` opens the cluster's ports on each network of the "
            "hosts: run it again after adding one)" if "timed out" in line else ""))
    for line in [*decision.warnings, *([note] if note and note != EARLIER else [])]:
        console.print(f"  [yellow]note[/] {escape(visible(line))}")


def _local_subnet(client, cfg: ClusterConfig) -> IPv4Network:
    """The local cluster's network keeps its subnet; a new one gets a /24 nothing here uses."""
    networks = client.networks.list()
    kept = docker_subnets([n.attrs for n in networks if n.name == network_name(cfg)])
    taken = routes(Path("/proc/net/route").read_text()) + docker_subnets([n.attrs for n in networks])
    return kept[0] if kept else free_subnet(taken)


@app.command(short_help="Set up hosts with Ansible: Docker, NVIDIA, firewall")
@reports_errors
def prepare(
    hosts: Path = typer.Option(..., "--hosts", help="hosts.txt: the hosts to prepare."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change (Ansible check mode); change "
                                                          "nothing."),
    check: bool = typer.Option(False, "--check", hidden=True, help="The same as --dry-run (its former name)."),
    storage: Optional[str] = typer.Option(None, help="copy, sshfs or nfs (default: cluster.storage in kit.yaml)."),
    nfs_server: Optional[str] = typer.Option(None, help="An existing NFS export, server:/path (default: "
                                                        "cluster.nfs_server; without one the primary exports)."),
    slurm: bool = typer.Option(False, "--slurm", help="Also make the hosts a Slurm cluster: munge with one key, "
                                                     "slurmctld on the primary, slurmd on every host."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Prepare the hosts with Ansible: Docker, NVIDIA Container Toolkit (hosts with NVIDIA GPUs), firewall, NFS or
    sshfs; with --slurm, Slurm and munge from the distribution's packages, configured from the hosts' facts."""
    check = check or dry_run
    cfg_file, cfg = cluster_settings(config, dict(name=name, storage=storage, nfs_server=nfs_server))
    inventory = read_hosts(hosts)
    program = prepare_hosts.ansible_playbook()
    reach_all(inventory, cfg.connect_timeout)  # a host kit cannot reach is one line with its fix, not Ansible's
    from kit.runners.ssh import ssh_hostname
    addresses = {h.name: prepare_hosts.resolve(h, ssh_hostname(h)) for h in inventory}
    with tempfile.TemporaryDirectory(prefix="kit-prepare-") as folder:
        key = Identity(cfg.name, persist=not check).munge_key() if slurm else None
        if key and not key.exists():  # --dry-run before the cluster's key was made: a stand-in, never kept
            key = Path(folder) / "munge.key"
            write_secret(key, new_munge_key())
        data = prepare_hosts.inventory(inventory, addresses, cfg, gpu=requested_flavor(cfg_file)[0] in ("gpu", "tf-gpu"),
                                       munge_key=key)
        argv = prepare_hosts.playbook_argv(program, prepare_hosts.write_inventory(Path(folder), data), check=check)
        console.print(f"running {shlex.join(argv)}", style="dim")
        code = run_playbook(argv, {"ANSIBLE_PIPELINING": "1", **os.environ, "ANSIBLE_NOCOLOR": "1",
                                   "ANSIBLE_RETRY_FILES_ENABLED": "0"})
    if code != 0:
        raise KitError(f"ansible-playbook failed (exit {code}) on the hosts named in its recap above",
                       hint="fix what its failed tasks say, then run kit prepare again (it skips what is done)")
    console.print("[green]✓[/] " + ("check mode: nothing was changed" if check else "hosts are prepared"))
    if slurm and not check:
        record_login(cfg_file, next(h for h in inventory if h.primary))


def record_login(cfg_file: ConfigFile, primary: Host) -> None:
    """After kit prepare --slurm: kit.yaml's slurm.login, where it names none, is the primary (slurmctld's host) as
    hosts.txt reaches it: kit run --on slurm submits there, and kit export --to venv writes the nodes' Python there."""
    from kit.config.settings import set_setting
    if (cfg_file.sections.get("slurm") or {}).get("login"):
        return
    login = f"{primary.user}@{primary.name}" if primary.user else primary.name
    where = cfg_file.path or "./kit.yaml"
    if primary.port not in (None, 22):  # (login is host or user@host: its port comes from ~/.ssh/config)
        console.print(f"kit: to submit jobs from here, add `slurm: {{login: ALIAS}}` to {where}, ALIAS a Host of your "
                      f"~/.ssh/config with HostName {primary.name} and Port {primary.port}", highlight=False,
                      markup=False)
        return
    try:
        path = set_setting(cfg_file, "slurm", "login", login)
    except BadInput as e:  # (a flow-style slurm section, or a name slurm.login does not take)
        console.print(f"kit: to submit jobs from here, {e.hint}", highlight=False, markup=False)
        return
    console.print(f"kit: {path}'s slurm.login is now {login}, the primary: kit run --on slurm submits there, and kit "
                  "export --to venv -o DIR writes the nodes' Python there", highlight=False, markup=False)


def reach_all(inventory: list[Host], timeout: int) -> None:
    """Connect to every host at once, as kit up does, before Ansible starts: a host that cannot be reached is named,
    with what went wrong and the fix (HostsFailed), and nothing is changed anywhere."""
    connect = connector(timeout)

    def reach(host: Host) -> None:
        runner = connect(host)
        try:
            runner.run("true", timeout=timeout * 3).check("cannot run a command over SSH")
        finally:
            runner.close()
    fan_out("connecting", inventory, reach, lambda h: h.label)


def run_playbook(argv: list[str], env: dict[str, str]) -> int:
    """ansible-playbook's exit code; its output as it comes, through kit.shown as all remote text: the hosts' own text
    is in it (a failed task's stderr), and ansible writes a C1 or U+2028 of it as it is."""
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, encoding="utf-8",
                          errors="replace") as playbook:
        for line in playbook.stdout:
            console.print(line.rstrip("\n"), markup=False)
    return playbook.returncode


@app.command(short_help="Each host: reachable, container, image, port")
@reports_errors
def status(
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Each host of the cluster: reachable, container, image, port, GPUs."""
    cfg, identity, state = recorded(name, config)
    state = need_state(cfg, identity, state)
    rows = cluster_status(state, connector(cfg.connect_timeout), identity.owner)
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
                      escape(r.container), mark(r.image_matches), "listening" if r.port_listening else "closed",
                      str(r.gpus), str(r.slots))
    console.print(table)


@app.command(short_help="Remove exactly what kit up made")
@reports_errors
def down(
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
    dry_run: bool = typer.Option(False, help="Print what would be removed; remove nothing."),
    force: bool = typer.Option(False, help="Forget hosts that cannot be cleaned (gone for good), saying what "
                                           "may be left there."),
) -> None:
    """Remove exactly what `kit up` made: containers, kit's folders and files. Safe to run twice."""
    with locked(name, config) as (cfg, identity, state):
        if state is None:
            others = st.all_recorded(identity.folder.parent)
            console.print(f"nothing to remove: no cluster {cfg.name} is recorded here ({identity.folder})"
                          + (f"; recorded: {escape(recorded_clusters(others))}" if others else ""))
            return
        with progress_bar() as bar:
            done = down_cluster(state, identity, connector(cfg.connect_timeout), dry_run=dry_run, force=force,
                                progress=LiveProgress(bar))
    console.print("[bold]plan[/] (dry run: nothing was removed)" if dry_run else
                  f"[green]✓[/] cluster {cfg.name} is down; images were kept on the hosts"
                  + (f", except on {len(done.forgotten)} forgotten" if done.forgotten else ""))
    _print_changes([n for n in done.nodes if n.name not in done.forgotten], dry_run)
    for host, why in done.forgotten.items():
        err_console.print(f"[yellow]forgot[/] {escape(host)} ({escape(why.message)}): what kit made there may "
                          f"remain: {escape(what_may_remain(state.host(host)))}; remove it by hand if "
                          "the host comes back")


@app.command(name="exec", context_settings={"allow_interspersed_args": False},
             short_help="Run a command in a host's container")
@reports_errors
def exec_(
    host: str = typer.Argument(..., help="A host of the cluster, as in hosts.txt or by address."),
    argv: List[str] = typer.Argument(..., help="The command (after --)."),
    interactive: bool = typer.Option(False, "--interactive", "-i", help="Pass this terminal's input to the command."),
    tty: bool = typer.Option(False, "--tty", "-t", help="Give the command a terminal (a shell: kit exec -it HOST -- "
                                                        "bash)."),
    config: Optional[Path] = CONFIG,
    name: Optional[str] = NAME,
) -> None:
    """Run a command in a host's container, as docker exec does: its output byte for byte (kit exec h -- cat f > f),
    its exit code."""
    cfg, identity, state = recorded(name, config)
    state = need_state(cfg, identity, state)
    found = next((h for h in state.hosts if host in (h.name, h.address)), None)
    if found is None:
        raise BadInput(f"{host} is not a host of cluster {state.cluster}",
                       hint=f"use one of: {', '.join(h.name for h in state.hosts)}")
    argv = argv[1:] if argv[:1] == ["--"] else argv  # `kit exec HOST -- CMD`: the -- only ends kit's options
    options = (*(["-i"] if interactive else []), *(["-t"] if tty else []))
    (node,) = recorded_nodes([found], connector(cfg.connect_timeout))
    try:  # raw, not through kit.shown: the user's own command in their own session (a shell, cat f > f), as ssh is
        code = node.runner.interact(command(exec_argv(found.place.container, argv, options)),
                                    stdin=sys.stdin.buffer if interactive else None, stdout=sys.stdout.buffer,
                                    stderr=sys.stderr.buffer, tty=tty)
    except KeyboardInterrupt:
        code = 130
    finally:
        node.runner.close()
    raise typer.Exit(code)
