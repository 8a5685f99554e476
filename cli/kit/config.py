"""kit.yaml and flags -> validated, frozen settings.

Values come from two places: kit.yaml (each remembered with its line) and
command-line flags, which win. Validation happens once, here; every error
names where the bad value came from (`kit.yaml:7` or `--wheelhouse`) and the
form that is expected, and is raised before anything touches Docker or a host.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

from kit.errors import BadInput, read_input
from kit.pipconfig import has_credentials, redact, redact_text
from kit.place import Place

DEFAULT_CONFIG = Path("kit.yaml")
KIT_ROOT = "/var/lib/kit"  # kit's folders on every host live under it

# Known-good combinations. Horovod 0.28.1 needs the C++17 fix (applied by the
# recipe) for any torch >= 2.1; these torch builds were compiled against.
FLAVOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu": {
        "base_image": "debian:bookworm-slim",
        "builder_image": None,
        "python": "3.11",
        "torch": "2.13.0",
        "torch_index_url": "https://download.pytorch.org/whl/cpu",
        "horovod_version": "0.28.1",
    },
    # No CUDA base: torch's CUDA wheels bring the CUDA it runs with, and the CUDA compiler, headers and NCCL
    # that Horovod's build needs come as wheels of the same CUDA (see CUDA_LINES); the driver comes with --gpus.
    "gpu": {
        "base_image": "debian:trixie-slim",
        "builder_image": None,
        "python": "3.13",
        "torch": "2.14.1",
        "cuda": "13.0",
        "horovod_version": "0.28.1",
    },
    # TensorFlow's own multi-worker strategy: no torch, no Horovod. tensorflow[and-cuda] brings
    # the CUDA libraries it was built with as wheels, so the GPU image needs no CUDA base.
    "tf-cpu": {
        "image": "kit-tensorflow",
        "base_image": "debian:bookworm-slim",
        "python": "3.11",
        "tensorflow": "2.21.0",
    },
    "tf-gpu": {
        "image": "kit-tensorflow",
        "base_image": "debian:bookworm-slim",
        "python": "3.11",
        "tensorflow": "2.21.0",
    },
}

# What each flavor's image runs: torch + Horovod (horovodrun, torchrun) or TensorFlow (its
# MultiWorkerMirroredStrategy), and whether it is for NVIDIA GPUs.
FLAVORS: dict[str, tuple[str, bool]] = {
    "cpu": ("horovod", False), "gpu": ("horovod", True), "tf-cpu": ("tensorflow", False), "tf-gpu": ("tensorflow", True),
}

# build.flavor's other values (auto is the default): decided from the hosts' NVIDIA GPUs (kit.gpus.decide), the
# first when no host has one, the second when every host has.
AUTO_FLAVORS: dict[str, tuple[str, str]] = {"auto": ("cpu", "gpu"), "tf": ("tf-cpu", "tf-gpu")}


@dataclass(frozen=True)
class CudaLine:
    """One CUDA line of torch's builds, and where the compile pieces of the same CUDA come from as wheels."""

    torch_index_url: str        # torch's own index of the line
    compiler: tuple[str, ...]   # what Horovod's build adds to torch's CUDA: nvcc, crt, nvvm, CCCL's headers
    # The local version (torch==X+cu128) kit asks for where PyPI's torch is another line's: then only the line's
    # own index (or a mirror, or a wheelhouse) has it, and a missing one is named at once, not after the build.
    # None for the line of PyPI's torch itself, which pip may take from the index or from pip's own sources.
    torch_local: str | None = None
    min_driver: str = ""        # the oldest NVIDIA driver (Linux) that runs it: NVIDIA's CUDA compatibility table


