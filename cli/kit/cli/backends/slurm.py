"""Slurm as a back end of `kit run` (kit.jobs.model.Backend): `kit run --on slurm` submits the job's sbatch script on
the login host (kit.backends.slurm), follows its output there, says how it ended; `kit jobs`, `kit logs` and `kit
stop` for the jobs it submitted (kit.backends.slurm.jobs)."""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from pathlib import Path
from typing import Optional

from rich.markup import escape
from rich.table import Table

from kit.backends.slurm import sbatch
from kit.backends.slurm import folder as slurmfolder
from kit.backends.slurm import jobs as slurmjobs
from kit.backends.slurm import output as slurmoutput
from kit.backends.slurm import restart as slurmrestart
from kit.backends.slurm import watch as slurmwatch
from kit.config.settings import ConfigFile, SlurmConfig, section_config
from kit.errors import BadInput, KitError
from kit.cli.common import Where, cluster_settings, console, print_hangs
from kit.jobs import env as jobenv
from kit.jobs.model import COMMON, SCHEDULER_PLACEMENT, Job, Policy, new_job_id
from kit.shown import visible

STOP_WAIT_S = 30


class Slurm:
    """Slurm, where kit.yaml's slurm: section says sbatch runs."""

    name = "slurm"
    title = "Slurm"
    options = COMMON | {"np", "workdir", "nodes", "ntasks_per_node", "gpus_per_node", "partition", "account",
                        "cpus_per_task", "mem", "mem_per_gpu", "time_limit", "hang_timeout", "straggler_window",
                        "restarts", "min_np"}
    placement = SCHEDULER_PLACEMENT
    commands = frozenset({"ranks"})

    def run(self, job: Job) -> None:
        cfg_file, cfg = cluster_settings(job.config, dict(name=job.name))
        o = job.option
        settings = configured_slurm(cfg_file, o("partition"), o("account"), o("time_limit"),
                                    cpus_per_task=o("cpus_per_task"), mem=o("mem"), mem_per_gpu=o("mem_per_gpu"))
        shape = sbatch.shape(job.launcher, job.nodes, job.np, job.ntasks_per_node, job.gpus_per_node)
        variables = jobenv.parse(list(job.env), list(job.env_files), os.environ)
        check_policy(job.policy, job.launcher, shape, job.detach)
        run_on_slurm(settings, job.script, list(job.args), job.workdir, job.launcher, shape, variables, job.detach,
                     cfg.connect_timeout, printer(job.launcher), job.env_files, job.policy)

    def find(self, ref: str, where: Where) -> Optional[slurmjobs.SlurmRecord]:
        """The Slurm job a reference names: by its id or Slurm id; `last`, the newest, when no cluster is up here."""
        return None if ref == "last" and where.state is not None else slurmjobs.resolve(ref)

    def logs(self, record: slurmjobs.SlurmRecord, where: Where, rank: Optional[int], follow: bool,
             tail: Optional[int]) -> None:
        logs(record, rank, follow, tail, where.cfg.connect_timeout, printer(record.launcher))

    def stop(self, record: slurmjobs.SlurmRecord, where: Where) -> str:
        return stop(record, where.cfg.connect_timeout)

    def ranks(self, record: slurmjobs.SlurmRecord, where: Where, measure) -> tuple[str, list]:
        return record.id, ranks(record, where.cfg.connect_timeout, measure)

    def rows(self, where: Where) -> list[dict]:
        return rows(where.cfg.connect_timeout)

    def show(self, found: list[dict]) -> None:
        console.print(table(found))
        print_hangs(found)


def check_policy(policy: Policy, launcher: str, shape: sbatch.Shape, detach: bool) -> None:
    """--restarts and --min-np, as kit's cluster reads them; kit submits a job again only while it follows it."""
    policy.check(launcher)
    if policy.min_np is not None and policy.min_np > shape.ranks:
        raise BadInput(f"--min-np: {policy.min_np} is more than the job's {shape.ranks} ranks",
                       hint=f"give --min-np from 1 to {shape.ranks}")
    if policy.restarts and detach:
        raise BadInput("--restarts with --detach: kit submits a Slurm job again while `kit run` follows it",
                       hint="drop --detach (kit run then follows the job and restarts it), or drop --restarts")


