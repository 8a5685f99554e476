"""The flavors kit builds images of, and the CUDA lines of the gpu flavor: what each image has, its defaults.

Pure data and small lookups, read by the build model (kit.config.build), the GPU checks and the verification.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

# build.flavor's other values (auto is the default): decided from the hosts' NVIDIA GPUs (kit.image.gpus.decide), the
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
