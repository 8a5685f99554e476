"""docker command lines for a cluster container. Pure; tested by exact equality."""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass

from kit.config.settings import ClusterConfig
from kit.cluster.identity import Owner
from kit.cluster.place import Place

CONTAINER_SSH_DIR = "/etc/kit/ssh"


@dataclass(frozen=True)
class ContainerSpec:
    cluster: ClusterConfig
    place: Place
    image: str      # the tag
    image_id: str
    gpus: bool
    memlock: str = "-1:-1"  # NCCL / RDMA pin memory: unlimited unless the host cannot allow it
    # The host's name -> its cluster address. Gloo resolves its own hostname and crashes when that fails.
    add_hosts: tuple[tuple[str, str], ...] = ()
    owner: Owner | None = None  # who made it: labelled, so no other control machine takes it for its own
    rdma: tuple[str, ...] = ()  # the host's RDMA device files (/dev/infiniband/uverbs0, rdma_cm...): for NCCL's IB/RoCE

    def options(self) -> list[str]:
        c, p = self.cluster, self.place
        shm = ["--ipc=host"] if c.shm_size is None else [f"--shm-size={c.shm_size}"]
        gpus = ["--gpus", "all"] if self.gpus else []
        hosts = [arg for name, address in self.add_hosts for arg in ("--add-host", f"{name}:{address}")]
        mounts = [arg for m in c.bind_mounts for arg in ("--mount", m.docker_option())]
        # NCCL's InfiniBand / RoCE transport opens the verbs devices and pins memory (memlock is unlimited already)
        rdma = [*(arg for d in self.rdma for arg in ("--device", d)), *(["--cap-add", "IPC_LOCK"] if self.rdma else [])]
        return [*p.network_options(), *shm, "--ulimit", f"memlock={self.memlock}", "--restart", "unless-stopped",
                "-v", f"{p.ssh_dir}:{CONTAINER_SSH_DIR}:ro", "-v", f"{p.jobs_dir}:{p.jobs_dir}",
                "-v", f"{c.workspace_path}:{c.workspace_path}", *mounts, "-w", c.workspace_path,
                # kit's files of a running job (its variables, its ranks' heartbeats): in memory, root's alone, gone
                # with the container, on no layer of it
                "--tmpfs", "/run/kit:rw,nosuid,nodev,noexec,mode=0700,size=64m",
                "-e", f"KIT_SSH_PORT={c.ssh_port}", "-e", f"KIT_CLUSTER={c.name}", *hosts, *gpus, *rdma]

    @property
    def digest(self) -> str:
        """Changes whenever the container would be started differently (options or image)."""
        text = "\0".join([self.image, self.image_id, *self.options()])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def owner_labels(owner: Owner | None) -> list[str]:
    return ["--label", f"io.kit.owner={owner.id}", "--label", f"io.kit.owner-name={owner.name}"] if owner else []


def run_argv(spec: ContainerSpec) -> list[str]:
    return ["docker", "run", "-d", "--name", spec.place.container,
            "--label", f"io.kit.cluster={spec.cluster.name}", *owner_labels(spec.owner),
            "--label", f"io.kit.spec={spec.digest}", *spec.options(), spec.image]


def network_create_argv(place: Place, cluster: str, owner: Owner | None = None) -> list[str]:
    return ["docker", "network", "create", "--driver", "bridge", "--subnet", place.subnet,
            "--label", f"io.kit.cluster={cluster}", *owner_labels(owner), place.network]


def network_remove_argv(network: str) -> list[str]:
    return ["docker", "network", "rm", network]


def remove_argv(name: str) -> list[str]:
    return ["docker", "rm", "-f", name]


def start_argv(name: str) -> list[str]:
    return ["docker", "start", name]


def restart_argv(name: str) -> list[str]:
    return ["docker", "restart", name]


def exec_argv(name: str, argv: list[str], options: tuple[str, ...] = ()) -> list[str]:
    return ["docker", "exec", *options, name, *argv]


def command(argv: list[str]) -> str:
    return shlex.join(argv)