def slurm_settings(cfg_file: ConfigFile, partition: Optional[str], account: Optional[str],
                   time_limit: Optional[str], **resources) -> SlurmConfig:
    """kit.yaml's slurm section, the flags winning; resources: cpus_per_task, mem, mem_per_gpu."""
    return section_config(cfg_file, "slurm", dict(partition=partition, account=account, time=time_limit,
                                                  **resources))


def configured_slurm(cfg_file: ConfigFile, partition: Optional[str], account: Optional[str],
                     time_limit: Optional[str], **resources) -> SlurmConfig:
    """kit.yaml's slurm section, for a job kit submits: refused where there is none (kit would not know where
    sbatch runs, nor which Python the nodes have; kit export --to slurm needs none)."""
    if "slurm" not in cfg_file.sections:
        where = f"{cfg_file.path}" if cfg_file.path else "./kit.yaml"
        raise BadInput(f"{where}: Slurm is not configured: it has no slurm: section" if cfg_file.path else
                       "Slurm is not configured: there is no kit.yaml here with a slurm: section",
                       hint=f"add one to {where}: `slurm:` with `login: USER@HOST` (the host where you run sbatch; "
                            "none on that host itself); then `kit export --to venv -o /shared/envs/kit` makes the "
                            "nodes' Python there and records it (or set `runtime: pyxis` or `apptainer`, with kit's "
                            "image): the Slurm page of kit's docs says more")
    return slurm_settings(cfg_file, partition, account, time_limit, **resources)


def run_on_slurm(settings: SlurmConfig, script: Path, args: list[str], workdir: Optional[Path], launcher: str,
                 shape: sbatch.Shape, variables: tuple[tuple[str, str], ...], detach: bool, connect_timeout: int,
                 show, secrets: tuple[Path, ...] = (), policy: Policy = Policy(hang_timeout=0)) -> None:
    """Copy the job's folder to the login host, submit its sbatch script, and follow it to its end (or return,
    with --detach). secrets: the --env-file files, which are never copied. policy: kit's hang watch while it follows
    the job (kit.backends.slurm.watch; hang timeout 0: none), and its restarts (kit.backends.slurm.restart)."""
    folder = (workdir or script.parent).resolve()
    rel = _script_in(script, folder)
    job_id = new_job_id()
    job = sbatch.SbatchJob(job_id, rel, tuple(args), launcher, shape, settings, bool(variables), submitted=True)
    sbatch.render(job)  # (bad input, before anything is contacted)
    runner = slurmjobs.login_runner(settings, connect_timeout)
    where = settings.login or "this machine"
    try:
        slurmjobs.check_environment(runner, settings, launcher)
        if settings.cpus_per_task is None and (share := slurmjobs.node_share(runner, settings, shape)):
            job = dataclasses.replace(job, slurm=settings.model_copy(update={"cpus_per_task": share}))
        text = sbatch.render(job)
        remote = slurmfolder.job_folder(runner, settings.workdir, job_id)
        slurmfolder.stage(runner, folder, remote, text, dict(variables), job_id, secrets)
        record = slurmjobs.SlurmRecord(job_id, "", settings.login, remote, launcher, rel, shape.ranks, time.time(),
                                       hang_timeout=policy.hang_timeout, per_node=shape.ranks // shape.nodes,
                                       straggler_window=policy.straggler_window)
        try:
            slurm_id = slurmjobs.submit(runner, remote, [name for name, _ in variables])
        except KitError:
            slurmjobs.forget_variables(runner, record)  # refused: no batch script will remove them
            raise
        record = dataclasses.replace(record, slurm_id=slurm_id)
        slurmjobs.save(record)
        console.print(f"kit: job {job_id} is Slurm job {slurm_id} on {escape(where)}: {escape(sbatch.describe(job))}; "
                      f"its folder there: {escape(remote)}", highlight=False)
        if detach:
            console.print(f"kit logs {job_id} -f follows it; kit jobs lists it; kit stop {job_id} stops it",
                          highlight=False)
            return
        record, ending = _follow_restarting(runner, record, show, policy, settings.partition, dict(variables))
    finally:
        runner.close()
    _remember_end(record, ending)
    report(job_id, record, ending)


