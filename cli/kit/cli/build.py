"""`kit build`: the training image, its plan and its verification report."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from kit.image import pipconfig
from kit.image.build import connect
from kit.config.settings import build_config, cluster_config, read_config
from kit.image.recipe import EXPECTED_BUILD, Recipe, make_recipe
from kit.image.verify import ImageReport, verify_image
from kit.cli.common import app, console, one_of, reports_errors
from kit.image.flavors import AUTO_FLAVORS, FLAVORS
from kit.cli.flavor import build_flavor
from kit.cli.imagebuild import ensure_image


@app.command(short_help="Build (or reuse) the training image and check it")
@reports_errors
def build(
    flavor: Optional[str] = typer.Option(None, autocompletion=one_of(*AUTO_FLAVORS, *FLAVORS),
                                         help="auto (the default: gpu when every host has NVIDIA GPUs, cpu when "
                                              "none has), cpu (Debian, torch CPU, Horovod with Gloo), gpu (CUDA, "
                                              "NCCL + Gloo), tf (tf-gpu or tf-cpu by the same rule), tf-cpu or "
                                              "tf-gpu (TensorFlow, no torch or Horovod)."),
    hosts: Optional[Path] = typer.Option(None, "--hosts", help="hosts.txt: flavor auto follows these hosts' GPUs "
                                                                 "(read over SSH; default: the recorded cluster's "
                                                                 "hosts, else this machine)."),
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
    cfg_file = read_config(config)
    flags["flavor"] = build_flavor(cfg_file, cluster_config(cfg_file, {}), flavor, hosts)
    plan = make_recipe(build_config(cfg_file, flags), single_stage=single_stage)
    if dry_run:
        _print_plan(plan, verify)
        return
    client = connect()
    tag = ensure_image(client, plan, verbose)
    if verify:
        with console.status(f"verifying: {VERIFIES[plan.config.framework]}"):
            report = verify_image(client, tag, plan.config.flavor, cuda=plan.config.cuda)
        _print_report(report)


# What `kit build` checks in a new image, per framework.
VERIFIES = {"horovod": "horovodrun --check-build and a 2-process Horovod allreduce",
            "tensorflow": "a 2-worker MultiWorkerMirroredStrategy allreduce"}


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
