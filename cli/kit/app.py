"""kit's command line. Commands parse, call a workflow, print; only this module
prints for the user and exits. KitError -> exit 1, BadInput -> exit 2."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kit import __version__
from kit.build import Step, build_image, check_base_images, connect, image_exists
from kit.config import build_config, read_config
from kit.errors import KitError
from kit.recipe import EXPECTED_BUILD, Recipe, make_recipe
from kit.verify import ImageReport, verify_image

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Turn a few Linux servers into a Horovod / PyTorch cluster of Docker containers.")
# soft_wrap: long lines (Dockerfile, commands) stay whole, so they can be copied.
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def reports_errors(command: Callable) -> Callable:
    """Print a KitError as `error:` / output tail / `fix:` lines and exit with its code."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KitError as e:
            err_console.print(f"[bold red]error:[/] {escape(str(e))}")
            if e.command:
                err_console.print(f"  command: {escape(e.command)}")
            if e.output_tail:
                err_console.print("  " + escape(e.output_tail).replace("\n", "\n  "), style="dim")
            if e.hint:
                err_console.print(f"[bold]fix:[/] {escape(e.hint)}")
            raise typer.Exit(e.exit_code) from None

    return wrapper


def _version(value: bool) -> None:
    if value:
        console.print(f"kit {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print kit's version."),
) -> None:
    pass


@app.command()
@reports_errors
def build(
    flavor: Optional[str] = typer.Option(None, help="cpu (Debian, torch CPU, Gloo) or gpu (CUDA, NCCL + Gloo)."),
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
    horovod_source: Optional[str] = typer.Option(None, help="Build Horovod from this pip URL instead (pin a commit)."),
    pip: List[str] = typer.Option([], help="Extra pip package for the image (repeat)."),
    apt: List[str] = typer.Option([], help="Extra apt package for the image (repeat)."),
    with_mpi: Optional[bool] = typer.Option(None, "--with-mpi/--without-mpi", help="Also build Open MPI support."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="kit.yaml to read (default ./kit.yaml)."),
    single_stage: bool = typer.Option(False, help="Build one stage with the compilers left in (for comparison)."),
    verify: bool = typer.Option(True, help="Check the image with horovodrun after building."),
    dry_run: bool = typer.Option(False, help="Print the Dockerfile and the plan; touch no Docker engine."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the whole build log."),
) -> None:
    """Build (or reuse) the training image and check that it trains with Horovod."""
    flags = dict(flavor=flavor, image=image, base_image=base_image, builder_image=builder_image, python=python,
                 torch=torch, torch_index_url=torch_index_url, pip_index_urls=tuple(index_url),
                 wheelhouse=wheelhouse, ca_bundle=ca_bundle, horovod_version=horovod_version,
                 horovod_source=horovod_source, pip_packages=tuple(pip), apt_packages=tuple(apt), with_mpi=with_mpi)
    recipe = make_recipe(build_config(read_config(config), flags), single_stage=single_stage)
    if dry_run:
        _print_plan(recipe, verify)
        return
    client = connect()
    check_base_images(client, recipe)
    if image_exists(client, recipe.tag):
        console.print(f"[green]✓[/] {recipe.tag} is up to date (built before from the same inputs)")
    else:
        console.print(f"building {recipe.tag} ({recipe.config.flavor}, {len(recipe.files)} files in the context)")
        with console.status("starting the build") as status:
            build_image(client, recipe, on_step=functools.partial(_show_step, status),
                        on_line=(lambda line: console.print(escape(line), style="dim")) if verbose else None)
        console.print(f"[green]✓[/] built {recipe.tag}")
    if verify:
        with console.status("verifying: horovodrun --check-build and a 2-process allreduce"):
            report = verify_image(client, recipe.tag, recipe.config.flavor)
        _print_report(report)


def _show_step(status, step: Step) -> None:
    how = "cached" if step.cached else f"{step.seconds:.0f}s"
    width = max(20, console.width - 16)
    label = step.label if len(step.label) <= width else step.label[: width - 1] + "…"
    console.print(f"  [dim]{how:>6}[/]  {escape(label)}")
    status.update(f"step {step.number + 1}/{step.total}" if step.number < step.total else "finishing")


def _print_plan(recipe: Recipe, verify: bool) -> None:
    console.print(recipe.dockerfile, markup=False)
    console.print("[bold]plan[/] (dry run: no Docker engine was contacted)")
    console.print(f"  tag      {recipe.tag}")
    console.print(f"  bases    {', '.join(recipe.base_images)} (must exist locally or in a registry)")
    for f in recipe.files:
        console.print(f"  context  {f.name} ({f.size():,} bytes)")
    if verify:
        frameworks, controllers, operations = EXPECTED_BUILD[recipe.config.flavor]
        console.print(f"  verify   horovodrun --check-build lists {', '.join(sorted(frameworks | controllers))} "
                      f"and operations {', '.join(sorted(operations))}; a 2-process allreduce sums to 3")


def _print_report(r: ImageReport) -> None:
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("image", r.tag)
    table.add_row("id", r.image_id.removeprefix("sha256:")[:12])
    table.add_row("size", f"{r.size_bytes / 1e9:.2f} GB")
    table.add_row("versions", f"Python {r.python}, torch {r.torch}, Horovod {r.horovod}")
    table.add_row("frameworks", ", ".join(sorted(r.check.frameworks)))
    table.add_row("controllers", ", ".join(sorted(r.check.controllers)))
    table.add_row("operations", ", ".join(sorted(r.check.operations)))
    sums = ", ".join(f"rank {a.rank} = {a.total:g}" for a in r.allreduce)
    table.add_row("allreduce", f"{len(r.allreduce)} processes, sum {sums} (expected {r.allreduce[0].expected:g}) ✓")
    console.print("[green]✓[/] verified")
    console.print(table)


def main() -> None:
    app()
