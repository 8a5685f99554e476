"""`kit export`: kit's image as a file for a Slurm site's container runtime (enroot/pyxis, Apptainer)."""

from __future__ import annotations

import os
import shlex
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from kit.build import connect, find_built
from kit.config import build_config, cluster_config, read_config
from kit.errors import BadInput
from kit.export import check_tools, default_output, export_docker_archive, export_enroot
from kit.recipe import make_recipe
from kit import sbatch
from kit.cli import slurm as slurm_cli
from kit.cli.common import app, console, reports_errors
from kit.cli.runargs import RunCommand
from kit.commands.launchers import check_launcher
from kit.cli.flavor import build_flavor


class Target(str, Enum):
    enroot = "enroot"
    docker_archive = "docker-archive"
    slurm = "slurm"


@app.command(cls=RunCommand)
@reports_errors
def export(
    script: Optional[Path] = typer.Argument(None, help="--to slurm: the training script, in the job's folder."),
    args: Optional[List[str]] = typer.Argument(None, help="--to slurm: the script's arguments (as kit run takes "
                                               "them)."),
    to: Target = typer.Option(..., "--to", metavar="enroot|docker-archive|slurm",
                              help="enroot: the image's root filesystem as one squashfs (.sqsh) for pyxis's srun "
                                   "--container-image, made as `enroot import dockerd://` makes it; docker-archive: "
                                   "the image as `docker save` writes it (.tar), for `apptainer build`; slurm: the "
                                   "sbatch script `kit run --on slurm` would submit, to stdout or -o."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", metavar="FILE",
                                          help="The file to write (default: named after the image, in this folder)."),
    image: Optional[str] = typer.Option(None, "--image", metavar="IMAGE:TAG",
                                        help="The image to export (default: cluster.image_tag, else the image kit "
                                             "build makes from kit.yaml's build settings)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="kit.yaml to read (default ./kit.yaml)."),
    launcher: str = typer.Option("horovod", help="--to slurm: horovod, torchrun or tf."),
    nodes: Optional[int] = typer.Option(None, "--nodes", "-N", help="--to slurm: nodes of the job (default 1)."),
    np: Optional[int] = typer.Option(None, "--np", "-np", help="--to slurm, horovod: ranks in all."),
    ntasks_per_node: Optional[int] = typer.Option(None, help="--to slurm: ranks, processes (torchrun) or workers "
                                                  "(tf) on each node."),
    gpus_per_node: Optional[int] = typer.Option(None, help="--to slurm: GPUs of each node for the job."),
    partition: Optional[str] = typer.Option(None, help="--to slurm: the partition."),
    account: Optional[str] = typer.Option(None, help="--to slurm: the account."),
    time_limit: Optional[str] = typer.Option(None, "--time", help="--to slurm: the time limit."),
) -> None:
    """Write kit's image as one file a Slurm site runs: a squashfs for enroot/pyxis, or a docker-archive for
    Apptainer (a second export of the same image to the same file does nothing); or, with --to slurm SCRIPT, the
    sbatch script kit run --on slurm would submit, commented, for submitting by hand: it needs no kit.yaml (then
    runtime none) and contacts nothing.

    \b
      kit export --to enroot -o /shared/images/kit.sqsh
      kit export --to slurm train.py --epochs 2 --nodes 3 -o train.sbatch
    """
    job = {"SCRIPT": script, "--launcher": None if launcher == "horovod" else launcher, "--nodes": nodes, "--np": np,
           "--ntasks-per-node": ntasks_per_node, "--gpus-per-node": gpus_per_node, "--partition": partition,
           "--account": account, "--time": time_limit}
    if to is Target.slurm:
        _export_slurm(script, args or [], launcher, nodes, np, ntasks_per_node, gpus_per_node, partition, account,
                      time_limit, output, config)
        return
    if given := [name for name, value in job.items() if value is not None]:
        raise BadInput(f"{', '.join(given)}: a job's, for --to slurm", hint=f"drop it to export the image --to "
                       f"{to.value}, or write the job's sbatch script with --to slurm")
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
                  partition, account, time_limit, output: Optional[Path], config: Optional[Path]) -> None:
    if script is None:
        raise BadInput("--to slurm needs the training script", hint="kit export --to slurm train.py [ARGS] [--nodes N]")
    check_launcher(launcher)
    shape = sbatch.shape(launcher, nodes, np, ntasks_per_node, gpus_per_node)
    text = slurm_cli.export_script(read_config(config), script.as_posix(), args, launcher, shape, partition, account,
                                   time_limit, output.name if output else "THIS_FILE")
    if output is None:
        print(text, end="")
        return
    path = writable(output.absolute())
    path.write_text(text)
    console.print(f"[green]✓[/] wrote {escape(str(path))}: submit it from the folder where {escape(script.as_posix())} "
                  f"leads to the script, on storage every node sees: sbatch {escape(path.name)}", highlight=False)


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
