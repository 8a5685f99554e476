"""`kit export`: kit's image as a file for a Slurm site's container runtime (enroot/pyxis, Apptainer), or a job as an
sbatch script or Kubernetes manifests."""

from __future__ import annotations

import os
import shlex
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from kit.image.build import connect, find_built
from kit.config.settings import build_config, cluster_config, read_config
from kit.errors import BadInput, KitError
from kit.jobs import env as jobenv
from kit.jobs.model import parse_duration
from kit.image.export import check_tools, default_output, export_docker_archive, export_enroot, find_image
from kit.image.recipe import make_recipe
from kit.backends.k8s import manifests as k8s
from kit.backends.slurm import folder as slurmfolder
from kit.backends.slurm import sbatch
from kit.cli.backends import k8s as k8s_cli, slurm as slurm_cli
from kit.cli.common import app, console, err_console, one_of, progress_bar, reports_errors
from kit.cli.runargs import RunCommand
from kit.jobs.commands.launchers import LAUNCHERS, check_launcher
from kit.cli.flavor import build_flavor


class Target(str, Enum):
    enroot = "enroot"
    docker_archive = "docker-archive"
    slurm = "slurm"
    k8s = "k8s"
    venv = "venv"


class ExportCommand(RunCommand):
    """kit export: after the script, kit run's -H is refused (it would be the script's, and the job 1 node)."""
    foreign = {spelling: "kit run's, which places a job on the cluster's hosts; a Slurm or Kubernetes job takes "
                         "--nodes N and --ntasks-per-node N" for spelling in ("-H", "--hosts")}


