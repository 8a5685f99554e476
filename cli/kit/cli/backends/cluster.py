"""kit's SSH cluster as a back end of `kit run` (kit.jobs.model.Backend): a job under its supervisor in the primary's
container (kit.backends.cluster), its output kept there, its records in the job folders; `kit logs`, `kit attach`,
`kit stacks`, `kit jobs` and `kit stop` for its jobs."""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import time
from pathlib import Path
from typing import Callable, Optional

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kit.cluster import state as st
from kit.cluster.steps.preflight import recorded_nodes
from kit.config.settings import CONTENTS, FLAVORS, ClusterConfig, framework, uses_gpus
from kit.jobs import env as jobenv
from kit.jobs.model import COMMON, Job, Policy, new_job_id, resolve_job
from kit.jobs.commands.launchers import FRAMEWORK_LAUNCHERS
from kit.backends.cluster import control as jobcontrol
from kit.backends.cluster import records as jobrecords
from kit.backends.cluster import run as jobs
from kit.jobs.commands.horovod import (ENV_DIR, HorovodOptions, Slot, check_knobs, check_np, exit_report, parse_hosts,
                                       pick_hosts, rank_command, split_rank)
from kit.network import measure
from kit.doctor import deep
from kit.errors import BadInput, KitError
from kit.shown import visible
from kit.cli.common import Where, connector, console, locked, need_state, print_hangs


