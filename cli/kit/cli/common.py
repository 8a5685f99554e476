"""What every command shares: the Typer app, the consoles, the error report (KitError -> exit 1, BadInput ->
exit 2), the --config/--name options and the cluster's recorded state. Only kit.cli prints for the user and exits."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup
from rich.markup import escape
from rich.progress import (BarColumn, DownloadColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)
from rich.text import Text

from kit.cluster import state as st
from kit import redact
from kit.config.settings import ClusterConfig, ConfigFile, cluster_config, read_config
from kit.errors import BadInput, KitError
from kit.cluster.identity import Identity
from kit.cluster.lock import cluster_lock
from kit.runners.local import LocalRunner
from kit.shown import visible


# `kit --help` lists the commands in the order of a user's work; a name not here is left out of the order (a command
# another branch has not added yet), a command not named here comes at the end.
WORKFLOW = ("prepare", "build", "up", "status", "run", "jobs", "logs", "attach", "stop", "stacks", "exec", "cp",
            "export", "push", "doctor", "bench", "down", "demo")

# What each option's or argument's value is, in help and usage lines (instead of Typer's <str>, <list[str]>, TEXT):
# by the parameter's name, or by (command, name) where one name means two things.
METAVARS = {
    "config": "KIT_YAML", "name": "CLUSTER", "hosts": "HOSTS_FILE", ("bench train", "hosts"): "COUNTS",
    ("run", "hosts"): "HOST[:SLOTS],...", "job": "JOB", "script": "SCRIPT", "args": "ARGS", "host": "HOST",
    "argv": "COMMAND", "env": "NAME[=VALUE]", "env_file": "FILE", "workdir": "FOLDER", "wheelhouse": "FOLDER",
    "workspace": "FOLDER", "ca_bundle": "PEM_FILE", "timeline": "FILE", "launcher": "horovod|torchrun|tf",
    "storage": "copy|sshfs|nfs", "backend": "horovod|torch|all", "hang_timeout": "DURATION",
    "start_timeout": "SECONDS", "seconds": "SECONDS", "rank": "RANK", "ssh_port": "PORT", "shm_size": "SIZE",
    "min_size": "SIZE", "max_size": "SIZE", "image_tag": "IMAGE:TAG", "image": "REPOSITORY",
    "base_image": "IMAGE", "builder_image": "IMAGE", "python": "VERSION", "torch": "VERSION", "cuda": "VERSION",
    "horovod_version": "VERSION", "tensorflow": "VERSION", "torch_index_url": "URL", "index_url": "URL",
    "horovod_source": "PIP_URL", "pip": "PACKAGE", "apt": "PACKAGE", "cuda_arch": "CAPABILITY",
    "nfs_server": "SERVER:/PATH", "fusion_threshold_mb": "MB", "cycle_time_ms": "MS", "link_gbits": "GBITS",
}
_BY_TYPE = {int: "N", float: "NUMBER", Path: "PATH"}


def metavar(command: str, param) -> str:
    """A parameter's metavar: from METAVARS, else from its type (N for a count), else its name in capitals."""
    found = METAVARS.get((command, param.name)) or METAVARS.get(param.name)
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return found or _BY_TYPE.get(annotation) or (param.name or "value").upper()


def readable(command, path: str = "") -> None:
    """Every parameter of command (and of its subcommands) gets a metavar that says what it is."""
    for param in command.params:
        if param.metavar is None and not getattr(param, "is_flag", False) and not getattr(param, "count", False):
            param.metavar = metavar(path, param)
        if param.param_type_name == "argument" and hasattr(param, "display_type_rich"):
            # Typer >= 0.2x writes `NAME <type>` and `{NAME}`: the metavar says it, as click writes it
            param.display_type_rich = lambda ctx: None
            param.get_usage_pieces = lambda ctx, p=param: [
                (p.metavar if p.required else f"[{p.metavar}]") + ("..." if p.nargs != 1 else "")]
    for name, sub in getattr(command, "commands", {}).items():
        readable(sub, f"{path} {name}".strip())


