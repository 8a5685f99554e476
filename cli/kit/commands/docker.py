"""docker command lines for a cluster container. Pure; tested by exact equality."""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass

from kit.config import ClusterConfig

CONTAINER_SSH_DIR = "/etc/kit/ssh"


@dataclass(frozen=True)
class ContainerSpec:
    cluster: ClusterConfig
    image: str      # the tag
    image_id: str
    gpus: bool
    memlock: str = "-1:-1"  # NCCL / RDMA pin memory: unlimited unless the host cannot allow it
    # The host's name -> its cluster address. Gloo resolves its own hostname and crashes when that fails.
    add_hosts: tuple[tuple[str, str], ...] = ()

    def options(self) -> list[str]:
        c = self.cluster
        shm = ["--ipc=host"] if c.shm_size is None else [f"--shm-size={c.shm_size}"]
        gpus = ["--gpus", "all"] if self.gpus else []
        hosts = [arg for name, address in self.add_hosts for arg in ("--add-host", f"{name}:{address}")]
        return ["--net=host", *shm, "--ulimit", f"memlock={self.memlock}", "--restart", "unless-stopped",
                "-v", f"{c.kit_dir}/ssh:{CONTAINER_SSH_DIR}:ro", "-v", f"{c.jobs_dir}:{c.jobs_dir}",
                "-v", f"{c.workspace_path}:{c.workspace_path}", "-w", c.workspace_path,
                "-e", f"KIT_SSH_PORT={c.ssh_port}", "-e", f"KIT_CLUSTER={c.name}", *hosts, *gpus]

    @property
    def digest(self) -> str:
        """Changes whenever the container would be started differently (options or image)."""
        text = "\0".join([self.image, self.image_id, *self.options()])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_argv(spec: ContainerSpec) -> list[str]:
    c = spec.cluster
    return ["docker", "run", "-d", "--name", c.container,
            "--label", f"io.kit.cluster={c.name}", "--label", f"io.kit.spec={spec.digest}",
            *spec.options(), spec.image]


def remove_argv(name: str) -> list[str]:
    return ["docker", "rm", "-f", name]


def start_argv(name: str) -> list[str]:
    return ["docker", "start", name]


def exec_argv(name: str, argv: list[str]) -> list[str]:
    return ["docker", "exec", name, *argv]


def load_command() -> str:
    return "gunzip -c | docker load"


def command(argv: list[str]) -> str:
    return shlex.join(argv)