class Cluster:
    """kit's cluster: the hosts of `kit up`."""

    name = "cluster"
    title = "kit's cluster"
    options = COMMON | {"np", "hosts", "nproc_per_node", "workdir", "fusion_threshold_mb", "cycle_time_ms",
                        "fp16_allreduce", "timeline", "verbose_horovod", "start_timeout", "restarts", "min_np",
                        "hang_timeout", "straggler_window", "preflight", "exclude_bad"}
    placement = "-np and -H place a job on the cluster's hosts"
    commands = frozenset({"attach", "stacks", "ranks"})

    def run(self, job: Job) -> None:
        launcher = job.launcher
        picked = parse_hosts(job.hosts) if job.hosts is not None else None
        if launcher != "horovod" and job.np is not None:
            raise BadInput(f"--np is horovodrun's; {launcher} runs on every host",
                           hint="drop --np" + ("; --nproc-per-node sets the processes of each host"
                                               if launcher == "torchrun" else ""))
        fusion, cycle = job.option("fusion_threshold_mb"), job.option("cycle_time_ms")
        timeline, verbose = job.option("timeline"), job.option("verbose_horovod")
        check_knobs(fusion, cycle)
        knobs = {"--fusion-threshold-mb": fusion, "--cycle-time-ms": cycle, "--timeline": timeline,
                 "--verbose-horovod": verbose or None}
        if launcher != "horovod" and (given := [flag for flag, value in knobs.items() if value is not None]):
            raise BadInput(f"{', '.join(given)}: Horovod's, and --launcher {launcher} does not start Horovod",
                           hint=f"drop {', '.join(given)}, or run the job with --launcher horovod")
        per_node = job.nproc_per_node
        if per_node is not None and (launcher != "torchrun" or not 1 <= per_node <= 256):
            raise BadInput(f"--nproc-per-node: {per_node} is not for --launcher {launcher}" if launcher != "torchrun"
                           else f"--nproc-per-node: {per_node} is not from 1 to 256",
                           hint="use it with --launcher torchrun, from 1 to 256 (default: each host's slots)")
        job.policy.check(launcher)
        variables = jobenv.parse(list(job.env), list(job.env_files), os.environ)
        if job.option("fp16_allreduce"):
            variables = (("KIT_FP16_ALLREDUCE", "1"), *((k, v) for k, v in variables if k != "KIT_FP16_ALLREDUCE"))
        if job.option("exclude_bad") and not job.option("preflight"):
            raise BadInput("--exclude-bad: it leaves out the hosts the preflight names",
                           hint="give --preflight with it")
        np = job.np
        with locked(job.name, job.config) as (cfg, identity, state):  # no up or down changes the cluster under it
            state = need_state(cfg, identity, state)
            _check_launcher(launcher, state)
            if job.option("preflight"):
                picked, np = preflight(cfg, state, picked, np, job.option("exclude_bad"), identity.folder)
            options = HorovodOptions(fusion, cycle, timeline, verbose, job.option("start_timeout"))
            run_job(cfg, state, job.script, list(job.args), np, job.workdir, options, variables,
                    job_printer(launcher), launcher, per_node, job.detach, job.policy, hosts=picked,
                    secrets=job.env_files)

    def find(self, ref: str, where: Where) -> Optional[str]:
        """The cluster's jobs are read from the primary when a command uses one: any reference may be one."""
        return ref

    def logs(self, ref: str, where: Where, rank: Optional[int], follow: bool, tail: Optional[int]) -> None:
        state = need_state(where.cfg, where.identity, where.state)
        primary = state.primary
        (node,) = recorded_nodes([primary], connector(where.cfg.connect_timeout))
        try:
            records = {r.id: r for r in jobrecords.read_records(node, ref)}
            job = resolve_job(ref, list(records), state.cluster)
            shown = _LogLines(job_printer(records[job].launcher), list(records[job].hosts), rank, tail)
            folder = primary.place.job_dir(job)
            read = 0
            if not follow or tail is not None:  # what is there now; the last `tail` lines of it
                read = _read_lines(node, jobcontrol.log_command(primary.place.container, folder), shown)
                shown.flush()
            if follow:  # (a line being written when it was read is shown cut; the rest of it is not)
                node.runner.stream_out(jobcontrol.follow_command(primary.place.container, folder, job,
                                                                 first=read + 1), shown.add)
        finally:
            node.runner.close()

    def attach(self, ref: str, where: Where) -> None:
        with the_job(ref, where) as (state, nodes, record):
            outcome = jobs.follow_to_end(nodes, record.id, list(record.hosts), job_printer(record.launcher))
        report(outcome, record.id, record.launcher, state)

    def stacks(self, ref: str, where: Where) -> None:
        with the_job(ref, where) as (state, nodes, record):
            job = record.id
            _running(record, "stacks", f"a hung job's stacks, taken when it was stopped, are in "
                                       f"{state.primary.place.job_dir(job)}/stacks on {state.primary.name}")
            found = jobcontrol.stacks(nodes, job)
        if not found:
            console.print(f"no rank of job {job} is running a Python script now")
        for (host, rank), text in sorted(found.items(), key=lambda item: item[0][1]):
            console.print(f"[bold]rank {rank} on {escape(host)}[/]")
            console.print(visible(text), markup=False, highlight=False)

    def ranks(self, ref: str, where: Where, measure: Callable) -> tuple[str, list]:
        """(the job's id, each rank's pace): measure(read) reads its ranks' heartbeats twice, on every host."""
        with the_job(ref, where) as (state, nodes, record):
            _running(record, "ranks")
            return record.id, measure(lambda: jobcontrol.beats(nodes, record.id, record.hosts))

    def stop(self, ref: str, where: Where) -> str:
        with the_job(ref, where) as (state, nodes, record):
            job = record.id
            if record.state not in jobrecords.ACTIVE and not record.unsettled:
                return f"job {job} is not running ({record.state}); nothing to stop"
            if record.state not in jobrecords.ACTIVE:  # its end did not settle: swept again, every host
                swept = jobcontrol.sweep(nodes, job, strict=True)
                return _unsettled(job, swept.unsettled) or (
                    f"[green]✓[/] nothing of job {job} is left on any host"
                    + (f" (stopped {', '.join(f'{c} on {h}' for h, c in swept.killed.items())})" if swept.killed else "")
                    + ": jobs start there again")
            done = jobcontrol.stop(nodes, record.id)
        killed = ", ".join(f"{c} on {h}" for h, c in done.killed.items())
        how = "its launcher stopped its ranks" if done.ended_by_itself else \
            f"its launcher did not end within {jobcontrol.STOP_WAIT_S} s"
        return _unsettled(job, done.unsettled) or (
            f"[green]✓[/] job {job} stopped on every host: {how}; "
            + (f"processes kit had to kill: {killed}" if killed else "nothing was left to kill"))

    def rows(self, where: Where) -> list[dict]:
        """The cluster's jobs, as their folders on the primary record them (none where no cluster is recorded)."""
        if where.state is None:
            return []
        (node,) = recorded_nodes([where.state.primary], connector(where.cfg.connect_timeout))
        try:
            records = jobrecords.read_records(node)
        finally:
            node.runner.close()
        now = time.time()
        return [dict(id=r.id, launcher=r.launcher, np=len(r.hosts), hosts=sorted(set(r.hosts)), state=r.state,
                     started=r.started, seconds=r.seconds(now), exit=r.exit_code, restarts=r.restarts,
                     left_out=list(r.left_out), hang=r.hang, straggler=r.straggler, environment=r.environment)
                for r in records]

    def show(self, rows: list[dict]) -> None:
        table = Table(box=None, pad_edge=False)
        for column in ("job", "launcher", "np", "hosts", "state", "started", "duration", "exit", "restarts"):
            table.add_column(column)
        for row in rows:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["started"])) if row["started"] else "?"
            restarts = str(row["restarts"] or "") + (f" (left out {' '.join(row['left_out'])})"
                                                     if row["left_out"] else "")
            table.add_row(escape(row["id"]), escape(row["launcher"]), str(row["np"]), escape(" ".join(row["hosts"])),
                          escape(row["state"]) + (" (hung)" if row["hang"] and row["state"] == "failed" else ""),
                          started, _duration(row["seconds"]), "" if row["exit"] is None else str(row["exit"]),
                          escape(restarts))
        console.print(table)
        print_hangs(rows)


