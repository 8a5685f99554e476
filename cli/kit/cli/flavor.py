"""build.flavor auto in the commands: the flavor the hosts call for (their NVIDIA GPUs, or this machine's), said
with why, and the image of it: the one built before from the same settings, or built now as `kit build` builds it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.markup import escape

from kit.image import gpus
from kit.cluster import state as st
from kit.image.build import find_built
from kit.config.settings import AUTO_FLAVORS, ClusterConfig, ConfigFile, build_config, cuda_line, requested_flavor
from kit.cluster.fanout import fan_out
from kit.cluster.identity import Identity
from kit.config.hosts import Host, read_hosts
from kit.image.recipe import make_recipe
from kit.runners.local import LocalRunner
from kit.cluster.steps.image import LocalImage, local_image
from kit.cluster.steps.node import Node
from kit.cli.common import connector, console
from kit.cli.imagebuild import ensure_image

THIS_MACHINE = "this machine"


def say(requested: str, flavor: str, why: str) -> None:
    console.print(f"flavor {requested} -> {flavor}: {escape(why)}")


def read_gpus(hosts: list[Host], timeout: int) -> dict[str, int]:
    """Each host's NVIDIA GPUs, read over SSH (read-only, all at once); an unreachable host is named."""
    connect = connector(timeout)

    def one(h: Host) -> int:
        runner = connect(h)
        try:
            return gpus.probe(runner).count
        finally:
            runner.close()
    return dict(zip((h.name for h in hosts), fan_out("reading the hosts' GPUs", hosts, one, lambda h: h.name)))


def build_flavor(cfg_file: ConfigFile, cfg: ClusterConfig, flag: str | None, hosts: Path | None, *,
                 local: bool = False) -> str:
    """`kit build`'s flavor: as set, or auto / tf decided from --hosts, else from the hosts of the cluster recorded
    here, else (and for a `local` cluster) from this machine; the decision is printed with why."""
    requested, where = requested_flavor(cfg_file, flag)
    if requested not in AUTO_FLAVORS:
        if hosts is not None:
            console.print(f"note: --hosts is read to decide flavor auto or tf; {escape(where)} is {requested}")
        return requested
    state = st.load(Identity(cfg.name, persist=False).folder) if hosts is None and not local else None
    if hosts is not None or (state and not all(h.local for h in state.hosts)):
        inventory = read_hosts(hosts) if hosts is not None else [h.host for h in state.hosts]
        flavor, why = gpus.decide(requested, where, read_gpus(inventory, cfg.connect_timeout))
        if hosts is None:
            why += f" (the hosts of cluster {cfg.name}, as kit up recorded them)"
    else:
        flavor, why = gpus.decide(requested, where, {THIS_MACHINE: gpus.probe(LocalRunner(THIS_MACHINE)).count},
                                  this_machine=True)
        why += "" if local else "; give --hosts hosts.txt to build for your servers"
    say(requested, flavor, why)
    return flavor


class UpImage:
    """`kit up`'s ImageChoice (kit.cluster.lifecycle): cluster.image_tag as it is, else the flavor its hosts call for and the
    image of kit.yaml's settings for it, built when there is none (a dry run builds nothing: it says what it would
    build). Bad settings and a missing image_tag are found before any host is read."""

    def __init__(self, client, cfg_file: ConfigFile, cfg: ClusterConfig, dry_run: bool, verbose: bool = False) -> None:
        self.client, self.cfg_file, self.dry_run, self.verbose = client, cfg_file, dry_run, verbose
        self.requested, self.where = requested_flavor(cfg_file)
        self.fixed = local_image(client, cfg.image_tag) if cfg.image_tag else None
        if self.requested not in AUTO_FLAVORS:
            build_config(cfg_file, {"flavor": self.requested})
        self.bar = None  # the live progress display, paused while a build prints its own

    def flavor(self, nodes: list[Node]) -> tuple[str, str | None]:
        if self.fixed and self.fixed.flavor:  # kit's own image says what it is
            return self.fixed.flavor, self.fixed.cuda
        here = all(n.host.local for n in nodes)
        flavor, why = gpus.decide(self.requested, self.where, {n.name: n.facts.nvidia_gpus for n in nodes},
                                  this_machine=here)
        if self.requested in AUTO_FLAVORS:
            say(self.requested, flavor, why)
        if self.fixed:
            return flavor, self.fixed.cuda
        self.config = build_config(self.cfg_file, {"flavor": flavor})
        return flavor, cuda_line(flavor, self.config.cuda)

    def image(self, flavor: str, line: str | None) -> LocalImage:
        if self.fixed:
            return self.fixed
        recipe = make_recipe(self.config)
        tag = find_built(self.client, recipe)
        if tag:  # (an image of an older kit has no CUDA label: its key says it was built from these settings)
            found = local_image(self.client, tag)
            return replace(found, cuda=found.cuda or line)
        if self.dry_run:
            console.print(f"would build {recipe.config.tag_prefix}-… (flavor {flavor}{f', CUDA {line}' if line else ''}"
                          f", key {recipe.key}): no image of these settings is here; kit up builds it first, as kit "
                          "build does (a dry run builds nothing)")
            return LocalImage(f"{recipe.config.tag_prefix}-…", "", 0, flavor, (), line)
        if self.bar:
            self.bar.stop()
        try:
            console.print(f"no {flavor} image of these settings is built here yet: building it (as kit build does)")
            tag = ensure_image(self.client, recipe, self.verbose)
        finally:
            if self.bar:
                self.bar.start()
        return local_image(self.client, tag)
