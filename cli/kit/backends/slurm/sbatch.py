"""The sbatch script of a kit job under Slurm: settings in, text out. Pure.

It is what `kit export --to slurm` prints and what `kit run --on slurm` submits. kit's three files for the tasks (the
task, kit.backends.slurm.task; the network survey; the rank launcher) go beside it as files (helpers()), in a folder named by
their content (HELPERS_DIR-<sha256>), which the script checks before it starts a task: the script stays short enough
to read, a script submitted by hand needs no kit on the cluster, and jobs from one folder (of one kit or of two)
never rewrite each other's. Every value that reaches the script is allow-listed (kit.config.settings.SlurmConfig) or quoted.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import shlex
from dataclasses import dataclass

from kit.backends.slurm import task as slurmtask
from kit.jobs.commands.horovod import rank_launcher
from kit.config.settings import SlurmConfig
from kit.errors import BadInput
from kit.network import shipped as network_script
from kit.image.recipe import render_template
from kit.backends.cluster.supervisor.launch import TORCHRUN_PREFIX

SCRIPT_NAME = "kit-job.sbatch"
ENV_DIR = ".kit/env"            # the job's variables, one JSON file a job, relative to the job's folder
IMAGE_PYTHON = "/opt/venv/bin/python"  # the Python of kit's image (pyxis, apptainer)
MAX_NODES = 1024
MAX_TASKS = 256
# The job's ports: a block of JOB_PORT_BLOCK from JOB_PORT_BASE + (the job id % JOB_PORT_BLOCKS) * JOB_PORT_BLOCK, the
# block's first for Horovod's rendezvous or torchrun's store, TF's workers from there up (one a task of the node, so at
# most JOB_PORT_BLOCK a node). Two jobs' blocks overlap only when their ids are JOB_PORT_BLOCKS apart. `kit prepare
# --slurm`'s firewall closes JOB_PORTS to every address but the cluster's, and its Prolog, while a job runs, its block
# to every node but the job's and to every other user on them. Below 32768, where Linux's ephemeral ports start
# (`kit prepare --slurm` checks each host's range): no program's port 0 lands in a job's block, where that job's rules
# would drop its peers.
JOB_PORT_BASE, JOB_PORT_BLOCK, JOB_PORT_BLOCKS = 20000, 16, 798
JOB_PORTS = f"{JOB_PORT_BASE}:{JOB_PORT_BASE + JOB_PORT_BLOCK * JOB_PORT_BLOCKS - 1}"


@dataclass(frozen=True)
class Shape:
    """How many nodes, and what runs on each: tasks (horovod: ranks, tf: workers) or torchrun's processes."""

    nodes: int
    tasks_per_node: int          # Slurm's tasks on each node (torchrun: 1)
    nproc_per_node: int = 1      # torchrun: its processes on each node
    gpus_per_node: int | None = None

    @property
    def ranks(self) -> int:
        return self.nodes * (self.nproc_per_node if self.tasks_per_node == 1 else self.tasks_per_node)


def shape(launcher: str, nodes: int | None, np: int | None, per_node: int | None, gpus: int | None, *,
          slurm: bool = True) -> Shape:
    """--nodes, --np, --ntasks-per-node and --gpus-per-node as the launcher reads them; bad input is refused. slurm:
    for a Slurm job (a Kubernetes job's pods each have an address of their own, so no port bound on its workers)."""
    for flag, value, top in (("--nodes", nodes, MAX_NODES), ("--np", np, MAX_NODES * MAX_TASKS),
                             ("--ntasks-per-node", per_node, MAX_TASKS), ("--gpus-per-node", gpus, 64)):
        if value is not None and not 1 <= value <= top:
            raise BadInput(f"{flag}: {value} is not from 1 to {top}", hint=f"give {flag} a number from 1 to {top}")
    if np is not None and per_node is not None:
        raise BadInput("--np and --ntasks-per-node both say how many ranks", hint="give one of them")
    if np is not None and launcher != "horovod":
        raise BadInput(f"--np is Horovod's; {launcher} runs " + ("torchrun on every node" if launcher == "torchrun"
                                                                 else "one worker a task"),
                       hint="drop --np; --ntasks-per-node sets " + ("the processes of each node" if launcher ==
                                                                    "torchrun" else "the workers of each node"))
    nodes = nodes or 1
    if np is not None and np % nodes:
        raise BadInput(f"--np {np} does not split evenly over --nodes {nodes}",
                       hint=f"give --np a multiple of {nodes}, or --ntasks-per-node")
    each = np // nodes if np is not None else per_node or gpus or 1
    if each > MAX_TASKS:
        raise BadInput(f"--np {np} over --nodes {nodes} is {each} ranks a node, more than {MAX_TASKS}",
                       hint="give more --nodes, or fewer ranks")
    if launcher == "torchrun":
        return Shape(nodes, 1, each, gpus)
    if launcher == "tf" and slurm and each > JOB_PORT_BLOCK:
        raise BadInput(f"{each} TensorFlow workers a node: under Slurm each takes a port of the job's {JOB_PORT_BLOCK}",
                       hint=f"give at most {JOB_PORT_BLOCK} workers a node (more --nodes)")
    return Shape(nodes, each, 1, gpus)


