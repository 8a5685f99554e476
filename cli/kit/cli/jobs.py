"""`kit run`: a job described once (kit.jobs.model.Job) and handed to the back end --on names (kit.cli.backends),
whose declared options are the only ones it takes. `kit logs`, `kit attach`, `kit stacks` are kit.cli.joblogs';
`kit jobs`, `kit stop` kit.cli.joblist's."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from kit.jobs.commands.launchers import LAUNCHERS, check_launcher
from kit.jobs.model import COMMON, Job, Policy, parse_duration, refused
from kit.cli import backends
from kit.cli.common import CONFIG, NAME, app, one_of, reports_errors
from kit.cli.runargs import RunCommand


@app.command(cls=RunCommand, short_help="Run a training script on the cluster, Slurm or k8s")
@reports_errors
def run(
    ctx: typer.Context,
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
    restarts: int = typer.Option(0, help="After a failure, start the job again (this many times) on the hosts (Slurm: "
                                 "nodes) that still answer, with KIT_RESTART=<n> set: the script resumes from its "
                                 "checkpoint."),
    min_np: Optional[int] = typer.Option(None, help="The fewest processes a restart may have (default: all of them); "
                                         "horovod: processes, torchrun: all hosts' processes together."),
    hang_timeout: str = typer.Option("10m", help="When no rank has made progress for this long (30s, 10m, 2h; 0: "
                                     "never), every rank's stack goes in the job's folder and the job is stopped "
                                     "(or restarted)."),
    preflight: bool = typer.Option(False, "--preflight", help="Before the job, every host's compute and links are "
                                   "measured (seconds), and a host that would hold the job back is named with its "
                                   "figure; the job then does not start."),
    exclude_bad: bool = typer.Option(False, "--exclude-bad", help="With --preflight: start the job on the hosts it "
                                     "did not name (-np at most their slots)."),
    straggler_window: str = typer.Option("2m", help="How long a host's ranks must be 1.5x slower than the others' "
                                         "(their time a step outside collectives) before kit names it (30s, 2m; 0: "
                                         "never)."),
    on: str = typer.Option("cluster", "--on", autocompletion=one_of(*backends.BACKENDS),
                           help="cluster (kit's containers on the hosts of `kit up`), slurm (submitted to Slurm as "
                                "kit.yaml's slurm: section says) or k8s (applied with kubectl to its current "
                                "context)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="slurm, k8s: nodes (pods) of the job (default "
                                        "1)."),
    ntasks_per_node: Optional[int] = typer.Option(None, help="slurm, k8s: ranks (horovod), processes (torchrun) or "
                                                  "workers (tf) on each node (default: --gpus-per-node, else 1)."),
    gpus_per_node: Optional[int] = typer.Option(None, help="slurm, k8s: GPUs of each node for the job."),
    kind: str = typer.Option("indexed-job", autocompletion=one_of(*backends.completion("kind")),
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
    b = backends.backend(on)
    given = {p.name: p.opts[0] for p in ctx.command.params if _given(ctx, p.name)}
    if refusal := refused(b, given, backends.BACKENDS):
        raise refusal
    policy = Policy(restarts, min_np, parse_duration(hang_timeout, "--hang-timeout"),
                    parse_duration(straggler_window, "--straggler-window"))
    job = Job(script, tuple(args or ()), launcher, np, hosts, nproc_per_node, nodes, ntasks_per_node, gpus_per_node,
              workdir, tuple(env or ()), tuple(env_file or ()), detach, policy,
              {n: ctx.params[n] for n in b.options - COMMON - JOB_FIELDS},
              config, name)
    b.run(job)


# kit run's parameters that are fields of kit.jobs.model.Job; the others a back end takes are its own options.
JOB_FIELDS = {"np", "hosts", "nproc_per_node", "nodes", "ntasks_per_node", "gpus_per_node", "workdir", "restarts",
              "min_np", "hang_timeout", "straggler_window"}


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the command line gave the option (not its default). By the source's name: typer's click is its own."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")