def _follow_restarting(runner, record: slurmjobs.SlurmRecord, show, policy: Policy, partition: Optional[str],
                       variables: dict[str, str]) -> tuple[slurmjobs.SlurmRecord, slurmjobs.Ending]:
    """Follow the job to its end; one that failed is submitted again (--restarts) from its folder, on the nodes that
    answer (kit.backends.slurm.restart), and followed again. Its last record and how its last start ended. Ctrl-C
    cancels the start that runs."""
    try:
        while True:
            reader = slurmoutput.Reader(record.launcher, record.ranks, show, per_node=record.per_node)
            ending, watch = _follow(runner, record, reader, beats=record.restarts < policy.restarts)
            record = dataclasses.replace(record, ranks=reader.ranks,
                                         straggler=(*record.straggler, *watch.stragglers))
            if record.restarts >= policy.restarts or ending.state not in slurmrestart.RESTARTED:
                return record, ending
            again = slurmrestart.plan(reader.nodes, record.per_node, policy.min_np or record.ranks,
                                      watch.silent_nodes(), slurmrestart.ended_nodes(reader),
                                      slurmrestart.node_states(runner, partition))
            try:
                if not ending.lost:  # (kit said why it ended a start that lost a node)
                    report(record.id, record, ending)
            except KitError as e:  # how this start ended, said as the job goes on
                console.print(f"kit: {e}", markup=False, highlight=False)
            if isinstance(again, str):
                console.print(f"kit: cannot start job {record.id} again: {again}", markup=False, highlight=False)
                return record, ending
            record = _submit_again(runner, record, again, policy, variables)
    except KeyboardInterrupt:
        slurmjobs.cancel(runner, record)
        state = slurmjobs.wait_gone(runner, record, STOP_WAIT_S)
        raise KitError(f"job {record.id} interrupted: Slurm job {record.slurm_id} cancelled ({state})",
                       hint=f"`kit logs {record.id}` shows what it printed") from None


def _submit_again(runner, record: slurmjobs.SlurmRecord, again: slurmrestart.Again, policy: Policy,
                  variables: dict[str, str]) -> slurmjobs.SlurmRecord:
    r = slurmrestart.submit_again(runner, record, again, variables)
    out = "".join(f"left out {node} ({why}); " for node, why in sorted(again.left_out.items()))
    nodes = f"{again.low}" + (f" to {again.high}" if again.high != again.low else "")
    console.print(f"kit: restart {r.restarts} of {policy.restarts}: {out}job {r.id} is Slurm job {r.slurm_id} now, "
                  f"on {nodes} node(s), KIT_RESTART={r.restarts}", markup=False, highlight=False)
    return r


def export_script(cfg_file: ConfigFile, script: str, args: list[str], launcher: str, shape: sbatch.Shape,
                  partition: Optional[str], account: Optional[str], time_limit: Optional[str], filename: str,
                  env_file: Optional[str] = None, **resources) -> str:
    """The sbatch script `kit run --on slurm` would submit, for a user who submits by hand: kit.yaml's slurm section
    where there is one, else the defaults (runtime none). Contacts nothing. env_file: the variables' file kit export
    wrote in sbatch.ENV_DIR (write_variables)."""
    settings = slurm_settings(cfg_file, partition, account, time_limit, **resources)
    return sbatch.render(sbatch.SbatchJob(sbatch.EXPORTED_JOB_ID, script, tuple(args), launcher, shape, settings,
                                          variables=env_file is not None, filename=filename, env_file=env_file))


def _script_in(script: Path, folder: Path) -> str:
    path = script.resolve()
    if not path.is_file():
        raise BadInput(f"{script}: no such file", hint="give the training script's path")
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        raise BadInput(f"{script} is not inside {folder} (--workdir)",
                       hint="give a --workdir that holds the script, or leave it out") from None


def _remember_end(record: slurmjobs.SlurmRecord, ending: slurmjobs.Ending) -> None:
    if ending.state in slurmjobs.ENDED:
        slurmjobs.ended(record, ending.state, ending.code, ending.hang)