@app.command(cls=ExportCommand, short_help="Write an sbatch script, Kubernetes YAML or image file")
@reports_errors
def export(
    script: Optional[Path] = typer.Argument(None, help="--to slurm: the training script, in the job's folder."),
    args: Optional[List[str]] = typer.Argument(None, help="--to slurm: the script's arguments (as kit run takes "
                                               "them)."),
    to: Target = typer.Option(..., "--to", metavar="enroot|docker-archive|venv|slurm|k8s",
                              help="enroot: the image's root filesystem as one squashfs (.sqsh) for pyxis's srun "
                                   "--container-image, made as `enroot import dockerd://` makes it; docker-archive: "
                                   "the image as `docker save` writes it (.tar), for `apptainer build`; venv: the "
                                   "image's Python as a folder -o DIR for Slurm nodes without containers (runtime "
                                   "none), on slurm.login's host if kit.yaml names one, recorded as "
                                   "slurm.python_path; slurm: the sbatch script `kit run --on slurm` would submit, "
                                   "to stdout or -o; k8s: the job's Kubernetes manifests (--kind), to stdout or -o."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE",
                                          help="The file to write (default: named after the image, in this folder); "
                                               "--to venv: the folder, an absolute path every node sees."),
    image: Optional[str] = typer.Option(None, "--image", metavar="IMAGE:TAG",
                                        help="The image to export (default: cluster.image_tag, else the image kit "
                                             "build makes from kit.yaml's build settings)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="kit.yaml to read (default ./kit.yaml)."),
    launcher: str = typer.Option("horovod", autocompletion=one_of(*LAUNCHERS),
                                 help="--to slurm or k8s: horovod, torchrun or tf."),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="--to slurm or k8s: nodes (k8s: pods) of the "
                                        "job (default 1)."),
    np: Optional[int] = typer.Option(None, "--np", "-np", "--num-proc", "-n",
                                     help="--to slurm or k8s, horovod: ranks in all."),
    ntasks_per_node: Optional[int] = typer.Option(None, help="--to slurm or k8s: ranks, processes (torchrun) or "
                                                  "workers (tf) on each node."),
    gpus_per_node: Optional[int] = typer.Option(None, help="--to slurm or k8s: GPUs of each node for the job."),
    kind: str = typer.Option("indexed-job", autocompletion=one_of(*k8s.KINDS),
                             help="--to k8s: " + ", ".join(k8s.KINDS) + " (see kit export --help)."),
    namespace: Optional[str] = typer.Option(None, help="--to k8s: the namespace (default: kubectl's)."),
    workspace_pvc: Optional[str] = typer.Option(None, metavar="NAME", help="--to k8s: a PersistentVolumeClaim that "
                                                "holds the job's folder (SCRIPT is its path there); default: the "
                                                "script's folder in a ConfigMap."),
    image_pull_secret: Optional[str] = typer.Option(None, metavar="NAME", help="--to k8s: the Secret the pods pull "
                                                    "the image with, where the registry asks for a login."),
    env: Optional[List[str]] = typer.Option(None, "--env", "-e", help="--to slurm or k8s: a variable for every rank, "
                                            "NAME=VALUE or NAME (repeatable): k8s reads a secret one from a Secret, "
                                            "slurm from a 0600 file in .kit/env here, never the script."),
    env_file: Optional[List[Path]] = typer.Option(None, help="--to slurm or k8s: variables from a file of NAME=VALUE "
                                                  "lines."),
    cpus: Optional[str] = typer.Option(None, metavar="CPUS", help="--to k8s: each pod's CPUs, requested and its "
                                       "limit (8, 0.5, 500m; default: 2 for each rank it runs)."),
    memory: Optional[str] = typer.Option(None, metavar="SIZE", help="--to k8s: each pod's memory, requested and its "
                                         "limit (32Gi, 500Mi; default: 8Gi for each rank it runs; /dev/shm may take "
                                         "half)."),
    hang_timeout: Optional[str] = typer.Option(None, metavar="DURATION", help="--to k8s, --kind indexed-job or "
                                               "jobset: when none of a pod's ranks has made progress for this long "
                                               "(30s, 10m, 2h; 0: never), the pod prints where each is and its stack, "
                                               "and ends (default 10m, as kit run)."),
    partition: Optional[str] = typer.Option(None, help="--to slurm: the partition."),
    account: Optional[str] = typer.Option(None, help="--to slurm: the account."),
    time_limit: Optional[str] = typer.Option(None, "--time", help="--to slurm: the time limit."),
    cpus_per_task: Optional[int] = typer.Option(None, metavar="N", help="--to slurm: CPUs of each task (default: "
                                                "slurm.cpus_per_task, else Slurm's)."),
    mem: Optional[str] = typer.Option(None, metavar="SIZE", help="--to slurm: memory of each node (64G)."),
    mem_per_gpu: Optional[str] = typer.Option(None, metavar="SIZE", help="--to slurm: memory of each GPU, instead."),
) -> None:
    """Write kit's image as one file a Slurm site runs: a squashfs for enroot/pyxis, or a docker-archive for
    Apptainer (a second export of the same image to the same file does nothing); or, with --to venv -o DIR, the
    image's Python as a folder that Slurm nodes without containers run (runtime none); or, with --to slurm SCRIPT, the
    sbatch script kit run --on slurm would submit, commented, for submitting by hand: it needs no kit.yaml (then
    runtime none) and contacts nothing; or, with --to k8s SCRIPT, the job's Kubernetes objects as one YAML stream
    for `kubectl apply --server-side -f`: --kind indexed-job or jobset (any launcher, no operator needed but
    JobSet's), pytorchjob or trainjob (torchrun), tfjob (tf), mpijob (horovod). It contacts no cluster; without
    --image it asks this machine's Docker which image kit build made.

    \b
      kit export --to enroot -o /shared/images/kit.sqsh
      kit export --to venv -o /shared/envs/kit
      kit export --to slurm train.py --epochs 2 --nodes 3 -o train.sbatch
      kit export --to k8s train.py --nodes 2 --gpus-per-node 4 --image registry.lab:5000/kit/train:1 -o job.yaml
    """
    job = {"SCRIPT": script, "--launcher": None if launcher == "horovod" else launcher, "--nodes": nodes, "--np": np,
           "--ntasks-per-node": ntasks_per_node, "--gpus-per-node": gpus_per_node, "--partition": partition,
           "--account": account, "--time": time_limit, "--cpus-per-task": cpus_per_task, "--mem": mem,
           "--mem-per-gpu": mem_per_gpu}
    k8s_only = {"--kind": None if kind == "indexed-job" else kind, "--namespace": namespace,
                "--workspace-pvc": workspace_pvc, "--image-pull-secret": image_pull_secret, "--cpus": cpus,
                "--memory": memory, "--hang-timeout": hang_timeout}
    if to is Target.k8s:
        if given := [name for name in ("--partition", "--account", "--time", "--cpus-per-task", "--mem",
                                       "--mem-per-gpu") if job[name] is not None]:
            raise BadInput(f"{', '.join(given)}: Slurm's", hint="drop it for --to k8s")
        _export_k8s(script, args or [], launcher, kind, sbatch.shape(launcher, nodes, np, ntasks_per_node,
                                                                     gpus_per_node, slurm=False),
                    image, jobenv.parse(env or [], env_file or [], os.environ), namespace, workspace_pvc,
                    image_pull_secret, output, config, tuple(env_file or ()), cpus, memory, hang_timeout)
        return
    if given := [name for name, value in k8s_only.items() if value]:
        raise BadInput(f"{', '.join(given)}: for --to k8s", hint="drop it, or write the job's manifests with --to k8s")
    if to is Target.slurm:
        _export_slurm(script, args or [], launcher, nodes, np, ntasks_per_node, gpus_per_node, partition, account,
                      time_limit, output, config, jobenv.parse(env or [], env_file or [], os.environ),
                      cpus_per_task=cpus_per_task, mem=mem, mem_per_gpu=mem_per_gpu)
        return
    if given := [name for name, value in {"-e": env, "--env-file": env_file}.items() if value]:
        raise BadInput(f"{', '.join(given)}: a job's, for --to slurm or k8s", hint=f"drop it to export the image "
                       f"--to {to.value}")
    if given := [name for name, value in job.items() if value is not None]:
        raise BadInput(f"{', '.join(given)}: a job's, for --to slurm or k8s", hint=f"drop it to export the image "
                       f"--to {to.value}, or write the job's sbatch script (--to slurm) or manifests (--to k8s)")
    if to is Target.venv:
        _export_venv(output, image, config)
        return
    if to is Target.enroot:
        check_tools("enroot")  # before any work: nothing is unpacked to be thrown away
    if output is not None:
        writable(output.absolute())
    client = connect()
    tag = image or default_image(client, config)
    path = writable((output or default_output(tag, to.value)).absolute())
    if to is Target.enroot:
        with console.status(f"exporting {tag}") as status:
            done = export_enroot(client, tag, path, on_status=status.update)
    else:
        with console.status(f"saving {tag}"):
            done = export_docker_archive(client, tag, path)
    _print_done(done, tag)
    _print_use(to, path)