# The CUDA lines kit builds for, newest first. 13.0: Turing to Blackwell (sm_75..sm_120), the CUDA of PyPI's torch
# 2.14; 12.8: Volta to Blackwell, from PyTorch's cu128 index. Each runs on a driver of its CUDA major or newer
# (minor version compatibility): CUDA 13.x needs 580 or newer, 12.x 525 or newer (12.8's full-feature driver is
# 570.26: below it a 12.x build runs, but PTX newer than the driver's is not compiled at load time).
CUDA_LINES: dict[str, CudaLine] = {
    "13.0": CudaLine("https://download.pytorch.org/whl/cu130", ("cuda-toolkit[nvcc,cccl]",), min_driver="580"),
    "12.8": CudaLine("https://download.pytorch.org/whl/cu128",
                     ("nvidia-cuda-nvcc-cu12==12.8.*", "nvidia-cuda-cccl-cu12==12.8.*"), torch_local="cu128",
                     min_driver="525"),
}
# tf-gpu's CUDA line is TensorFlow's own (2.21 is built with CUDA 12.5): no choice, a minimum driver all the same.
TF_CUDA, TF_MIN_DRIVER = "12.5", "525"


def cuda_line(flavor: str, cuda: str | None) -> str | None:
    """The CUDA line an image of this flavor runs: the gpu flavor's chosen one, tf-gpu's TensorFlow's, else none."""
    return (cuda or FLAVOR_DEFAULTS["gpu"]["cuda"]) if flavor == "gpu" else TF_CUDA if flavor == "tf-gpu" else None


def min_driver(line: str) -> str:
    return CUDA_LINES[line].min_driver if line in CUDA_LINES else TF_MIN_DRIVER


def default_torch_index(flavor: str, cuda: str | None) -> str | None:
    """torch's own index for a flavor (and CUDA line) when kit.yaml names none."""
    if cuda in CUDA_LINES:
        return CUDA_LINES[cuda].torch_index_url
    return FLAVOR_DEFAULTS.get(flavor, {}).get("torch_index_url")


# What an image of each framework has, in words for messages.
CONTENTS = {"horovod": "torch and Horovod, no TensorFlow", "tensorflow": "TensorFlow, no torch or Horovod"}


def framework(flavor: str) -> str:
    return FLAVORS[flavor][0]


def uses_gpus(flavor: str) -> bool:
    return FLAVORS[flavor][1]


# The settings that only one framework's image reads.
ONLY_FOR = {"torch": "horovod", "torch_index_url": "horovod", "horovod_version": "horovod",
            "horovod_source": "horovod", "with_mpi": "horovod", "tensorflow": "tensorflow"}
GPU_ONLY = ("cuda", "cuda_archs")  # the gpu flavor's alone: tf-gpu's TensorFlow brings the CUDA it was built with

# An image reference: optional registry host[:port]/, path components, optional :tag, optional @digest.
_IMAGE_REF = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
_REPOSITORY = re.compile(r"^[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*$")
_APT_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9.+:~-]+)?$")
_PYTHON = re.compile(r"^3\.\d{1,2}$")
_VERSION = re.compile(r"^\d+(?:\.\d+){1,2}(?:[a-z]+\d*)?(?:\+[a-z0-9.]+)?$")
_URL = re.compile(r"^(?:https?|file)://[^\s'\"`$;|&<>(){}\\]+$")  # no shell or Jinja characters

# Settings are written into the image (its labels, its history): a credential goes in pip's own configuration.
NO_CREDENTIALS = ("settings end up in the image's labels and history; keep it in pip's configuration "
                  "(pip.conf, ~/.netrc or a keyring), which kit uses on this machine only")

