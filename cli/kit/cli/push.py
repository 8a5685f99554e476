"""`kit push`: the cluster's image, or another local one, pushed to a registry."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from kit.image.build import connect
from kit.image.push import Layer, parse_reference, push as push_image
from kit.shown import visible
from kit.cli.common import CONFIG, LiveProgress, app, console, progress_bar, reports_errors
from kit.cli.export import default_image


@app.command(short_help="Push kit's image to a registry, for Kubernetes")
@reports_errors
def push(
    reference: str = typer.Argument(..., metavar="REGISTRY/REPO:TAG",
                                    help="Where to push: the registry (a host with a dot or a port, or localhost), the "
                                         "repository, and a tag (:TAG may be left out: the image's own tag is used)."),
    image: Optional[str] = typer.Option(None, "--image", metavar="IMAGE:TAG",
                                        help="The local image to push (default: cluster.image_tag, else the image kit "
                                             "build makes from kit.yaml's build settings)."),
    config: Optional[Path] = CONFIG,
) -> None:
    """Tag kit's image as REGISTRY/REPO[:TAG] and push it with the Docker engine, showing each layer's progress;
    prints the digest the registry holds. The login is the Docker config's (docker login REGISTRY), the registry's
    CA the engine's (/etc/docker/certs.d/REGISTRY/ca.crt); kit never shows either.

    \b
      kit push registry.example.org:5000/team/horovod
      kit push localhost:5000/kit/horovod:v1 --image kit/horovod:cpu-1a2b3c4d5e6f
    """
    ref = parse_reference(reference)  # before the engine is asked: a bad name changes nothing
    client = connect()
    source = image or default_image(client, config)
    with progress_bar() as bar:
        rows = LiveProgress(bar)
        done = push_image(client, source, ref, on_layer=lambda layer: _show(rows, layer))
    console.print(f"[green]✓[/] pushed {escape(source)} as {escape(str(done.reference))}: {done.sent} "
                  f"layer{'' if done.sent == 1 else 's'} sent, {done.present} already there")
    console.print(f"digest: {done.digest}", markup=False)
    console.print(f"pull it as {done.reference.repository}@{done.digest}", markup=False)


def _show(rows: LiveProgress, layer: Layer) -> None:
    row = escape(visible(layer.id, one_line=True, cap=200))  # the engine's words, in a column of Rich markup
    rows.status(row, layer.state)
    if layer.state == "Pushed" and layer.total:
        rows.transfer(row, layer.total, layer.total)
    elif layer.total:
        rows.transfer(row, layer.current, layer.total)