def _export_slurm(script: Optional[Path], args: list[str], launcher: str, nodes, np, ntasks_per_node, gpus_per_node,
                  partition, account, time_limit, output: Optional[Path], config: Optional[Path],
                  variables: tuple[tuple[str, str], ...] = (), **resources) -> None:
    if script is None:
        raise BadInput("--to slurm needs the training script", hint="kit export --to slurm train.py [ARGS] [--nodes N]")
    check_launcher(launcher)
    shape = sbatch.shape(launcher, nodes, np, ntasks_per_node, gpus_per_node)
    env_file = slurmfolder.variables_file(variables)[0] if variables else None
    text = slurm_cli.export_script(read_config(config), script.as_posix(), args, launcher, shape, partition, account,
                                   time_limit, output.name if output else "THIS_FILE", env_file, **resources)
    if output is not None:
        writable(output.absolute())
    # (once the script is known good: bad input writes nothing)
    wrote = [f"kit's files for its tasks in {slurmfolder.write_helpers(Path.cwd())}"]
    if variables:
        slurmfolder.write_variables(variables, Path.cwd())
        wrote.insert(0, f"the job's variables ({', '.join(name for name, _ in variables)}) in {sbatch.ENV_DIR}/"
                        f"{env_file} (mode 0600)")
    err_console.print(f"kit: {' and '.join(wrote)}, here: the script reads them, so submit it from this folder",
                      highlight=False, markup=False)
    if path := _write_out(text, output):
        console.print(f"[green]✓[/] wrote {escape(str(path))}: submit it from the folder where "
                      f"{escape(script.as_posix())} leads to the script, on storage every node sees: "
                      f"sbatch {escape(path.name)}", highlight=False)


