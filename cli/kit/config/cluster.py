"""kit.yaml's cluster section: how the cluster's containers are made (ClusterConfig), and its mounts."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from kit.config.build import BuildConfig
from kit.cluster.place import Place

KIT_ROOT = "/var/lib/kit"  # kit's folders on every host live under it

_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_SIZE = re.compile(r"^\d+[kmg]?$")

# The fix shown for a bad value of each setting (kit.config.settings.HINTS has every section's).
HINTS: dict[str, str] = {
    "name": "use 1-32 lower-case letters, digits and dashes, e.g. lab or cifar-1",
    "ssh_port": "use a free TCP port from 1024 to 65535 (default 12345), not the hosts' own sshd port",
    "workspace": "use an absolute folder of its own, e.g. /srv/kit/workspace (letters, digits and . _ - /; "
                 "not a system folder)",
    "shm_size": "use a size such as 8g, or leave it out to share the host's IPC namespace (--ipc=host)",
    "gpus": "use a number of GPUs per host, or auto (from nvidia-smi)",
    "connect_timeout": "use seconds from 1 to 300",
    "image_tag": "use an image that `docker images` lists, by its tag, e.g. kit-horovod:cpu-0123456789ab "
                 "(`docker tag IMAGE NAME:TAG` gives one a tag)",
    "storage": "use one of: copy (the default), sshfs, nfs",
    "nfs_server": "use server:/absolute/path of an existing NFS export, or leave it out to export from the primary",
    "network": "use a subnet that every host has an address on, e.g. 10.232.0.0/24, or ssh for the hosts.txt network; "
               "leave it out and kit chooses the fastest that joins every host",
    "mounts": "write each as HOST_PATH:CONTAINER_PATH[:ro|:rw] (read-only unless :rw) with absolute paths of letters, "
              "digits and . _ - /, e.g. [/data/imagenet:/data/imagenet]; neither a system folder, kit's folders nor "
              "the workspace",
    "share_hosts_with_slurm": "use true or false (true: kit up on nodes of the Slurm cluster kit prepared, where "
                              "every user of both trusts the others)",
}
_NFS_SERVER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*:/[A-Za-z0-9._/-]*$")
_WORKSPACE = re.compile(r"^/[A-Za-z0-9._/-]+$")
# Folders that are the system's: never a workspace, nor (SYSTEM_TREES) anything below them.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run",
                "/sbin", "/sys", "/usr", "/var/lib/docker", "/var/lib/containerd", "/var/log", "/var/run")
SYSTEM_FOLDERS = {"/", "/home", "/mnt", "/media", "/opt", "/srv", "/tmp", "/var", "/var/lib", "/var/tmp", "/data",
                  *SYSTEM_TREES}
# Where no mount may land in a container: the image's system, its Python (/opt/venv) and kit's files (/opt/kit,
# /etc/kit, and the jobs and keys under /var/lib/kit).
CONTAINER_TREES = (*SYSTEM_TREES, "/var", "/opt/venv", "/opt/kit")
CONTAINER_FOLDERS = {"/", "/opt", "/tmp"}


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@dataclass(frozen=True)
class Mount:
    """A folder of every host in every container of the cluster (docker's -v HOST:CONTAINER[:ro|:rw])."""

    host: str
    container: str
    writable: bool = False

    def __str__(self) -> str:
        return f"{self.host}:{self.container}:{'rw' if self.writable else 'ro'}"

    def docker_option(self) -> str:
        """--mount's form, not -v's: a host path that is missing fails the container's start instead of being made
        empty (a dataset share not mounted yet after a reboot would look like an empty dataset)."""
        return f"type=bind,source={self.host},target={self.container}" + ("" if self.writable else ",readonly")


def _clean_path(path: str, what: str) -> str:
    if not re.fullmatch(r"/[A-Za-z0-9._/-]*", path) or any(part in (".", "..") for part in path.split("/")):
        raise ValueError(f"the {what} {path!r} is not an absolute path of letters, digits and . _ - /")
    return re.sub("/+", "/", path).rstrip("/") or "/"


def parse_mount(text: str, workspace: str) -> Mount:
    """HOST_PATH:CONTAINER_PATH[:ro|:rw], checked as the workspace is (the paths reach shells and docker, as root)."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"'{text}' is not HOST_PATH:CONTAINER_PATH[:ro|:rw]")
    host, container = _clean_path(parts[0], "host path"), _clean_path(parts[1], "container path")
    if host in SYSTEM_FOLDERS or any(_within(host, d) for d in SYSTEM_TREES):
        raise ValueError(f"'{text}': the host path {host} is a system folder: every container would see it, as root")
    if _within(host, KIT_ROOT):
        raise ValueError(f"'{text}': the host path {host} is inside kit's own folders (the clusters' keys and jobs)")
    if container in CONTAINER_FOLDERS or any(_within(container, d) for d in CONTAINER_TREES):
        raise ValueError(f"'{text}': the container path {container} is a folder of the image's system or of kit's")
    if _within(container, workspace) or _within(workspace, container):
        raise ValueError(f"'{text}': the container path {container} is over the workspace {workspace}")
    return Mount(host, container, len(parts) == 3 and parts[2] == "rw")


class ClusterConfig(BaseModel):
    """How the cluster's containers are made; the hosts come from hosts.txt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "kit"
    ssh_port: int = 12345
    workspace: str | None = None  # default: /var/lib/kit/<name>/workspace on every host
    shm_size: str | None = None   # None: --ipc=host (NCCL and DataLoader need more than Docker's 64 MB)
    gpus: int | Literal["auto"] | None = None
    connect_timeout: int = 10
    image_tag: str | None = None  # default: the tag `kit build` derives from the build section
    storage: Literal["copy", "sshfs", "nfs"] = "copy"  # how every host sees the workspace (kit/steps/storage.py)
    nfs_server: str | None = None  # storage nfs: an existing export (server:/path); default: the primary exports
    mounts: tuple[str, ...] = ()   # host folders in every container: HOST:CONTAINER[:ro|:rw], kept as HOST:CONTAINER:ro
    network: str | None = None     # the training network: a subnet, or ssh (hosts.txt's); None: kit measures (kit.network)
    share_hosts_with_slurm: bool = False  # up on nodes of the Slurm kit prepared: their users all trust each other

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"'{v}' is not a cluster name")
        return v

    @field_validator("ssh_port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 1024 <= v <= 65535:
            raise ValueError(f"{v} is not a port from 1024 to 65535")
        return v

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, v: str | None, info: ValidationInfo) -> str | None:
        """An allow-list: the path reaches shells, /etc/exports, fstab and Ansible, on every host, as root."""
        if v is None:
            return v
        if not _WORKSPACE.match(v) or any(part in (".", "..") for part in v.split("/")):
            raise ValueError(f"{v!r} is not an absolute path of letters, digits and . _ - /")
        v = re.sub("/+", "/", v).rstrip("/") or "/"
        own = f"{KIT_ROOT}/{info.data.get('name', 'kit')}/workspace"
        if v in SYSTEM_FOLDERS or any(v.startswith(f"{d}/") for d in SYSTEM_TREES):
            raise ValueError(f"'{v}' is a system folder: every host would share it with the jobs, as root")
        if (v == KIT_ROOT or v.startswith(f"{KIT_ROOT}/")) and v != own:
            raise ValueError(f"'{v}' is inside kit's own folders (another cluster's keys and jobs live there)")
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str | None) -> str | None:
        if v is not None and not _SIZE.match(str(v).lower()):
            raise ValueError(f"'{v}' is not a size")
        if v is not None and str(v).isdigit():  # `shm_size: 8` meant 8g, surely
            raise ValueError(f"'{v}' has no unit, and Docker would read it as {v} bytes")
        return str(v).lower() if v is not None else v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v):
        if isinstance(v, int) and not 0 <= v <= 64:
            raise ValueError(f"{v} is not a number of GPUs from 0 to 64")
        return v

    @field_validator("connect_timeout")
    @classmethod
    def _timeout(cls, v: int) -> int:
        if not 1 <= v <= 300:
            raise ValueError(f"{v} is not a number of seconds from 1 to 300")
        return v

    @field_validator("image_tag")
    @classmethod
    def _image_tag(cls, v: str | None) -> str | None:
        if v is not None and "@" in v:  # each host gets the image under this tag: a digest is no tag to give it
            raise ValueError(f"'{v}' names an image by its digest, not by a tag")
        return BuildConfig._image_ref(v)

    @field_validator("nfs_server")
    @classmethod
    def _nfs_server(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not _NFS_SERVER.match(v):
            raise ValueError(f"'{v}' is not server:/path")
        if v is not None and info.data.get("storage") != "nfs":
            raise ValueError(f"is only read with storage: nfs (storage is {info.data.get('storage')})")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        workspace = info.data.get("workspace") or f"{KIT_ROOT}/{info.data.get('name', 'kit')}/workspace"
        found = [parse_mount(m, workspace) for m in v]
        targets = [m.container for m in found]
        if twice := next((t for t in targets if targets.count(t) > 1), None):
            raise ValueError(f"two entries mount at the container path {twice}")
        return tuple(str(m) for m in found)

    @field_validator("network")
    @classmethod
    def _network(cls, v: str | None) -> str | None:
        """ssh, or an IPv4 subnet, written as its network (10.232.0.7/24 -> 10.232.0.0/24)."""
        if v is None or v == "ssh":
            return v
        try:
            net = ipaddress.IPv4Network(str(v), strict=False)
        except ValueError:
            raise ValueError(f"'{v}' is neither a subnet (e.g. 10.232.0.0/24) nor ssh") from None
        if "/" not in str(v) or net.prefixlen == 32 or net.is_loopback or net.is_link_local:
            raise ValueError(f"'{v}' is not a subnet that hosts share (give its prefix, e.g. 10.232.0.0/24)")
        return str(net)

    @property
    def bind_mounts(self) -> tuple[Mount, ...]:
        return tuple(parse_mount(m, self.workspace_path) for m in self.mounts)

    @property
    def kit_dir(self) -> str:
        """kit's folder on every host: keys, and nothing kit did not write."""
        return f"{KIT_ROOT}/{self.name}"

    @property
    def workspace_path(self) -> str:
        return self.workspace or f"{self.kit_dir}/workspace"

    @property
    def container(self) -> str:
        return f"kit-{self.name}"

    def host_place(self) -> Place:
        """Where the container lives on a real host: one a host, on the host's network."""
        return Place(self.container, self.kit_dir)
