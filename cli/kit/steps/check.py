"""The end of `kit up`: from the primary's container, SSH to every container on the
cluster port with strict host-key checking; the shared workspace; and the image's
framework (`horovodrun --check-build`, or TensorFlow importing)."""

from __future__ import annotations

import secrets
import shlex
import time

from kit.commands.docker import command, exec_argv
from kit.config import ClusterConfig, framework
from kit.errors import KitError
from kit.fanout import fan_out
from kit.runners import SSHD_READY_S, run_until_ok
from kit.steps.node import Node
from kit.verify import parse_check_build

def ssh_pair(primary: Node, target: Node, cfg: ClusterConfig) -> None:
    argv = exec_argv(primary.place.container, ["ssh", target.address, "true"])
    r = run_until_ok(primary.runner, command(argv), SSHD_READY_S, timeout=SSHD_READY_S)
    if not r.ok:
        raise KitError(f"SSH from the primary's container to {target.name} ({target.address}:{cfg.ssh_port}) "
                       f"failed", host=primary.name, command=r.command, output_tail=r.tail(),
                       hint=f"see `docker logs {target.place.container}` on {target.name}; `kit up` rewrites the keys")


def ssh_mesh(primary: Node, nodes: list[Node], cfg: ClusterConfig) -> None:
    fan_out("SSH from the primary's container", nodes, lambda n: ssh_pair(primary, n, cfg), lambda n: n.name)


SHARED_READY_S = 10  # NFS may cache "no such file" for a few seconds


def shared_workspace(primary: Node, others: list[Node], workspace: str) -> None:
    """A file the primary's container writes in the workspace is read by every other container, at the same path."""
    token, path = secrets.token_hex(8), f"{workspace}/.kit-shared-check"
    write = exec_argv(primary.place.container, ["sh", "-c", f"echo {token} > {shlex.quote(path)}"])
    primary.runner.run(command(write)).check(f"cannot write in the workspace {workspace}")

    def read(n: Node) -> None:
        deadline = time.monotonic() + SHARED_READY_S
        while True:
            r = n.runner.run(command(exec_argv(n.place.container, ["cat", path])))
            if r.ok and r.stdout.strip() == token:
                return
            if time.monotonic() > deadline:
                raise KitError(f"the workspace is not shared: the container here does not see {path}, which the "
                               f"primary's container wrote", host=n.name, command=r.command, output_tail=r.tail(),
                               hint="`kit down`, then `kit up` again mounts it afresh")
            time.sleep(0.5)
    try:
        fan_out("checking the shared workspace", others, read, lambda n: n.name)
    finally:
        primary.runner.run(command(exec_argv(primary.place.container, ["rm", "-f", path])))


# Per framework: what runs in the primary's container to show the image's framework works there.
FRAMEWORK_CHECK = {"horovod": "horovodrun --check-build",
                   "tensorflow": "python -c 'import tensorflow as tf; print(tf.__version__)'"}


def check_framework(primary: Node, flavor: str) -> None:
    kind = framework(flavor)
    r = primary.runner.run(command(exec_argv(primary.place.container, shlex.split(FRAMEWORK_CHECK[kind]))))
    r.check(f"`{FRAMEWORK_CHECK[kind]}` failed in the primary's container",
            hint="rebuild the image with kit build (see its verification)")
    if kind != "horovod":
        return
    missing = parse_check_build(r.stdout).missing(flavor)
    if missing:
        raise KitError(f"the image lacks {', '.join(missing)}", host=primary.name, command=r.command,
                       hint="rebuild the image with kit build (see its verification)")