# The fix shown for a bad value of each setting: the expected form, with an example.
HINTS: dict[str, str] = {
    "flavor": "use one of: auto (the default: gpu when every host has NVIDIA GPUs, cpu when none has), cpu, gpu, "
              "tf (tf-gpu or tf-cpu by the same rule), tf-cpu, tf-gpu",
    "image": "use a lower-case repository name without a tag, e.g. kit-horovod or registry:5000/team/kit",
    "base_image": "use an image reference, e.g. debian:bookworm-slim",
    "builder_image": "use an image reference, e.g. nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04",
    "python": "use a Python minor version such as 3.11",
    "torch": "use a torch version such as 2.13.0 (optionally with a local tag: 2.13.0+cpu)",
    "torch_index_url": "use an http(s) or file URL, e.g. https://download.pytorch.org/whl/cpu",
    "pip_index_urls": "use http(s) or file URLs, e.g. https://pypi.org/simple",
    "wheelhouse": "pass a folder that holds .whl files",
    "ca_bundle": "pass a readable PEM file of CA certificates, e.g. /etc/ssl/certs/ca-certificates.crt",
    "horovod_version": "use a Horovod release such as 0.28.1",
    "tensorflow": "use a TensorFlow release such as 2.21.0",
    "horovod_source": "use a pip requirement URL, e.g. git+https://github.com/horovod/horovod@<commit>",
    "pip_packages": "use pip requirement specifiers, e.g. numpy or 'tqdm>=4'",
    "apt_packages": "use Debian package names, e.g. htop or vim=2:9.0.1378-2",
    "with_mpi": "use true or false",
    "cuda": "use one of: 13.0 (default: Turing to Blackwell), 12.8 (Volta to Blackwell)",
    "cuda_archs": "use compute capabilities such as [90, 120] (H100, RTX 50xx), or leave it out for every GPU",
}