def _follow(runner, record: slurmjobs.SlurmRecord, reader: slurmoutput.Reader, first: int = 0,
            beats: bool = False) -> tuple[slurmjobs.Ending, slurmwatch.SlurmWatch]:
    """Follow the job to its end under kit's watch: the ranks' pace (a node that holds the others back is named),
    and where the job has a hang timeout, a job that made no progress for it has every rank's stack kept in its
    folder (slurmwatch.take_stacks) and is cancelled. beats: a job that may restart (a node whose ranks went silent
    while the others ended is lost). How it ended, and the watch."""
    def said(text: str) -> None:  # a straggler named: kept in the record, then said (a Ctrl-C may follow the line)
        slurmjobs.save(dataclasses.replace(record, straggler=(*record.straggler, *watch.stragglers)))
        console.print(text, markup=False, highlight=False)
    watch = slurmwatch.SlurmWatch(runner, record.folder, record.slurm_id, record.id, reader, record.hang_timeout,
                                  find_lost=beats, window=record.straggler_window, say=said)  # (and with no timeout)
    ending = slurmjobs.follow(runner, record, reader, first=first, watch=watch)
    if ending.state == "lost":  # (srun waits for the lost nodes, the others idle: a restart follows, without them)
        lost = ", ".join(f"{node} (its ranks wrote no heartbeat for {watch.silent_nodes().get(node, 0):.0f} s and left "
                         "no exit line)" for node in ending.lost)
        console.print(f"kit: job {record.id} lost {lost}, while its other ranks ended; cancelling Slurm job "
                      f"{record.slurm_id} (Slurm waits for a lost node until its SlurmdTimeout)",
                      markup=False, highlight=False)  # (kit's own line, not one of the job's output)
        slurmjobs.cancel(runner, record)
        return slurmjobs.Ending("failed", None, reader.first_failure(), lost=ending.lost), watch
    if ending.state != "hung":
        return ending, watch
    console.print(f"kit: job {record.id} hung: {ending.hang}; taking every rank's stack, then cancelling Slurm job "
                  f"{record.slurm_id}", markup=False, highlight=False)
    try:
        where, _ = slurmwatch.take_stacks(runner, record.folder, record.slurm_id, record.id, reader,
                                          list(range(record.ranks)), lambda: slurmjobs.cancel(runner, record, "USR2"))
        kept = f"every rank's stack is in {where}"
    except KitError as e:  # (the job ended meanwhile, or its folder cannot be written: it is cancelled all the same)
        kept = f"no stack was kept ({e})"
    state, _ = slurmjobs.job_state(runner, record.slurm_id)
    if state not in slurmjobs.ENDED and state != "lost":
        slurmjobs.cancel(runner, record)
        state = slurmjobs.wait_gone(runner, record, STOP_WAIT_S)
    else:  # (it ended meanwhile: its variables' file goes all the same, as cancel removes it)
        slurmjobs.forget_variables(runner, record)
    return slurmjobs.Ending("failed", None, None, f"{ending.hang}; Slurm job {record.slurm_id} was cancelled "
                            f"({state}), {kept}"), watch


def printer(launcher: str):
    """A Slurm job's line: a rank's with its node and rank, a node's torchrun with its node, and every other line of
    the job's output (srun's, the batch script's, or one the job wrote into the file itself) with [slurm]: none of
    them passes for a line of kit's own, a `kit: ...` the job forged included."""
    def show(rank: int | None, node: str | None, text: str) -> None:
        prefix = f"[{node} rank {rank}] " if rank is not None else f"[{node} {launcher}] " if node else "[slurm] "
        console.print(f"{prefix}{visible(text, one_line=True)}", markup=False, highlight=False)
    return show


# A job Slurm ended for a cause of its own (slurmjobs.SLURM_ENDED): what kit says of it, and the fix.
CAUSES = {
    "timeout": ("reached its time limit, and Slurm ended it",
                "give it more time (--time, or slurm.time in kit.yaml); a script that saves a checkpoint on SIGUSR1, "
                "two minutes before the limit, resumes from it when submitted again"),
    "preempted": ("was preempted: Slurm ended it for a job of a higher priority",
                  "submit it again; a script that saves checkpoints resumes from the last one"),
    "node_fail": ("lost a node: Slurm marked it failed and ended the job",
                  "`sinfo -R` on the login host names the node and why; submit it again once the node is back (or "
                  "fewer --nodes)"),
    "oom": ("ran out of memory: the kernel ended a task at the job's memory limit",
            "give it more memory (--mem or --mem-per-gpu, or slurm.mem in kit.yaml), or fewer ranks a node"),
}


