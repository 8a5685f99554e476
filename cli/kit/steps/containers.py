"""One container a host, started exactly as the spec says; left alone when it already is."""

from __future__ import annotations

from kit.commands.docker import ContainerSpec, command, remove_argv, run_argv, start_argv
from kit.errors import KitError
from kit.steps.node import Node


def apply(node: Node, spec: ContainerSpec) -> None:
    c, have = spec.cluster, node.facts.container
    if have is not None and have.cluster != c.name:
        raise KitError(f"a container named {c.container} exists that kit did not make for cluster {c.name}",
                       host=node.name, hint=f"remove or rename it (docker rm -f {c.container}), or pick another "
                                            "cluster.name")
    if have is not None and have.spec == spec.digest and have.image_id == spec.image_id:
        if have.status != "running":
            _run(node, start_argv(c.container), "cannot start the container")
            node.changes.append(f"started container {c.container}")
        return
    if have is not None:
        _run(node, remove_argv(c.container), "cannot remove the old container")
        node.changes.append(f"removed container {c.container} (its image or settings changed)")
    if not node.facts.workspace_exists:
        _run(node, ["mkdir", "-p", c.workspace_path], "cannot make the workspace folder")
        node.changes.append(f"made {c.workspace_path}")
    _run(node, run_argv(spec), "cannot start the container")
    node.changes.append(f"started container {c.container}")


def _run(node: Node, argv: list[str], what: str) -> None:
    node.runner.run(command(argv), changes=True).check(what, hint="the tail above says why; fix it and run kit up again")