class BuildConfig(BaseModel):
    """Every input of the training image. Equal configs render equal images."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flavor: Literal["cpu", "gpu", "tf-cpu", "tf-gpu"] = "cpu"
    image: str = "kit-horovod"
    base_image: str
    builder_image: str | None = None
    python: str
    torch: str | None = None
    torch_index_url: str | None = None
    tensorflow: str | None = None
    pip_index_urls: tuple[str, ...] = ()
    wheelhouse: Path | None = None
    ca_bundle: Path | None = None
    horovod_version: str | None = None
    horovod_source: str | None = None
    pip_packages: tuple[str, ...] = ()
    apt_packages: tuple[str, ...] = ()
    with_mpi: bool = False
    cuda: str | None = None                 # gpu: the CUDA line of torch's build (CUDA_LINES)
    cuda_archs: tuple[str, ...] = ()         # gpu: Horovod's kernels for these only (default: all nvcc knows)

    @model_validator(mode="before")
    @classmethod
    def _apply_flavor_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        defaults = FLAVOR_DEFAULTS.get(data.get("flavor", "cpu"), FLAVOR_DEFAULTS["cpu"])
        merged = {**defaults, **{k: v for k, v in data.items() if v is not None}}
        if "torch_index_url" not in data:  # torch's own index for the flavor and its CUDA line
            merged["torch_index_url"] = default_torch_index(merged.get("flavor", "cpu"), merged.get("cuda"))
        return merged

    @field_validator("image")
    @classmethod
    def _repository(cls, v: str) -> str:
        if not _REPOSITORY.match(v):
            raise ValueError(f"'{v}' is not a repository name (the tag is derived by kit)")
        return v

    @field_validator("base_image", "builder_image")
    @classmethod
    def _image_ref(cls, v: str | None) -> str | None:
        if v is not None and not _IMAGE_REF.match(v):
            raise ValueError(f"'{v}' is not an image reference")
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not _PYTHON.match(v):
            raise ValueError(f"'{v}' is not a Python minor version")
        return v

    @field_validator(*ONLY_FOR, mode="before")
    @classmethod
    def _for_the_flavor(cls, v: Any, info: ValidationInfo) -> Any:
        flavor = info.data.get("flavor")
        if flavor and v and framework(flavor) != ONLY_FOR[info.field_name]:
            raise ValueError(f"does not apply to flavor {flavor} (its image has {CONTENTS[framework(flavor)]})")
        return v

    @field_validator(*GPU_ONLY, mode="before")
    @classmethod
    def _for_gpu(cls, v: Any, info: ValidationInfo) -> Any:
        flavor = info.data.get("flavor")
        if v and flavor and flavor != "gpu":
            raise ValueError(f"does not apply to flavor {flavor} (only the gpu flavor builds with a CUDA line "
                             "of its choice)")
        return v

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, v: str | None) -> str | None:
        if v is not None and str(v) not in CUDA_LINES:
            raise ValueError(f"'{v}' is not a CUDA line kit builds for")
        return str(v) if v is not None else v

    @field_validator("cuda_archs", mode="before")
    @classmethod
    def _cuda_archs(cls, v: Any) -> Any:
        found = tuple(str(a).removeprefix("sm_") for a in (v if isinstance(v, (list, tuple)) else [v]))
        bad = [a for a in found if not re.fullmatch(r"[1-9]\d{1,2}", a)]
        if bad:
            raise ValueError(f"'{bad[0]}' is not a compute capability")
        return found

    @field_validator("torch", "horovod_version", "tensorflow")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None and not _VERSION.match(v):
            raise ValueError(f"'{v}' is not a version")
        return v

    @field_validator("torch_index_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if not v:  # "" turns the separate torch index off: torch then comes from the wheelhouse or pip's index
            return None
        if not _URL.match(v):
            raise ValueError(f"'{v}' is not a URL")
        return v

    @field_validator("pip_index_urls")
    @classmethod
    def _urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for url in v:
            cls._url(url)
        return v

    @field_validator("horovod_source")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        if v is not None and has_credentials(v.removeprefix("git+")):
            raise ValueError(f"'{redact(v)}' holds a user or token: {NO_CREDENTIALS}")
        if v is not None and (not _URL.match(v.removeprefix("git+")) or any(c in v for c in "'\"`$;")):
            raise ValueError(f"'{v}' is not a requirement URL")
        return v

    @field_validator("pip_packages")
    @classmethod
    def _pip_packages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for spec in v:
            try:
                Requirement(spec)
            except InvalidRequirement:
                raise ValueError(f"'{spec}' is not a pip requirement") from None
            if any(c in spec for c in "'\"`$;\\"):
                raise ValueError(f"'{spec}' contains shell characters")
            url = Requirement(spec).url
            if url and has_credentials(url.removeprefix("git+")):
                raise ValueError(f"'{spec.replace(url, redact(url))}' holds a user or token: {NO_CREDENTIALS}")
        return v

    @field_validator("apt_packages")
    @classmethod
    def _apt_packages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not _APT_PACKAGE.match(name):
                raise ValueError(f"'{name}' is not a Debian package name")
        return v

    @field_validator("wheelhouse")
    @classmethod
    def _wheelhouse(cls, v: Path | None) -> Path | None:
        if v is None:
            return v
        if not v.is_dir():
            raise ValueError(f"folder {v} does not exist")
        try:
            wheels = [p for p in v.iterdir() if p.suffix == ".whl"]
        except OSError as e:
            raise ValueError(f"folder {v} cannot be read ({e.strerror})") from None
        if not wheels:
            raise ValueError(f"folder {v} holds no .whl files")
        return v.resolve()

    @field_validator("ca_bundle")
    @classmethod
    def _ca_bundle(cls, v: Path | None) -> Path | None:
        if v is None:
            return v
        try:
            text = v.read_text(errors="replace")
        except OSError as e:
            raise ValueError(f"file {v} cannot be read ({e.strerror})") from None
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise ValueError(f"file {v} holds no PEM certificate")
        return v.resolve()

    @property
    def tag_prefix(self) -> str:
        return f"{self.image}:{self.flavor}"

    @property
    def framework(self) -> str:
        return framework(self.flavor)

    @property
    def gpu(self) -> bool:
        return uses_gpus(self.flavor)


_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_SIZE = re.compile(r"^\d+[kmg]?$")

HINTS.update({
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
    "mounts": "write each as HOST_PATH:CONTAINER_PATH[:ro|:rw] (read-only unless :rw) with absolute paths of letters, "
              "digits and . _ - /, e.g. [/data/imagenet:/data/imagenet]; neither a system folder, kit's folders nor "
              "the workspace",
})
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


# ---------------------------------------------------------------- slurm

_LOGIN = re.compile(r"^(?:[a-z_][a-z0-9_-]{0,31}@)?[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SLURM_TIME = re.compile(r"^(?:\d{1,4}-)?\d{1,5}(?::\d{1,2}){0,2}$")
_SLURM_PATH = re.compile(r"^[A-Za-z0-9_./+-]+$")

HINTS.update({
    "login": "use the login host kit submits from over SSH, as host or user@host (letters, digits, . and -), or "
             "leave it out to submit with the sbatch on this machine's PATH",
    "runtime": "use one of: none (the nodes' own Python, python_path), pyxis (an enroot image, container_image), "
               "apptainer (a .sif, container_image)",
    "partition": "use a partition that `sinfo -s` lists (letters, digits and _ . -)",
    "account": "use an account `sacctmgr show assoc user=$USER` lists (letters, digits and _ . -)",
    "time": 'use a time limit as sbatch reads it, quoted: "30" (minutes), "2:00:00" or "1-12:00:00"',
    "workdir": "use a folder of the login host that every node sees at the same path (letters, digits and "
               "_ . / + -): absolute, or relative to the login user's home, e.g. kit-jobs",
    "python_path": "use the nodes' Python that has torch and the launcher, e.g. /shared/envs/kit/bin/python",
    "container_image": "use the path on shared storage of the image file every node reads: the .sqsh of "
                       "`kit export --to enroot` (pyxis) or the .sif that apptainer build made",
    "subnet": "use the network the ranks talk over, e.g. 10.1.0.0/16, or leave it out for the one that holds "
              "every node's address",
})


class SlurmConfig(BaseModel):
    """Where and how `kit run --on slurm` submits a job: the login host, the partition and account, and how ranks
    get the image's environment on the nodes (runtime)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    login: str | None = None       # the login host, host or user@host, over the user's SSH; none: sbatch on PATH here
    runtime: Literal["none", "pyxis", "apptainer"] = "none"  # none: the nodes' own Python (python_path)
    partition: str | None = None   # default: the cluster's default partition
    account: str | None = None     # default: the user's default account
    time: str | None = None        # the job's time limit as sbatch --time reads it; default: the partition's
    workdir: str = "kit-jobs"      # each job's folder goes here, on the login host and every node (shared storage)
    python_path: str = "python3"   # runtime none: the Python on the nodes with torch and the launcher's package
    container_image: str | None = None  # pyxis: the .sqsh; apptainer: the .sif (on shared storage)
    subnet: str | None = None      # the ranks' network; default: the one that holds every node's address

    @field_validator("login")
    @classmethod
    def _login(cls, v: str | None) -> str | None:
        if v is not None and not _LOGIN.match(v):
            raise ValueError(f"'{v}' is not host or user@host")
        return v

    @field_validator("partition", "account")
    @classmethod
    def _slurm_name(cls, v: str | None) -> str | None:
        if v is not None and not _SLURM_NAME.match(v):
            raise ValueError(f"'{v}' is not a Slurm name")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not _SLURM_TIME.match(str(v)):
            raise ValueError(f"'{v}' is not a time limit")
        return v if v is None else str(v)

    @field_validator("workdir", "python_path", "container_image")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        """An allow-list: the path reaches the sbatch script and the login host's shell."""
        if v is not None and (not _SLURM_PATH.match(v) or ".." in v.split("/") or v.startswith("-")):
            raise ValueError(f"{v!r} is not a path of letters, digits and _ . / + -")
        return v

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            return str(ipaddress.IPv4Network(v, strict=False))  # the ranks talk IPv4
        except ValueError:
            raise ValueError(f"'{v}' is not an IPv4 network such as 10.1.0.0/16") from None

    @model_validator(mode="after")
    def _image(self) -> "SlurmConfig":
        if self.runtime != "none" and not self.container_image:
            raise ValueError(f"runtime {self.runtime} needs container_image (the image file every node reads)")
        return self