def job_printer(launcher: str) -> Callable[[int | None, str | None, str], None]:
    """Prints a job's line: a rank's with its host and rank, the launcher's own with the launcher's name."""
    label = "[horovodrun]" if launcher == "horovod" else f"[{launcher}]"

    def show(rank: int | None, host: str | None, text: str) -> None:
        prefix = f"[{host} rank {rank}] " if rank is not None else "" if text.startswith("kit: ") else label + " "
        console.print(f"{prefix}{visible(text, one_line=True)}", markup=False, highlight=False)  # as printed
    return show


def preflight(cfg: ClusterConfig, state: st.ClusterState, picked: Optional[list[tuple[str, int | None]]],
              np: Optional[int], exclude: bool, folder: Path) -> tuple[Optional[list[tuple[str, int | None]]],
                                                                       Optional[int]]:
    """kit run --preflight: the job's hosts' compute and links measured (kit.doctor.deep), against each other and
    the cluster's baseline (in `folder`, where `kit bench baseline` kept one), each named host said with its figure.
    A host named stops the job before it starts, unless exclude: then it runs on the others, -np at most their slots
    (-H and -np as a restart leaves them). (-H, -np) for the job."""
    slots = {h.name: h.slots or 1 for h in state.hosts}
    names = [h for h, _ in picked] if picked is not None else [h.name for h in state.hosts]
    hosts = [h for h in state.hosts if h.name in names]
    baseline = deep.load_baseline(folder)
    if len(hosts) < 2 and baseline is None:
        console.print("preflight: one host, and no baseline to compare it with (`kit bench baseline` keeps one)",
                      highlight=False)
        return picked, np
    began = time.monotonic()
    nodes = recorded_nodes(hosts, connector(cfg.connect_timeout))
    try:
        measured = deep.measure_all(nodes, measure.addresses(state),
                                    gpus=uses_gpus(state.flavor))
    finally:
        for n in nodes:
            n.runner.close()
    found = deep.findings(*measured[:3], [h.name for h in hosts], measured[3], baseline)
    bad = list(dict.fromkeys(f.host for f in found if f.level != "ok"))
    took = time.monotonic() - began
    for f in found:
        if f.level != "ok":
            console.print(f"preflight: {escape(f.host)}: {escape(f.text)}", highlight=False)
    console.print(f"preflight: {len(hosts)} host{'s' if len(hosts) > 1 else ''} in {took:.0f} s"
                  + ("" if baseline else " (no baseline: `kit bench baseline` keeps one)") + ": " + (
                      f"{', '.join(bad)} would hold the job back" if bad else "compute and links alike"),
                  highlight=False)
    if not bad:
        return picked, np
    good = [h.name for h in hosts if h.name not in bad]
    if not exclude or not good:
        raise KitError(f"the preflight names {', '.join(bad)}: the job would run at "
                       f"{'its' if len(bad) == 1 else 'their'} speed",
                       hint=(f"--exclude-bad runs it on {', '.join(good)}; or see" if good else "see")
                       + f" to {', '.join(bad)} first (the figures above say what is slow)"
                       + ("" if good else "; `kit bench baseline` records the cluster anew if it changed for good"))
    kept = [(h, dict(picked or []).get(h)) for h in good]
    fit = sum(dict(picked or []).get(h) or slots[h] for h in good)
    console.print(f"preflight: --exclude-bad: the job runs on {', '.join(good)}" +
                  (f", -np {min(np, fit)} (of {np})" if np is not None and np > fit else ""), highlight=False)
    return kept, min(np, fit) if np is not None else None


