"""The end of `kit up`: from the primary's container, SSH to every container on the
cluster port with strict host-key checking; the shared workspace; and the image's
framework (`horovodrun --check-build`, or TensorFlow importing)."""

from __future__ import annotations

import secrets
import shlex
import time

from kit.jobs.commands.docker import command, exec_argv
from kit.config.settings import ClusterConfig, framework
from kit.errors import KitError
from kit.cluster.fanout import fan_out
from kit.runners import SSHD_READY_S, run_until_ok
from kit.cluster.steps.node import Node
from kit.cluster import state as st
from kit.jobs.commands.horovod import HorovodOptions, Slot, horovodrun_argv, rank_command, split_rank
from kit.network import measure
from kit.image.verify import AllreduceRank, parse_allreduce, parse_check_build

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
    token = secrets.token_hex(8)
    path = f"{workspace}/.kit-shared-check-{token}"  # its own: two checks at once never read each other's
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
                   "tensorflow": "python -I -c 'import tensorflow as tf; print(tf.__version__)'"}


def cuda_check_argv(state: st.ClusterState) -> tuple[list[str], list[str]]:
    """(docker exec's options, horovodrun's argv) in the primary's container: a rank on every GPU of every host, CUDA
    tensors through NCCL over the training network, each host's ranks on its own interface (the rank launcher)."""
    members = measure.route(state)
    ranks = [Slot(h.name, h.address, h.slots or 1, members[h.name].address) for h in state.hosts]
    env = [a for k, v in measure.rank_env(members, {h.name: h.address for h in state.hosts}) for a in ("-e", f"{k}={v}")]
    return env, horovodrun_argv(sum(r.slots for r in ranks), ranks, state.ssh_port, [members[state.primary.name].iface],
                                rank_command("/opt/kit/allreduce_check.py", ["--cuda"]), HorovodOptions())


def cuda_check(primary: Node, nodes: list[Node], state: st.ClusterState, cfg: ClusterConfig) -> dict[str, str]:
    """The gpu flavor's NCCL path on the hosts' own GPUs; per host what its ranks found (GPU, driver, CUDA, NCCL)."""
    options, argv = cuda_check_argv(state)
    r = primary.runner.run(command(exec_argv(primary.place.container, argv, tuple(options))), timeout=SSHD_READY_S * 10)
    seen = parse_allreduce("\n".join(split_rank(line)[1] for line in r.stdout.splitlines()))
    total = sum(h.slots or 1 for h in state.hosts)
    if not r.ok or len(seen) != total or not all(a.ok for a in seen):
        raise KitError(f"CUDA tensors did not allreduce through NCCL across the hosts' {total} GPUs "
                       f"({len(seen)} ranks answered)", host=primary.name, command=r.command, output_tail=r.tail(),
                       hint="the tail says which rank failed; `kit exec HOST -- nvidia-smi` shows a host's GPUs")
    return cuda_summary(seen, {n.address: n.name for n in nodes})


def cuda_summary(ranks: list[AllreduceRank], host_of: dict[str, str]) -> dict[str, str]:
    """host -> `N GPUs: model (driver D, CUDA C, NCCL N)` from the ranks' own reports. Pure."""
    by_host: dict[str, list[AllreduceRank]] = {}
    for a in ranks:
        by_host.setdefault(a.fact("host"), []).append(a)
    return {host_of.get(host, host): (f"{len(found)} GPU{'s' if len(found) > 1 else ''}: "
                                      f"{found[0].fact('gpu').replace('_', ' ')} (driver {found[0].fact('driver')}, "
                                      f"CUDA {found[0].fact('cuda')}, NCCL {found[0].fact('nccl')}): CUDA allreduce "
                                      "through NCCL ✓")
            for host, found in by_host.items()}


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