# ---------------------------------------------------------------- kit.yaml

SECTIONS = {"build": BuildConfig, "cluster": ClusterConfig, "slurm": SlurmConfig}


@dataclass(frozen=True)
class ConfigFile:
    """kit.yaml as read: each section's values and the line of every key."""

    path: Path | None = None
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    lines: dict[tuple[str, str], int] = field(default_factory=dict)
    written: dict[tuple[str, str], Any] = field(default_factory=dict)  # a YAML number's own text (_written)

    def where(self, section: str, key: str | None = None) -> str:
        line = self.lines.get((section, key or ""), self.lines.get((section, "")))
        return f"{self.path}:{line}" if line else str(self.path)


def read_config(path: Path | None) -> ConfigFile:
    """Read kit.yaml: the given path (which must exist) or ./kit.yaml when present."""
    if path is None:
        if not DEFAULT_CONFIG.is_file():
            return ConfigFile()
        path = DEFAULT_CONFIG
    text = read_input(path, "config file", hint="pass --config with the path of a readable kit.yaml")
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise BadInput(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})",
                       hint="fix the YAML syntax (indent with spaces, `key: value` pairs)") from None
    return _read_sections(path, root)


def _read_sections(path: Path, root: yaml.Node | None) -> ConfigFile:
    cfg = ConfigFile(path=path)
    if root is None:
        return cfg
    if not isinstance(root, yaml.MappingNode):
        raise BadInput(f"{path}:{root.start_mark.line + 1}: the file must be a mapping of sections",
                       hint=f"start with a section name, e.g. `build:`; sections: {', '.join(SECTIONS)}")
    for key_node, value_node in root.value:
        name, line = key_node.value, key_node.start_mark.line + 1
        if name not in SECTIONS:
            raise BadInput(f"{path}:{line}: unknown section '{name}'",
                           hint=f"sections are: {', '.join(SECTIONS)}")
        if not isinstance(value_node, yaml.MappingNode):
            raise BadInput(f"{path}:{line}: section '{name}' must be a mapping of settings",
                           hint=f"indent `key: value` lines under `{name}:`")
        cfg.lines[(name, "")] = line
        for k, v in value_node.value:
            cfg.lines[(name, k.value)] = k.start_mark.line + 1
            if (text := _written(v)) is not None:
                cfg.written[(name, k.value)] = text
        cfg.sections[name] = yaml.safe_load(yaml.serialize(value_node)) or {}
    return cfg