def _check_launcher(launcher: str, state: st.ClusterState) -> None:
    """The cluster's image must have what the launcher starts (torch and Horovod, or TensorFlow)."""
    kind = framework(state.flavor)
    if launcher not in FRAMEWORK_LAUNCHERS[kind]:
        needs = [f for f in FLAVORS if launcher in FRAMEWORK_LAUNCHERS[framework(f)]]
        raise BadInput(f"--launcher {launcher}: cluster {state.cluster} runs {state.image}, a {state.flavor} image "
                       f"({CONTENTS[kind]})",
                       hint=f"use --launcher {' or '.join(FRAMEWORK_LAUNCHERS[kind])} on it, or bring up a cluster "
                            f"of a {' or '.join(needs)} image (another --name) for this launcher")


def run_job(cfg: ClusterConfig, state: st.ClusterState, script: Path, args: list[str], np: Optional[int],
             workdir: Optional[Path], options: HorovodOptions, env: tuple[tuple[str, str], ...],
             on_line: Callable[[int | None, str | None, str], None], launcher: str = "horovod",
             nproc_per_node: Optional[int] = None, detach: bool = False,
             policy: Policy = Policy(), out: Console = console,
             hosts: Optional[list[tuple[str, int | None]]] = None, secrets: tuple[Path, ...] = ()) -> jobs.Job:
    """Copy the job's folder, run it, say how it ended (on `out`); raise unless it succeeded. Detached: start it and
    return. hosts: -H (parse_hosts), the cluster's hosts the job runs on (default: all). secrets: the --env-file
    files, which are never copied."""
    folder = (workdir or script.parent).resolve()
    if not script.is_file():
        raise BadInput(f"{script}: no such file", hint="give the path of your training script")
    if not script.resolve().is_relative_to(folder):
        raise BadInput(f"{script} is not inside --workdir {folder}", hint="put the script in the folder kit copies")
    members = measure.route(state)  # each host's interface and address on the training network
    slots = [Slot(h.name, h.address, h.slots or 1, members[h.name].address) for h in state.hosts]
    if hosts is not None:
        slots = pick_hosts(hosts, slots, state.cluster)
    count = check_np(np, slots, ",".join(f"{h}:{c}" if c else h for h, c in hosts) if hosts is not None else None)
    used = {s.host for s in slots}
    on = [h for h in state.hosts if h.primary or h.name in used]  # the primary too: the job's supervisor runs there
    script_path = script.resolve().relative_to(folder).as_posix()
    rank_cmd = rank_command(script_path, args)
    nodes = recorded_nodes(on, connector(cfg.connect_timeout))
    try:
        fanout, placed = jobs.fanout(launcher, state, nodes, slots, rank_cmd, nproc_per_node, members) \
            if launcher != "horovod" else ((), ())
        job = jobs.Job(new_job_id(), state, len(placed) if fanout else count, tuple(slots),
                       (members[state.primary.name].iface,), tuple(rank_cmd), options, env, launcher, fanout, placed,
                       nproc_per_node, policy,
                       measure.rank_env(members, {h.name: h.address for h in on}) if launcher == "horovod" else ())
        if policy.min_np is not None and policy.min_np > job.np:
            raise BadInput(f"--min-np: {policy.min_np} is more than the job's {job.np} processes",
                           hint=f"give --min-np from 1 to {job.np}")
        def setup(synced: jobs.Synced) -> tuple[str, ...]:
            return (job_line(job.id, [script_path, *args], job.ranks_hosts(), sum(synced.sent.values()), folder)
                    + synced.left_out_text(),
                    *([f"environment: {jobenv.shown(env)}"] if env else []),
                    *([f"restarts: up to {policy.restarts}, with at least {policy.min_np or job.np} processes"]
                      if policy.restarts else []),
                    f"hang watch: {f'{policy.hang_timeout:g} s without progress' if policy.hang_timeout else 'off'}",
                    *([f"network: {network}"] if (network := measure.described(state, used)) else []))
        synced, starting = jobs.copy_and_start(job, nodes, folder, setup, follow=not detach, secrets=secrets)
        if detach:
            for line in setup(synced):
                out.print(line, markup=False, highlight=False)
            jobs.start(starting)
            out.print(f"[green]✓[/] job {job.id} started (detached): `kit logs {job.id} -f` follows it, "
                          f"`kit jobs` lists it, `kit stop {job.id}` stops it" +
                          ("" if state.workspace_shared else "; what its ranks write stays on the host that wrote "
                           "it (copy storage spreads it only for a job kit run waits for)"))
            return job
        outcome = jobs.follow_to_end(nodes, job.id, job.ranks_hosts(), on_line, starting)
        try:
            spread = jobs.spread_outputs([n for n in nodes if n.name not in outcome.left_out], state, synced.manifests,
                                          synced.ignore, outcome.after)
        except KitError as e:
            if outcome.exit_code == 0:
                raise
            spread = 0  # the job's own failure, said below, comes first; a host that went away has nothing to give
            out.print(f"[yellow]note[/] what the failed job wrote was not copied between the hosts: {escape(str(e))}")
        if spread:
            out.print(f"copied {spread} files the job wrote to every host's {state.workspace}")
    finally:
        for n in nodes:
            n.runner.close()
    report(outcome, job.id, job.launcher, state, out)
    return job


