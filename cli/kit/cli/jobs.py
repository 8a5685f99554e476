"""`kit run`: a job on the cluster, followed to its end; how a job ended (also `kit attach`'s). `kit logs`,
`kit attach`, `kit stacks` are kit.cli.joblogs'; `kit jobs`, `kit stop` kit.cli.joblist's."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Callable, List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from kit.cluster import state as st
from kit.cluster.steps.preflight import recorded_nodes
from kit.config.settings import CONTENTS, FLAVORS, ClusterConfig, framework
from kit.jobs import env as jobenv
from kit.backends.cluster import run as jobs
from kit.backends.k8s import manifests as k8s
from kit.backends.slurm import sbatch
from kit.jobs.commands.launchers import FRAMEWORK_LAUNCHERS, LAUNCHERS, check_launcher
from kit.jobs.commands.horovod import (ENV_DIR, HorovodOptions, Slot, check_knobs, check_np, parse_hosts, pick_hosts,
                                       rank_command)
from kit.network import measure
from kit.errors import BadInput, KitError
from kit.shown import visible
from kit.cli.common import CONFIG, NAME, app, cluster_settings, connector, console, locked, need_state
from kit.cli.common import one_of, reports_errors
from kit.cli import k8s as k8s_cli, slurm as slurm_cli
from kit.cli.runargs import RunCommand


def job_printer(launcher: str) -> Callable[[int | None, str | None, str], None]:
    """Prints a job's line: a rank's with its host and rank, the launcher's own with the launcher's name."""
    label = "[horovodrun]" if launcher == "horovod" else f"[{launcher}]"

    def show(rank: int | None, host: str | None, text: str) -> None:
        prefix = f"[{host} rank {rank}] " if rank is not None else "" if text.startswith("kit: ") else label + " "
        console.print(f"{prefix}{visible(text, one_line=True)}", markup=False, highlight=False)  # as printed
    return show


@app.command(cls=RunCommand, short_help="Run a training script on the cluster, Slurm or k8s")
@reports_errors
def run(
    script: Path = typer.Argument(..., help="The training script (python), inside the job's folder."),
    args: Optional[List[str]] = typer.Argument(None, help="The script's arguments: what follows SCRIPT, but kit "
                                               "run's own options (see above); all that follows --."),
    launcher: str = typer.Option("horovod", autocompletion=one_of(*LAUNCHERS),
                                 help="horovod (horovodrun), torchrun (PyTorch DDP) or tf "
                                      "(MultiWorkerMirroredStrategy, one worker a host)."),
    np: Optional[int] = typer.Option(None, "--np", "-np", "--num-proc", "-n",
                                     help="horovod: processes (default: every slot of the "
                                          "cluster, or of -H)."),
    hosts: Optional[str] = typer.Option(None, "-H", "--hosts", help="Only these hosts of the cluster, each with its "
                                        "slots: host:slots,host:slots (a host alone: its slots in hosts.txt), by name "
                                        "or address; horovod: ranks in this order; torchrun: the nodes, slots as "
                                        "--nproc-per-node; tf: the workers."),
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
    on: str = typer.Option("cluster", "--on", autocompletion=one_of("cluster", "slurm", "k8s"),
                           help="cluster (kit's containers on the hosts of `kit up`), slurm (submitted to Slurm as "
                                "kit.yaml's slurm: section says) or k8s (applied with kubectl to its current "
                                "context)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="slurm, k8s: nodes (pods) of the job (default "
                                        "1)."),
    ntasks_per_node: Optional[int] = typer.Option(None, help="slurm, k8s: ranks (horovod), processes (torchrun) or "
                                                  "workers (tf) on each node (default: --gpus-per-node, else 1)."),
    gpus_per_node: Optional[int] = typer.Option(None, help="slurm, k8s: GPUs of each node for the job."),
    kind: str = typer.Option("indexed-job", autocompletion=one_of(*k8s.KINDS),
                             help="k8s: the job's kind (kit export --help says which runs what)."),
    namespace: Optional[str] = typer.Option(None, help="k8s: the namespace (default: the context's)."),
    image: Optional[str] = typer.Option(None, metavar="REGISTRY/REPO:TAG", help="k8s: the image the pods pull "
                                        "(default: cluster.image_tag; `kit push` puts kit's image in a registry)."),
    workspace_pvc: Optional[str] = typer.Option(None, metavar="NAME", help="k8s: a PersistentVolumeClaim that holds "
                                                "the job's folder (SCRIPT is its path there)."),
    image_pull_secret: Optional[str] = typer.Option(None, metavar="NAME", help="k8s: the Secret the pods pull the "
                                                    "image with, where the registry asks for a login."),
    cpus: Optional[str] = typer.Option(None, metavar="CPUS", help="k8s: each pod's CPUs, requested and its limit "
                                       "(8, 0.5, 500m; default: 2 for each rank it runs)."),
    memory: Optional[str] = typer.Option(None, metavar="SIZE", help="k8s: each pod's memory, requested and its "
                                         "limit (32Gi, 500Mi; default: 8Gi for each rank it runs)."),
    partition: Optional[str] = typer.Option(None, help="slurm: the partition (default: slurm.partition, else "
                                            "Slurm's default)."),
    account: Optional[str] = typer.Option(None, help="slurm: the account (default: slurm.account)."),
    cpus_per_task: Optional[int] = typer.Option(None, metavar="N", help="slurm: CPUs of each task (default: each "
                                                "node's, its share for the job's GPUs, among its tasks; or "
                                                "slurm.cpus_per_task)."),
    mem: Optional[str] = typer.Option(None, metavar="SIZE", help="slurm: memory of each node for the job, as sbatch "
                                      "--mem reads it (64G; default: slurm.mem, else Slurm's)."),
    mem_per_gpu: Optional[str] = typer.Option(None, metavar="SIZE", help="slurm: memory of each GPU, instead "
                                              "(sbatch --mem-per-gpu)."),
    time_limit: Optional[str] = typer.Option(None, "--time", help="slurm: the time limit, as sbatch --time reads "
                                             "it (default: slurm.time, else the partition's)."),
) -> None:
    """Run a training script across the cluster (horovodrun, torchrun or TF workers); its output streams here.

    The script's arguments need no --: before SCRIPT go kit run's options (an unknown one is refused); after SCRIPT,
    kit takes its own run options wherever they stand, except --config/-c, --name, --workdir, -d, -n and --help,
    which are the script's there, and every other argument goes to the script, in its order; after --, all is the
    script's. -np N (-np=N, -n N, --num-proc N) and -H host:slots,... are spelled as horovodrun spells them. kit's
    first line shows what the script got; an error about one of kit's options given after the script says how to
    hand it to the script instead.

    \b
      kit run train.py --epochs 2                      the script gets --epochs 2
      kit run -np 3 train.py --epochs 2                3 processes; the script gets --epochs 2
      kit run train.py --epochs 1 -np 2 -H a:1,c:1     2 processes, on hosts a and c
      kit run -c kit.yaml train.py --config cfg.yaml   kit reads kit.yaml, the script gets --config cfg.yaml
      kit run train.py -- --np 5                       the script gets --np 5
    """
    check_launcher(launcher)
    slurm_flags = {"--nodes": nodes, "--ntasks-per-node": ntasks_per_node, "--gpus-per-node": gpus_per_node,
                   "--partition": partition, "--account": account, "--time": time_limit,
                   "--cpus-per-task": cpus_per_task, "--mem": mem, "--mem-per-gpu": mem_per_gpu}
    if on not in ("cluster", "slurm", "k8s"):
        raise BadInput(f"--on: '{on}' is not where kit runs jobs", hint="use cluster (the default), slurm or k8s")
    k8s_flags = {"--kind": None if kind == "indexed-job" else kind, "--namespace": namespace, "--image": image,
                 "--workspace-pvc": workspace_pvc, "--image-pull-secret": image_pull_secret, "--cpus": cpus,
                 "--memory": memory}
    if on != "k8s" and (given := [flag for flag, value in k8s_flags.items() if value is not None]):
        raise BadInput(f"{', '.join(given)}: for --on k8s", hint="add --on k8s, or drop it")
    if on in ("slurm", "k8s"):
        cluster_only = {"-H": hosts, "--nproc-per-node": nproc_per_node, "--restarts": restarts or None,
                        "--min-np": min_np, "--fusion-threshold-mb": fusion_threshold_mb,
                        "--cycle-time-ms": cycle_time_ms, "--timeline": timeline,
                        "--verbose-horovod": verbose_horovod or None, "--fp16-allreduce": fp16_allreduce or None,
                        "--hang-timeout": None if hang_timeout == "10m" else hang_timeout,
                        "--start-timeout": None if start_timeout == 60 else start_timeout}
        if on == "k8s":
            cluster_only |= {"--partition": partition, "--account": account, "--time": time_limit,
                             "--cpus-per-task": cpus_per_task, "--mem": mem, "--mem-per-gpu": mem_per_gpu,
                             "--workdir": workdir}
        if given := [flag for flag, value in cluster_only.items() if value is not None]:
            raise BadInput(f"{', '.join(given)}: not for --on {on}", hint=f"drop it: under {SCHEDULERS[on]}, --nodes, "
                           "--np or --ntasks-per-node and --gpus-per-node say where ranks run")
        cfg_file, cfg = cluster_settings(config, dict(name=name))
        if on == "k8s":
            _run_on_k8s(script, args or [], launcher, kind, sbatch.shape(launcher, nodes, np, ntasks_per_node,
                                                                         gpus_per_node, slurm=False),
                        image or cfg.image_tag, jobenv.parse(env or [], env_file or [], os.environ), namespace,
                        workspace_pvc, image_pull_secret, detach, tuple(env_file or ()), cpus, memory)
            return
        settings = slurm_cli.configured_slurm(cfg_file, partition, account, time_limit, cpus_per_task=cpus_per_task,
                                              mem=mem, mem_per_gpu=mem_per_gpu)
        shape = sbatch.shape(launcher, nodes, np, ntasks_per_node, gpus_per_node)
        variables = jobenv.parse(env or [], env_file or [], os.environ)
        slurm_cli.run_on_slurm(settings, script, args or [], workdir, launcher, shape, variables, detach,
                               cfg.connect_timeout, slurm_cli.printer(launcher), tuple(env_file or ()))
        return
    if given := [flag for flag, value in slurm_flags.items() if value is not None]:
        raise BadInput(f"{', '.join(given)}: Slurm's, and this job runs on the cluster", hint="add --on slurm, or "
                       "drop it (-np and -H place a job on the cluster's hosts)")
    picked = parse_hosts(hosts) if hosts is not None else None
    if launcher != "horovod" and np is not None:
        raise BadInput(f"--np is horovodrun's; {launcher} runs on every host",
                       hint="drop --np" + ("; --nproc-per-node sets the processes of each host"
                                           if launcher == "torchrun" else ""))
    check_knobs(fusion_threshold_mb, cycle_time_ms)
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
    with locked(name, config) as (cfg, identity, state):  # no up or down changes the cluster under the job
        state = need_state(cfg, identity, state)
        _check_launcher(launcher, state)
        options = HorovodOptions(fusion_threshold_mb, cycle_time_ms, timeline, verbose_horovod, start_timeout)
        run_job(cfg, state, script, args or [], np, workdir, options, variables, job_printer(launcher), launcher,
                 nproc_per_node, detach, jobs.Policy(restarts, min_np, hang), hosts=picked,
                 secrets=tuple(env_file or ()))


SCHEDULERS = {"slurm": "Slurm", "k8s": "Kubernetes"}


def _run_on_k8s(script: Path, args: list[str], launcher: str, kind: str, shape: sbatch.Shape, image: Optional[str],
                variables, namespace: Optional[str], workspace_pvc: Optional[str], pull_secret: Optional[str],
                detach: bool, secrets: tuple[Path, ...] = (), cpus: Optional[str] = None,
                memory: Optional[str] = None) -> None:
    k8s.check_kind(kind)
    if image is None:
        raise BadInput("--on k8s needs the image the pods pull", hint="push kit's image with `kit push "
                       "REGISTRY/REPO:TAG` and give it with --image (or set cluster.image_tag in kit.yaml)")
    job_id = jobs.new_job_id()
    job = k8s_cli.make_job(script, args, launcher, kind, shape, image, variables, namespace, workspace_pvc,
                           pull_secret, k8s.job_name(script.as_posix(), job_id.rsplit("-", 1)[-1]), secrets, cpus,
                           memory)
    k8s_cli.run_on_k8s(job, job_id, detach)  # (make_job checked the job before kubectl is asked anything)


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
             policy: jobs.Policy = jobs.Policy(), out: Console = console,
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
        job = jobs.Job(jobs.new_job_id(), state, len(placed) if fanout else count, tuple(slots),
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


def report(outcome: jobs.Outcome, job_id: str, launcher: str, state: st.ClusterState, out: Console = console) -> None:
    """How a followed job ended; raises unless it succeeded, with the job's own exit code where it has one."""
    if outcome.env_kept:
        out.print(f"[yellow]note[/] the job's variables may remain in the container on "
                      f"{', '.join(outcome.env_kept)} ({ENV_DIR}/{job_id}): it could not be reached to remove them; "
                      "`kit down` removes the containers")
    if outcome.leftovers:
        out.print("stopped what was left of the job: " +
                      ", ".join(f"{c} processes on {h}" for h, c in outcome.leftovers.items()))
    restarted = f" after {outcome.restarts} restart{'s' if outcome.restarts > 1 else ''}" if outcome.restarts else ""
    if outcome.left_out:
        out.print(f"left out by a restart (no answer): {', '.join(outcome.left_out)}")
    if outcome.exit_code == 0:
        out.print(f"[green]✓[/] job {job_id} finished{restarted}")
        return
    if outcome.hang:
        hung = KitError(f"job {job_id} hung{restarted}: {outcome.hang}; it was stopped on every host",
                        hint=f"every rank's stack is in {state.primary.place.job_dir(job_id)}/stacks on "
                             f"{state.primary.name}; `kit logs {job_id}` shows its output")
        hung.exit_code = 1
        raise hung
    if outcome.failure:
        rank, code = outcome.failure
        how = f"exit {code}" if code != 255 else "its process, container or host went away"
        host = outcome.ranks[rank] if rank < len(outcome.ranks) else "?"
        failed = KitError(f"rank {rank} on {host} failed first ({how}); the job was stopped "
                          "on every host", hint=f"its output is above; `kit logs {job_id} --rank {rank}` shows it alone")
        failed.exit_code = code if 0 < code < 255 else 1  # the job's own exit code, as if it ran here
        raise failed
    if outcome.exit_code is None:
        raise KitError(f"job {job_id} left no exit code on {state.primary.name}: it did not start, or its container "
                       "was restarted or removed while it ran", hint=f"`kit status` shows the containers; "
                       f"`kit logs {job_id}` shows what it printed")
    program = "horovodrun" if launcher == "horovod" else launcher
    raise KitError(f"job {job_id} failed ({program} exit {outcome.exit_code})",
                   hint=f"its output is above; `kit logs {job_id}` shows it again")