_NOT_TEXT = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool")


def _written(node: yaml.Node) -> str | list[str | None] | None:
    """How a value YAML reads as a number or a boolean was written (`python: 3.10` is the float 3.1 to YAML): the
    scalar's own text; for a list, each item's (None for text). None when the value is text (or no scalar)."""
    if isinstance(node, yaml.ScalarNode):
        return node.value if node.tag in _NOT_TEXT else None
    if isinstance(node, yaml.SequenceNode):
        items = [_written(item) if isinstance(item, yaml.ScalarNode) else None for item in node.value]
        return items if any(item is not None for item in items) else None
    return None


def _types(annotation: Any) -> set:
    """The types a field's values may have: `str | None` -> {str}, Literal["a", "b"] -> {str}, tuple[str, ...] ->
    {str}."""
    if get_origin(annotation) is Literal:
        return {type(arg) for arg in get_args(annotation)}
    if get_origin(annotation) in (Union, UnionType, tuple, list):
        return set().union(*(_types(arg) for arg in get_args(annotation) if arg is not Ellipsis))
    return set() if annotation is type(None) else {annotation}


def wants_text(model: type[BaseModel], key: str) -> bool:
    """Whether a setting is text (a version, a size, a name): then a YAML number there means what it was written as."""
    found = model.model_fields.get(key)
    kinds = _types(found.annotation) if found is not None else set()
    return bool(kinds) and kinds <= {str, Path}


_PLAIN_NUMBER = re.compile(r"\d+(?:\.\d+)*")  # 3.10, 12.8, 8: as written, there is only one way to read it


def as_written(value: Any, written: str | list | None, where: str, key: str) -> Any:
    """A text setting given as a YAML number or boolean: its text as the user wrote it (3.10, not 3.1), or, where
    that text reads otherwise to YAML (1e3, 0x1f, 1_000, 1:30, yes), refused with the quoted form to write."""
    if isinstance(written, list) and isinstance(value, list):
        return [as_written(v, w, where, key) for v, w in zip(value, written)]
    if not isinstance(written, str):
        return value
    if _PLAIN_NUMBER.fullmatch(written):
        return written
    what = f"the boolean {str(value).lower()}" if isinstance(value, bool) else f"the number {value!r}"
    raise BadInput(f"{where}: {written} reads as {what} in YAML, not as the text {written}",
                   hint=f'quote it if you mean the text: write {key}: "{written}"')