def job_line(job_id: str, script: list[str], ranks: list[str], copied: int, folder: Path) -> str:
    """kit's first line of a job: what the script was given (so that which arguments went to it shows), and where
    its ranks run."""
    hosts = list(dict.fromkeys(ranks))
    on = ", ".join(hosts) if len(hosts) <= 8 else f"{', '.join(hosts[:8])} and {len(hosts) - 8} more"
    processes = f"{len(ranks)} process{'es' if len(ranks) != 1 else ''}"
    return (f"job {job_id}: {shlex.join(script)}; {processes} on {len(hosts)} host{'s' if len(hosts) != 1 else ''} "
            f"({on}); copied {copied} changed files of {folder}")


def _unsettled(job: str, unsettled: dict[str, str]) -> str:
    """kit stop's line where a host's sweep did not settle (`host -> PID:NAME ...`), "" where every host did."""
    if not unsettled:
        return ""
    where = "; ".join(f"{escape(h)} (still stopping {escape(k)})" for h, k in unsettled.items())
    return (f"[yellow]note[/] what is left of job {job} did not settle in {jobcontrol.REAP_FOR_S:.0f} s on {where}: "
            f"no job starts there until `kit stop {job}` finds nothing of it (or `kit down`, then `kit up`)")


def report(outcome: jobs.Outcome, job_id: str, launcher: str, state: st.ClusterState, out: Console = console) -> None:
    """How a followed job ended; raises unless it succeeded, with the job's own exit code where it has one."""
    if outcome.env_kept:
        out.print(f"[yellow]note[/] the job's variables may remain in the container on "
                      f"{', '.join(outcome.env_kept)} ({ENV_DIR}/{job_id}): it could not be reached to remove them; "
                      "`kit down` removes the containers")
    if outcome.leftovers:
        out.print("stopped what was left of the job: " +
                      ", ".join(f"{c} processes on {h}" for h, c in outcome.leftovers.items()))
    if outcome.unsettled:
        out.print(_unsettled(job_id, outcome.unsettled))
    restarted = f" after {outcome.restarts} restart{'s' if outcome.restarts > 1 else ''}" if outcome.restarts else ""
    if outcome.left_out:
        out.print(f"left out by a restart (no answer): {', '.join(outcome.left_out)}")
    if outcome.exit_code == 0:
        out.print(f"[green]✓[/] job {job_id} finished{restarted}")
        return
    if outcome.hang:
        raise KitError(f"job {job_id} hung{restarted}: {outcome.hang}; it was stopped on every host",
                       hint=f"every rank's stack is in {state.primary.place.job_dir(job_id)}/stacks on "
                            f"{state.primary.name}; `kit logs {job_id}` shows its output")
    if outcome.failure:
        rank, code = outcome.failure
        how = f"exit {code}" if code != 255 else "its process, container or host went away"
        host = outcome.ranks[rank] if rank < len(outcome.ranks) else "?"
        raise KitError(f"rank {rank} on {host} failed first ({how}); the job was stopped on every host",
                       hint=f"its output is above; `kit logs {job_id} --rank {rank}` shows it alone").exiting(code)
    if outcome.exit_code is None:
        raise KitError(f"job {job_id} left no exit code on {state.primary.name}: it did not start, or its container "
                       "was restarted or removed while it ran", hint=f"`kit status` shows the containers; "
                       f"`kit logs {job_id}` shows what it printed")
    program = "horovodrun" if launcher == "horovod" else launcher
    raise KitError(f"job {job_id} failed ({program} exit {outcome.exit_code})",
                   hint=f"its output is above; `kit logs {job_id}` shows it again")