def _export_venv(output: Optional[Path], image: Optional[str], config: Optional[Path]) -> None:
    """The image's Python as a folder for a Slurm site's nodes (runtime none), on the login host (kit.yaml's
    slurm.login) or here; recorded as slurm.python_path in kit.yaml."""
    from kit.backends.slurm import jobs as slurmjobs
    from kit.image import venv as venvexport
    from kit.runners import safefolder
    from kit.config.settings import SlurmConfig, set_setting
    from kit.image.flavors import FLAVORS
    if output is None:
        raise BadInput("--to venv needs -o DIR: the folder for the nodes' Python", hint="give -o the folder on storage "
                       "every node sees at the same path, e.g. kit export --to venv -o /shared/envs/kit")
    folder = venvexport.check_folder(str(output))
    cfg_file = read_config(config)
    settings = slurm_cli.slurm_settings(cfg_file, None, None, None) if "slurm" in cfg_file.sections else SlurmConfig()
    runner = slurmjobs.login_runner(settings, cluster_config(cfg_file, {}).connect_timeout)
    where = f"{settings.login}:{folder}" if settings.login else folder
    try:
        done = runner.run(venvexport.target_command(folder), timeout=60)   # first: a typo changes nothing
        if bad := safefolder.unsafe(done.stdout):
            raise BadInput(f"--to venv: {where if bad[0] == '-' else bad[0]} is {bad[1]}",
                           hint="give -o a new or empty folder of yours (or the one an earlier export made), on "
                                "storage every node sees; a folder above it that others may write needs the sticky "
                                "bit (chmod +t)")
        done.check(f"cannot look at {folder} on {settings.login or 'this machine'}")
        client = connect()
        tag = image or default_image(client, config)
        found = find_image(client, tag)
        flavor = (found.labels or {}).get("io.kit.flavor")
        if flavor not in FLAVORS:
            raise BadInput(f"image {tag} is not one kit build made (it has no io.kit.flavor label)",
                           hint="export the image kit build makes (kit build, then kit export --to venv -o DIR)")
        launcher = "tf" if FLAVORS[flavor][0] == "tensorflow" else "horovod"
        if f'"image": "{found.id}"' in done.stdout:
            console.print(f"{escape(where)} holds {escape(tag)}'s Python already: nothing to do", highlight=False)
        else:
            with console.status(f"reading {tag}'s Python"):
                plan = venvexport.read_plan(client, found)
            with progress_bar() as bar:
                task = bar.add_task(f"exporting {tag}'s Python", total=None, what=where)
                runner.stream_in(venvexport.unpack_command(folder), venvexport.stream(client, found, tag, plan),
                                 lambda n: bar.advance(task, n), finish=600).check(
                    f"writing {folder} failed", hint="the folder's parent must be writable by the login user, with "
                                                     "room for the image's Python")
            console.print(f"[green]✓[/] wrote {escape(where)}: Python {plan.python} with {escape(tag)}'s packages; "
                          f"it needs glibc {plan.glibc} or newer on the nodes", highlight=False)
        imports = slurmjobs.IMPORTS[launcher]
        runner.run(f"cd / && {shlex.quote(folder)}/bin/python -I -c {shlex.quote(imports)}", timeout=300).check(
            f"{folder}/bin/python cannot `{imports}` on {settings.login or 'this machine'}",
            hint="the nodes need an x86-64 Linux with the glibc the line above names, or use runtime pyxis or "
                 "apptainer with kit's image")
    finally:
        runner.close()
    path = set_setting(cfg_file, "slurm", "python_path", f"{folder}/bin/python")
    console.print(f"[green]✓[/] {escape(str(path))}: slurm.python_path is {escape(folder)}/bin/python"
                  + ("" if settings.runtime == "none" else f" (used with runtime none; it says {settings.runtime})"),
                  highlight=False)


def _write_out(text: str, output: Optional[Path]) -> Optional[Path]:
    """A job's script or manifests: to stdout (None), or to the file -o names (its path)."""
    if output is None:
        print(text, end="")
        return None
    path = writable(output.absolute())
    path.write_text(text)
    return path