@dataclass(frozen=True)
class SbatchJob:
    job_id: str
    script: str                  # relative to the job's folder
    args: tuple[str, ...]
    launcher: str
    shape: Shape
    slurm: SlurmConfig
    variables: bool = False      # the job has variables (-e, --env-file): in ENV_DIR/<job_id>, never in the script
    submitted: bool = False      # kit run submits it (else: kit export wrote it for the user)
    filename: str = SCRIPT_NAME  # the script's own file name, as its first lines say to submit it
    env_file: str | None = None  # kit export's: the variables' file in ENV_DIR that each job copies (variables True)

    @property
    def name(self) -> str:
        stem = self.script.rsplit("/", 1)[-1].removesuffix(".py")
        return "kit-" + "".join(c if c.isalnum() or c in "_.-" else "-" for c in stem)[:40]


def runtime_parts(slurm: SlurmConfig, gpus: bool) -> tuple[str, str]:
    """(srun's options for the runtime, the Python each task runs) as text for the script."""
    if slurm.runtime == "pyxis":
        image = shlex.quote(slurm.container_image)
        return (f'--container-image={image} --container-mounts="$PWD:$PWD" --container-workdir="$PWD" ',
                f"{IMAGE_PYTHON} -u")
    if slurm.runtime == "apptainer":
        nv = "--nv " if gpus else ""
        return "", f'apptainer exec {nv}--bind "$PWD" --pwd "$PWD" {shlex.quote(slurm.container_image)} {IMAGE_PYTHON} -u'
    return "", f"{shlex.quote(slurm.python_path)} -u"


def describe(job: SbatchJob) -> str:
    s = job.shape
    each = (f"{s.nproc_per_node} process(es) a node" if job.launcher == "torchrun"
            else f"{s.tasks_per_node} {'rank' if job.launcher == 'horovod' else 'worker'}(s) a node")
    what = {"horovod": "Horovod (Gloo)", "torchrun": "torchrun (PyTorch DDP)",
            "tf": "TensorFlow (MultiWorkerMirroredStrategy)"}[job.launcher]
    return f"{what} on {s.nodes} node(s), {each}, {s.ranks} in all"


HELPERS_DIR = ".kit/lib"  # + "-" and the first 16 hex digits of their sha256, relative to the job's folder


@functools.cache  # (their sources do not change while kit runs: render, stage and export each ask)
def helpers() -> dict[str, bytes]:
    """kit's files for a Slurm job's tasks, by name: the task (kit.backends.slurm.task, which finds the others beside
    itself), the network survey, and the rank launcher (which reads the job's variables from ENV_DIR). Not to be
    changed."""
    return {"kit_task.py": inspect.getsource(slurmtask).encode(), "kit_net.py": network_script.script().encode(),
            "kit_rank.py": rank_launcher(env_dir=ENV_DIR).encode()}


def helpers_dir(files: dict[str, bytes]) -> str:
    """Their folder, named by what they hold: another kit's are another folder, so a folder once written never
    changes."""
    whole = hashlib.sha256()
    for name, data in sorted(files.items()):
        whole.update(f"{name}\0{len(data)}\0".encode() + data)
    return f"{HELPERS_DIR}-{whole.hexdigest()[:16]}"


def helper_files() -> dict[str, bytes]:
    """The files to put beside the script, by their path from the job's folder."""
    files = helpers()
    folder = helpers_dir(files)
    return {f"{folder}/{name}": data for name, data in files.items()}


EXPORTED_JOB_ID = "slurm-$SLURM_JOB_ID"  # a script submitted by hand: the job's id is Slurm's


def render(job: SbatchJob) -> str:
    if any(ord(c) < 32 or c == "\x7f" for c in job.script):
        raise BadInput(f"{job.script!r}: a script's path with a control character (a line break?)",
                       hint="rename the script")
    srun_runtime, python = runtime_parts(job.slurm, bool(job.shape.gpus_per_node))
    files = helpers()
    return render_template(
        "sbatch.j2", q=shlex.quote, script=job.script, what=describe(job), runtime=job.slurm.runtime,
        submitted=job.submitted, filename=job.filename, job_name=job.name, nodes=job.shape.nodes,
        tasks_per_node=job.shape.tasks_per_node, gpus_per_node=job.shape.gpus_per_node,
        partition=job.slurm.partition, account=job.slurm.account, time=job.slurm.time,
        cpus_per_task=job.slurm.cpus_per_task, mem=job.slurm.mem, mem_per_gpu=job.slurm.mem_per_gpu,
        # (srun reads no --cpus-per-task of sbatch's since Slurm 22.05: each step is told)
        srun_cpus=f"--cpus-per-task={job.slurm.cpus_per_task} " if job.slurm.cpus_per_task else "",
        helpers_dir=helpers_dir(files), sums=[(hashlib.sha256(data).hexdigest(), name) for name, data in files.items()],
        job_id=job.job_id, subnet=job.slurm.subnet, variables=job.variables, env_file=job.env_file,
        launcher=job.launcher,
        nproc_per_node=job.shape.nproc_per_node, torchrun_prefix=TORCHRUN_PREFIX, srun_runtime=srun_runtime,
        python=python, command=" ".join(shlex.quote(a) for a in (job.script, *job.args)), port_base=JOB_PORT_BASE,
        port_block=JOB_PORT_BLOCK, port_blocks=JOB_PORT_BLOCKS)