def _read_lines(node, cmd: str, shown: "_LogLines") -> int:
    count = 0

    def one(line: str) -> None:
        nonlocal count
        count += 1
        shown.add(line)
    node.runner.stream_out(cmd, one)
    return count


class _LogLines:
    """A job's output log read as `kit logs` shows it: kit's own marks left out, each rank's lines with its host, only
    one rank's with --rank; with --tail, held back until flush() and only the last N of them shown."""

    def __init__(self, printer, hosts: list[str], rank: Optional[int], tail: Optional[int]) -> None:
        self.printer, self.hosts, self.rank = printer, hosts, rank
        self.held: Optional[collections.deque] = collections.deque(maxlen=tail) if tail is not None else None

    def add(self, line: str) -> None:
        if line.startswith(jobcontrol.END_MARK):
            return
        if (launched := jobcontrol.launch_ranks(line)) is not None:  # a launch: the host of each of its ranks
            self.hosts = launched
            return
        r, text = split_rank(line)
        if (self.rank is None or r == self.rank) and exit_report(text) is None:
            host = self.hosts[r] if r is not None and r < len(self.hosts) else None
            if self.held is None:
                self.printer(r, host, text)
            else:
                self.held.append((r, host, text))

    def flush(self) -> None:
        while self.held:
            self.printer(*self.held.popleft())
        self.held = None



@contextlib.contextmanager
def the_job(job: str, where: Where):
    """(the cluster's state, a node a host (the primary first), the job's record), the nodes closed afterwards."""
    state = need_state(where.cfg, where.identity, where.state)
    nodes = recorded_nodes(state.hosts, connector(where.cfg.connect_timeout))
    try:
        records = {r.id: r for r in jobrecords.read_records(nodes[0], job)}
        yield state, nodes, records[resolve_job(job, list(records), state.cluster)]
    finally:
        for n in nodes:
            n.runner.close()


def _running(record: jobrecords.Record, what: str, hint: str | None = None) -> None:
    """A job's stacks and pace are read while it runs."""
    if record.state not in jobrecords.ACTIVE:
        raise BadInput(f"job {record.id} is not running ({record.state}): it has no {what} to read now",
                       hint=hint or "`kit jobs` shows how it ended, and the straggler kit named, if any")


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return "?"
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