def report(job_id: str, record: slurmjobs.SlurmRecord, ending: slurmjobs.Ending) -> None:
    """How a followed Slurm job ended; raises unless it succeeded, with the job's own exit code where it has one."""
    slurm = f"Slurm job {record.slurm_id}"
    if ending.state == "succeeded":
        after = f" after {record.restarts} restart{'s' if record.restarts > 1 else ''}" if record.restarts else ""
        out = f"; left out {', '.join(record.left_out)}" if record.left_out else ""
        console.print(f"[green]✓[/] job {job_id} finished ({slurm}){after}{escape(out)}", highlight=False)
        return
    if ending.hang:
        raise KitError(f"job {job_id} hung: {ending.hang}", hint=f"its output is above (`kit logs {job_id}`); a rank "
                       "that waits in a collective the others never reach is named at the line it waits on")
    if ending.state in CAUSES:
        said, fix = CAUSES[ending.state]
        f = ending.failure
        first = f"; {f.who}{f' on {f.node}' if f.node else ''} ended first (exit {f.exit_code})" if f else ""
        raise KitError(f"job {job_id} {said} ({slurm}: {ending.state}){first}",
                       hint=f"{fix}; its output is above (`kit logs {job_id}`)").exiting(ending.code)
    if f := ending.failure:
        where = f" on {f.node}" if f.node else ""
        alone = f"; `kit logs {job_id} --rank {f.rank}` shows it alone" if f.rank is not None else ""
        raise KitError(f"{f.who}{where} failed first (exit {f.exit_code}); Slurm stopped the job's other tasks "
                       f"({slurm}: {ending.state})", hint=f"its output is above{alone}").exiting(f.exit_code)
    if ending.state == "stopped":
        raise KitError(f"job {job_id} was cancelled ({slurm})", hint=f"`kit logs {job_id}` shows what it printed")
    code = ending.exit_code
    raise KitError(f"job {job_id} {ending.state} ({slurm}" + (f", exit {code})" if code is not None else ")"),
                   hint=f"its output is above (`kit logs {job_id}`); `scontrol show job {record.slurm_id}` or sacct "
                        "on the login host says more").exiting(code)


# ------------------------------------------------------------------------------------------------ jobs, logs, stop

def rows(connect_timeout: int) -> list[dict]:
    """kit's Slurm jobs, with the state Slurm gives now (one look per login host); ended ones from kit's record."""
    found = slurmjobs.records()
    now = time.time()
    out = []
    by_login = collections.defaultdict(list)
    for record in found:
        by_login[record.login].append(record)
    for login, records in by_login.items():
        runner, unreachable = None, None
        try:
            for record in records:
                if record.ended:
                    state, code = record.ended["state"], record.ended.get("exit")
                elif unreachable:
                    state, code = "unknown", None
                else:
                    try:
                        runner = runner or slurmjobs.login_runner(SlurmConfig(login=login), connect_timeout)
                        state, code = slurmjobs.job_state(runner, record.slurm_id)
                    except KitError as e:  # the other login hosts' jobs, and the cluster's, are still listed
                        unreachable, state, code = e, "unknown", None
                        console.print(f"[yellow]warning[/] cannot ask Slurm on {escape(login or 'this machine')} "
                                      f"(slurm.login): {escape(str(e))}", highlight=False)
                    if state in slurmjobs.ENDED or state == "lost":  # neither Slurm nor its records knows it again
                        slurmjobs.seen_ended(runner, record, state, code)
                out.append(dict(id=record.id, slurm_id=record.slurm_id, login=login or "local", launcher=record.launcher,
                                np=record.ranks, script=record.script, state=state, exit=code,
                                submitted=int(record.submitted), seconds=int(now - record.submitted),
                                hang=record.ended.get("hang"), straggler="\n".join(record.straggler),
                                restarts=record.restarts,
                                left_out=list(record.left_out)))
        finally:
            if runner is not None:
                runner.close()
    return out


def table(found: list[dict]) -> Table:
    t = Table(box=None, pad_edge=False, title="Slurm", title_justify="left")
    for column in ("job", "slurm id", "login", "launcher", "np", "script", "state", "submitted", "exit", "restarts"):
        t.add_column(column)
    for row in found:
        restarts = str(row["restarts"] or "") + (f" (left out {' '.join(row['left_out'])})" if row["left_out"] else "")
        t.add_row(escape(row["id"]), escape(row["slurm_id"]), escape(row["login"]), escape(row["launcher"]),
                  str(row["np"]), escape(row["script"]), escape(row["state"]) + (" (hung)" if row["hang"] else ""),
                  time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["submitted"])),
                  "" if row["exit"] is None else str(row["exit"]), escape(restarts))
    return t