# ---------------------------------------------------------------- merging

PATH_FIELDS = {"wheelhouse", "ca_bundle"}


# Settings whose flag is not their name with dashes (a flag given once a value: --pip tqdm --pip six).
FLAGS = {"pip_packages": "--pip", "apt_packages": "--apt", "pip_index_urls": "--index-url", "cuda_archs": "--cuda-arch"}


def flag_name(field_name: str) -> str:
    return FLAGS.get(field_name, "--" + field_name.replace("_", "-"))


def build_config(cfg: ConfigFile, flags: dict[str, Any]) -> BuildConfig:
    """Merge kit.yaml's build section with flags (flags win) and validate."""
    return section_config(cfg, "build", flags)


def requested_flavor(cfg: ConfigFile, flag: str | None = None) -> tuple[str, str]:
    """build.flavor as asked (--flavor, else kit.yaml, else auto) and where it was asked: a flavor, or one of
    AUTO_FLAVORS that the caller decides from the hosts' GPUs before build_config."""
    if flag is not None:
        value, where = flag, "--flavor"
    elif "flavor" in cfg.sections.get("build", {}):
        value, where = cfg.sections["build"]["flavor"], f"{cfg.where('build', 'flavor')}: build.flavor"
    else:
        return "auto", "build.flavor (default auto)"
    if value not in FLAVORS and value not in AUTO_FLAVORS:
        raise BadInput(f"{where}: {value!r} is not allowed", hint=HINTS["flavor"])
    return value, where


def cluster_config(cfg: ConfigFile, flags: dict[str, Any]) -> ClusterConfig:
    return section_config(cfg, "cluster", flags)


def section_config(cfg: ConfigFile, section: str, flags: dict[str, Any]):
    model = SECTIONS[section]
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in cfg.sections.get(section, {}).items():
        where = f"{cfg.where(section, key)}: {section}.{key}"
        if (section, key) in cfg.written and wants_text(model, key):
            value = as_written(value, cfg.written[(section, key)], where, key)
        if key in PATH_FIELDS and isinstance(value, str):
            value = (cfg.path.parent / value).expanduser()  # relative to kit.yaml, like compose files
        values[key], origin[key] = value, where
    for key, value in flags.items():
        if value is not None and value != ():
            values[key], origin[key] = value, flag_name(key)
    try:
        return model(**values)
    except ValidationError as e:
        raise _bad_input(e, origin, cfg, section) from None


def _bad_input(e: ValidationError, origin: dict[str, str], cfg: ConfigFile, section: str) -> BadInput:
    err = e.errors()[0]
    key = str(err["loc"][0]) if err["loc"] else ""
    where = origin.get(key) or (f"{cfg.where(section)}: {section}" if cfg.path else f"{section} settings")
    msg = err["msg"].removeprefix("Value error, ")
    hint = HINTS.get(key, f"see the README for the settings of {section}")
    if msg.startswith("does not apply to flavor"):
        hint = f"remove {key}, or use " + ("flavor gpu" if key in GPU_ONLY else "a flavor whose image has it")
    if NO_CREDENTIALS in msg:
        msg, hint = msg.replace(f": {NO_CREDENTIALS}", ""), f"remove it from the URL: {NO_CREDENTIALS}"
    if err["type"] == "extra_forbidden":
        msg, hint = "unknown setting", f"settings of {section} are: {', '.join(SECTIONS[section].model_fields)}"
    elif err["type"] == "literal_error":
        msg = f"'{err['input']}' is not allowed"
    elif err["type"] == "tuple_type":
        msg = f"should be a list, e.g. [{err.get('input')}] (got {err.get('input')!r})"
    elif err["type"] in ("string_type", "bool_parsing", "bool_type", "int_parsing", "int_type", "missing"):
        msg = f"{msg.lower()} (got {err.get('input')!r})"
    return BadInput(redact_text(f"{where}: {msg}"), hint=hint)