class KitGroup(TyperGroup):
    """kit's command group: its commands in WORKFLOW order, every parameter with a readable metavar."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        readable(self)

    def list_commands(self, ctx) -> list[str]:
        names = list(super().list_commands(ctx))
        order = [n for n in WORKFLOW if n in names]
        return order + [n for n in names if n not in order]


app = typer.Typer(cls=KitGroup, no_args_is_help=True, rich_markup_mode=None,
                  help="Turn a few Linux servers into a Horovod / PyTorch cluster of Docker containers.")


class ShownConsole(Console):
    """A console whose every string (console.print's, a table cell's) passes kit.shown.visible first: text of a host
    or a job in it reaches the terminal with its control characters made visible, its lines capped. Rich markup in
    remote text is still the caller's to escape (rich.markup.escape, or print with markup=False). Text a Rich object
    makes itself (a status spinner's, a progress column's) does not pass here: its callers use visible()."""

    def render_str(self, text: str, **options):
        return super().render_str(visible(text), **options)

    def print_json(self, *args, ensure_ascii: bool = True, **options) -> None:
        """JSON of remote text (--json of status, doctor, bench): a C1 or U+2028 in it as \\u009b, not as is."""
        super().print_json(*args, ensure_ascii=ensure_ascii, **options)


# soft_wrap: long lines (Dockerfile, commands) stay whole, so they can be copied. No emoji: `-H a:x:` is no icon.
console = ShownConsole(highlight=False, soft_wrap=True, emoji=False)
err_console = ShownConsole(stderr=True, highlight=False, soft_wrap=True, emoji=False)


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
            _report(KitError(f"kit failed unexpectedly: {type(e).__name__}: {redact.text(str(e))}",
                             hint="this is a bug in kit: run the command again with KIT_DEBUG=1 for the traceback, "
                                  "and report it"))

    return wrapper


def one_of(*values: str) -> Callable[[str], list[str]]:
    """Shell completion for an option that takes one of these values."""
    return lambda incomplete: [v for v in values if v.startswith(incomplete)]


# The running command's own addition to a BadInput's fix, where it has one: the error -> more of the fix, or None
# (kit run's, for an option of kit's given after the script: it may be the script's).
BAD_INPUT_HINT: contextvars.ContextVar[Callable[[BadInput], Optional[str]] | None] = \
    contextvars.ContextVar("kit_bad_input_hint", default=None)


def _report(e: KitError) -> None:
    if isinstance(e, BadInput) and (more := BAD_INPUT_HINT.get()) and (extra := more(e)):
        e.hint = f"{e.hint}; or, {extra}" if e.hint else extra
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
        from kit import __version__
        console.print(f"kit {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print kit's version."),
) -> None:
    pass


CONFIG = typer.Option(None, "--config", "-c", help="kit.yaml to read (default ./kit.yaml).")
NAME = typer.Option(None, "--name", help="Cluster name (default kit).")


class LiveProgress:
    """A live line per host (what it is doing) and, while the image reaches it, a bar with bytes, rate and ETA."""

    def __init__(self, progress) -> None:
        self.bar = progress
        self.tasks: dict[str, int] = {}

    def _task(self, host: str) -> int:
        if host not in self.tasks:
            self.tasks[host] = self.bar.add_task(host, total=None, what="")
        return self.tasks[host]

    def status(self, host: str, text: str) -> None:
        self.bar.update(self._task(host), what=escape(visible(text, one_line=True)))  # a column of Rich markup

    def transfer(self, host: str, done: int, total: int) -> None:
        self.bar.update(self._task(host), completed=done, total=total)


class _WhileCopying(ProgressColumn):
    """A column shown only for hosts that are being sent the image."""

    def __init__(self, column: ProgressColumn) -> None:
        super().__init__()
        self.column = column

    def render(self, task):
        return self.column.render(task) if task.total else Text("")


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description:<24}"), TextColumn("{task.fields[what]:<32}"),
                    _WhileCopying(BarColumn()), _WhileCopying(DownloadColumn()), _WhileCopying(TransferSpeedColumn()),
                    _WhileCopying(TimeRemainingColumn()), console=console)


def connector(timeout: int):
    """How kit reaches a host: over SSH, or directly for a container of the local cluster (which needs no SSH client:
    paramiko and fabric are imported only for hosts over SSH, a good part of a command's start)."""
    def connect(host):
        if host.local:
            return LocalRunner(host.name)
        from kit.runners.ssh import SshRunner
        return SshRunner(host, connect_timeout=timeout)
    return connect


def cluster_settings(config: Optional[Path], flags: dict) -> tuple[ConfigFile, ClusterConfig]:
    cfg_file = read_config(config)
    return cfg_file, cluster_config(cfg_file, flags)


@contextlib.contextmanager
def locked(name: Optional[str], config: Optional[Path]):
    """(cluster settings, identity, recorded state) read while holding the cluster's lock (kit.cluster.lock)."""
    _, cfg = cluster_settings(config, dict(name=name))
    with cluster_lock(cfg.name):
        identity = Identity(cfg.name)
        yield cfg, identity, st.load(identity.folder)


def recorded(name: Optional[str], config: Optional[Path]) -> tuple[ClusterConfig, Identity, st.ClusterState | None]:
    _, cfg = cluster_settings(config, dict(name=name))
    identity = Identity(cfg.name)
    return cfg, identity, st.load(identity.folder)


@dataclasses.dataclass(frozen=True)
class Where:
    """What a job command names (--config, --name): the cluster's settings, and its state as recorded here (None:
    no such cluster is; a job of a scheduler's needs none)."""

    config: Optional[Path]
    name: Optional[str]
    cfg: ClusterConfig
    identity: Identity
    state: Optional[st.ClusterState]


def where(name: Optional[str], config: Optional[Path]) -> Where:
    return Where(config, name, *recorded(name, config))


def print_hangs(rows: list[dict]) -> None:
    """Under a table of `kit jobs`, each hung job's report, and the stragglers kit named in each job (a rank's text:
    shown, never markup)."""
    for row in rows:
        if row.get("hang"):
            console.print(f"{escape(row['id'])} hung: {escape(visible(row['hang'], one_line=True))}", highlight=False)
        for line in (row.get("straggler") or "").splitlines():
            console.print(f"{escape(row['id'])} {escape(visible(line, one_line=True))}", highlight=False)


def need_state(cfg: ClusterConfig, identity: Identity, state: st.ClusterState | None) -> st.ClusterState:
    if state is None:
        raise not_recorded(cfg.name, identity)
    return state


def not_recorded(name: str, identity: Identity, hint: str = "bring one up: kit up --hosts hosts.txt") -> BadInput:
    """A cluster that is not recorded on this control machine, with the ones that are (and how to name one); hint:
    the fix when none is."""
    root = identity.folder.parent
    found = st.all_recorded(root)
    if not found:
        return BadInput(f"no cluster {name} is recorded here: {root} holds none", hint=hint)
    first = found[0].cluster
    return BadInput(f"no cluster {name} is recorded here; recorded: {recorded_clusters(found)}",
                    hint=f"name it: --name {first}" + (" (or another of those)" if len(found) > 1 else "")
                         + f", or cluster.name: {first} in kit.yaml")


def recorded_clusters(found: list[st.ClusterState]) -> str:
    """alice (3 hosts), demo (local)"""
    def where(state: st.ClusterState) -> str:
        if state.hosts and all(h.local for h in state.hosts):
            return "local"
        return f"{len(state.hosts)} host{'s' if len(state.hosts) != 1 else ''}"
    return ", ".join(f"{state.cluster} ({where(state)})" for state in found)