def logs(record: slurmjobs.SlurmRecord, rank: Optional[int], follow: bool, tail: Optional[int], connect_timeout: int,
         shown) -> None:
    held: Optional[collections.deque] = collections.deque(maxlen=tail) if tail is not None else None

    def show(r, node, text):
        if rank is None or r == rank:
            (held.append((r, node, text)) if held is not None else shown(r, node, text))

    def said(start: int, slurm_id: str) -> None:
        if held is None:
            console.print(f"kit: start {start} of job {record.id} (KIT_RESTART={start}), Slurm job {slurm_id}:",
                          markup=False, highlight=False)
    reader = slurmoutput.Reader(record.launcher, record.ranks, show, per_node=record.per_node)
    runner = slurmjobs.login_runner(SlurmConfig(login=record.login), connect_timeout)
    try:
        for start, slurm_id in enumerate(record.earlier):  # a job kit started again: each start's output, in turn
            said(start, slurm_id)
            earlier = slurmoutput.Reader(record.launcher, record.ranks, show, per_node=record.per_node)
            slurmjobs.read_rest(runner, dataclasses.replace(record, slurm_id=slurm_id), 0, earlier.feed)
        if record.earlier:
            said(len(record.earlier), record.slurm_id)
        poll, read = slurmjobs.read_rest(runner, record, 0, reader.feed)
        while held:
            shown(*held.popleft())
        held = None
        if poll.state in (None, *slurmjobs.ENDED) and not record.ended:
            state, code = slurmjobs.job_state(runner, record.slurm_id)
            if state in slurmjobs.ENDED or state == "lost":
                slurmjobs.seen_ended(runner, record, state, code)
        if follow and poll.state not in (None, *slurmjobs.ENDED):
            ending, _ = _follow(runner, record, reader, first=read)
            if ending.hang:
                _remember_end(record, ending)
            console.print(f"kit: job {record.id} {ending.state}" +
                          (f" (exit {ending.code})" if ending.code is not None else "") +
                          (f": hung: {ending.hang}" if ending.hang else ""), markup=False, highlight=False)
    finally:
        runner.close()


def ranks(record: slurmjobs.SlurmRecord, connect_timeout: int, measure) -> list:
    """Each rank's pace (kit jobs ID --ranks): measure(read) reads the ranks' heartbeats twice from the login host,
    each rank on the node its output's node list puts it."""
    if record.ended:
        raise BadInput(f"job {record.id} is not running ({record.ended['state']}): it has no ranks to read now",
                       hint="`kit jobs` shows how it ended, and the straggler kit named, if any")
    reader = slurmoutput.Reader(record.launcher, record.ranks, lambda *_: None, per_node=record.per_node)
    runner = slurmjobs.login_runner(SlurmConfig(login=record.login), connect_timeout)
    try:
        poll, _ = slurmjobs.read_rest(runner, record, 0, reader.feed)
        if poll.state in (None, *slurmjobs.ENDED):
            raise BadInput(f"job {record.id} is not running (Slurm job {record.slurm_id}: {poll.state or 'gone'})",
                           hint="`kit jobs` shows how it ended")
        return measure(lambda: slurmwatch.read_beats(runner, record.folder, record.slurm_id, record.id, reader))
    finally:
        runner.close()


def stop(record: slurmjobs.SlurmRecord, connect_timeout: int) -> str:
    if record.ended:
        return f"job {record.id} is not running ({record.ended['state']}); nothing to stop"
    runner = slurmjobs.login_runner(SlurmConfig(login=record.login), connect_timeout)
    try:
        state, code = slurmjobs.job_state(runner, record.slurm_id)
        if state in slurmjobs.ENDED or state == "lost":
            slurmjobs.seen_ended(runner, record, state, code)
            return f"job {record.id} is not running ({state}); nothing to stop"
        slurmjobs.cancel(runner, record)
        after = slurmjobs.wait_gone(runner, record, STOP_WAIT_S)
    finally:
        runner.close()
    if after == "running":
        raise KitError(f"job {record.id} (Slurm job {record.slurm_id}) has not ended {STOP_WAIT_S} s after scancel",
                       hint=f"`squeue -j {record.slurm_id}` on the login host shows it; a node that does not answer "
                            "keeps it COMPLETING until Slurm gives up on it")
    return f"[green]✓[/] job {record.id} stopped: Slurm job {record.slurm_id} cancelled ({after})"
