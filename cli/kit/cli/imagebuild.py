"""Building the image of a cluster's settings, as `kit build`, `kit up` (when none is built yet) and `kit demo` do:
the one built before from the same settings, else its sources resolved and the image built, with the build's steps
shown one line each."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from rich.markup import escape

from kit.image.build import Step, build_image, find_built, resolve_sources, scratch, wheel_pins
from kit.cluster.lock import build_lock
from kit.image.recipe import Recipe, make_recipe
from kit.cli.common import console


def ensure_image(client, plan: Recipe, verbose: bool) -> str:
    """The image of these settings: the one built before from them (its key), else resolved and built now, once:
    a build of the same settings that runs already is waited for, and its image taken. Its tag."""
    def waiting(holder: str) -> None:
        console.print(f"{holder} is building the image of these settings: waiting for it")

    if not (built := find_built(client, plan)):
        with build_lock(plan.key, waiting):
            if not (built := find_built(client, plan)):
                return _build(client, plan, verbose)
    console.print(f"[green]✓[/] {built} is up to date (built before from the same settings)")
    return built


def _build(client, plan: Recipe, verbose: bool) -> str:
    pins = wheel_pins()
    with tempfile.TemporaryDirectory(prefix="kit-build-", dir=scratch()) as work:
        with console.status("finding the base image and the Python packages") as status:
            sources = resolve_sources(client, plan.config, Path(work), pins=pins, on_status=status.update)
        _print_rows("sources", sources.lines())
        recipe = make_recipe(plan.config, single_stage=plan.single_stage, base=sources.base.ref,
                             builder=sources.builder.ref if sources.builder else None,
                             wheelhouse=sources.wheelhouse, ca_bundle=sources.ca_bundle)
        console.print(f"building {recipe.tag} ({recipe.config.flavor}, {len(recipe.files)} files in the context)")
        with console.status("starting the build") as status:
            build_image(client, recipe, on_step=functools.partial(_show_step, status),
                        on_line=(lambda line: console.print(escape(line), style="dim")) if verbose else None)
        try:  # built: the next build of a changed top takes the same files below
            pins.keep(sources.wheelhouse.resolved)
        except OSError as e:
            console.print(f"note: the wheels this image took are not kept in {pins.folder} ({e}); the next build "
                          "resolves them anew")
    console.print(f"[green]✓[/] built {recipe.tag}")
    return recipe.tag


def _print_rows(title: str, rows: list[tuple[str, str]]) -> None:
    """A titled list of `name  value` lines, each whole (soft-wrapped: URLs and paths stay copyable)."""
    console.print(f"[bold]{title}[/]")
    for key, value in rows:
        console.print(f"  {key:<8}  {escape(value)}")


def _show_step(status, step: Step) -> None:
    how = "cached" if step.cached else f"{step.seconds:.0f}s"
    width = max(20, console.width - 16)
    label = step.label if len(step.label) <= width else step.label[: width - 1] + "…"
    console.print(f"  [dim]{how:>6}[/]  {escape(label)}")
    status.update(f"step {step.number + 1}/{step.total}" if step.number < step.total else "finishing")
