"""One container a host, started exactly as the spec says; left alone when it already is.
Also what containers need first: the workspace folder, and the local cluster's private network."""

from __future__ import annotations

from kit.jobs.commands.docker import (ContainerSpec, command, network_create_argv, remove_argv, restart_argv, run_argv,
                                      start_argv)
from kit.errors import KitError
from kit.cluster.identity import Owner
from kit.cluster.steps.node import Node


def apply(node: Node, spec: ContainerSpec, *, restart: bool = False) -> None:
    """restart: the container must start again to see what is mounted now at a folder it mounts."""
    c, name, have = spec.cluster, spec.place.container, node.facts.container
    if have is not None and (have.cluster != c.name or (spec.owner and (have.owner is None
                                                                        or have.owner.id != spec.owner.id))):
        raise KitError(f"a container named {name} exists that kit did not make for cluster {c.name}",
                       host=node.name, hint=f"remove or rename it (docker rm -f {name}), or pick another "
                                            "cluster.name")
    if have is not None and have.spec == spec.digest and have.image_id == spec.image_id:
        if have.status != "running":
            _run(node, start_argv(name), "cannot start the container")
            node.changes.append(f"started container {name}")
        elif restart:
            _run(node, restart_argv(name), "cannot restart the container")
            node.changes.append(f"restarted container {name} to see the mounted workspace")
        return
    if have is not None:
        _run(node, remove_argv(name), "cannot remove the old container")
        node.changes.append(f"removed container {name} (its image or settings changed)")
    _run(node, run_argv(spec), "cannot start the container")
    node.changes.append(f"started container {name}")


def make_workspace(node: Node, path: str) -> None:
    _run(node, ["mkdir", "-p", path], "cannot make the workspace folder")
    node.changes.append(f"made {path}")


def make_network(node: Node, cluster: str, owner: Owner | None = None) -> None:
    """The private network of the node's place, made once; preflight refused one kit did not make."""
    p, have = node.place, node.facts.network
    if have is not None and p.subnet in have.subnets:
        return
    if have is not None:
        raise KitError(f"the Docker network {p.network} has subnet {', '.join(have.subnets)}, not {p.subnet}",
                       host=node.name, hint="run kit down, then kit up again")
    _run(node, network_create_argv(p, cluster, owner), "cannot make the cluster's network")
    node.changes.append(f"made network {p.network} ({p.subnet})")


def _run(node: Node, argv: list[str], what: str) -> None:
    node.runner.run(command(argv), changes=True).check(what, hint="the tail above says why; fix it and run kit up again")
