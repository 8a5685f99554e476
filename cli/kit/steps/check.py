"""The end of `kit up`: from the primary's container, SSH to every container on the
cluster port with strict host-key checking, and `horovodrun --check-build`."""

from __future__ import annotations

import time

from kit.commands.docker import command, exec_argv
from kit.config import ClusterConfig
from kit.errors import KitError
from kit.fanout import fan_out
from kit.steps.node import Node
from kit.verify import parse_check_build

SSH_READY_S = 30  # a container's sshd starts in well under a second; allow for a loaded host


def ssh_pair(primary: Node, target: Node, cfg: ClusterConfig) -> None:
    argv = exec_argv(primary.place.container, ["ssh", target.address, "true"])
    deadline = time.monotonic() + SSH_READY_S
    while True:
        r = primary.runner.run(command(argv), timeout=SSH_READY_S)
        if r.ok:
            return
        if time.monotonic() > deadline or "Host key verification failed" in r.stderr:
            raise KitError(f"SSH from the primary's container to {target.name} ({target.address}:{cfg.ssh_port}) "
                           f"failed", host=primary.name, command=r.command, output_tail=r.tail(),
                           hint=f"see `docker logs {target.place.container}` on {target.name}; `kit up` rewrites the keys")
        time.sleep(0.5)


def ssh_mesh(primary: Node, nodes: list[Node], cfg: ClusterConfig) -> None:
    fan_out("SSH from the primary's container", nodes, lambda n: ssh_pair(primary, n, cfg), lambda n: n.name)


def check_build(primary: Node, flavor: str) -> None:
    r = primary.runner.run(command(exec_argv(primary.place.container, ["horovodrun", "--check-build"])))
    r.check("horovodrun --check-build failed in the primary's container")
    missing = parse_check_build(r.stdout).missing(flavor)
    if missing:
        raise KitError(f"the image lacks {', '.join(missing)}", host=primary.name, command=r.command,
                       hint="rebuild the image with kit build (see its verification)")