def _export_k8s(script: Optional[Path], args: list[str], launcher: str, kind: str, shape: sbatch.Shape,
                image: Optional[str], variables, namespace, workspace_pvc, pull_secret, output: Optional[Path],
                config: Optional[Path], secrets: tuple[Path, ...] = (), cpus: Optional[str] = None,
                memory: Optional[str] = None, hang_timeout: Optional[str] = None) -> None:
    if script is None:
        raise BadInput("--to k8s needs the training script", hint="kit export --to k8s train.py [ARGS] [--nodes N]")
    check_launcher(launcher)
    k8s.check_kind(kind)
    if hang_timeout is not None and kind not in k8s.WATCHED:
        raise BadInput(f"--hang-timeout: kit's hang watch runs in the pods of --kind {' or '.join(k8s.WATCHED)}, and "
                       f"--kind {kind}'s operator starts the ranks itself", hint="drop it, or use --kind indexed-job")
    timeout = parse_duration(hang_timeout or "10m", "--hang-timeout")
    job = k8s_cli.make_job(script, args, launcher, kind, shape, image or k8s_image(config), variables, namespace,
                           workspace_pvc, pull_secret, k8s.job_name(script.as_posix()), secrets, cpus, memory,
                           timeout)
    job = k8s.export_name(job)
    if path := _write_out(k8s.render(job), output):
        console.print(f"[green]✓[/] wrote {escape(str(path))}: kubectl apply --server-side -f {escape(path.name)}",
                      highlight=False)
    k8s_cli.secret_note(job)


def k8s_image(config: Optional[Path]) -> str:
    """cluster.image_tag, else the image kit build made here (if this machine's Docker answers). A cluster pulls it
    from a registry: the line on stderr says how it gets there."""
    tag = cluster_config(read_config(config), {}).image_tag
    if tag is None:
        try:
            tag = default_image(connect(), config)
        except KitError as e:
            raise BadInput(f"no image for the pods ({e})", hint="give --image REGISTRY/REPO:TAG, the image `kit push` "
                           "put in your registry") from None
    err_console.print(f"kit: the pods run {escape(tag)}; a Kubernetes cluster pulls it from a registry: push it with "
                      "`kit push REGISTRY/REPO:TAG` and give that with --image", highlight=False)
    return tag


def writable(path: Path) -> Path:
    if path.is_dir() or not path.parent.is_dir() or not os.access(path.parent, os.W_OK):
        why = "is a folder" if path.is_dir() else f"cannot be written: folder {path.parent} is missing or read-only"
        raise BadInput(f"-o {path}: {why}", hint="give -o the path of a file in a folder you can write")
    return path


def default_image(client, config: Optional[Path]) -> str:
    """cluster.image_tag, else the image of kit.yaml's build settings that `kit build` made (its flavor decided as
    kit build decides it); none built yet is bad input: nothing is built here."""
    cfg_file = read_config(config)
    cfg = cluster_config(cfg_file, {})
    if cfg.image_tag:
        return cfg.image_tag
    flavor = build_flavor(cfg_file, cfg, None, None)
    recipe = make_recipe(build_config(cfg_file, {"flavor": flavor}))
    tag = find_built(client, recipe)
    if tag is None:
        raise BadInput(f"no {flavor} image of kit.yaml's build settings is built on this machine (key {recipe.key})",
                       hint="run `kit build` first, or give the image with --image IMAGE:TAG")
    return tag


def _print_done(done, tag: str) -> None:
    what = f"{escape(str(done.path))} ({done.size / 1e9:.2f} GB, image {escape(tag)}, id {done.image_id[7:19]})"
    if done.skipped:
        console.print(f"[green]✓[/] {what} already holds this image (its .id file says so): nothing to do")
    else:
        console.print(f"[green]✓[/] wrote {what} in {done.seconds:.0f} s")


def _print_use(to: Target, path: Path) -> None:
    if to is Target.enroot:
        runtime, image = "pyxis", path
        console.print("run it on a Slurm site with enroot and pyxis (neither is packaged here: not run by kit):")
        console.print(f"  srun --container-image={shlex.quote(str(path))} python train.py", markup=False)
    else:
        runtime, image = "apptainer", path.with_suffix(".sif")
        console.print("make the .sif on a machine with Apptainer (not packaged here: not run by kit):")
        console.print(f"  apptainer build {shlex.quote(str(image))} docker-archive://{shlex.quote(str(path))}",
                      markup=False)
    console.print("kit.yaml, for kit run --on slurm (the file must be on storage every node reads):")
    console.print(f"  slurm:\n    runtime: {runtime}\n    container_image: {image}", markup=False)
