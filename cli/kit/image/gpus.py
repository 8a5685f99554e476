"""The hosts' NVIDIA GPUs: which flavor they call for (build.flavor auto), and whether their driver runs an image's
CUDA line. The facts come from a few lines of sh (SCRIPT, part of kit's facts script, or run alone by `kit build`);
everything else here is pure.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from kit.errors import BadInput
from kit.image.flavors import AUTO_FLAVORS, CUDA_LINES, min_driver
from kit.hostoutput import MARK, lines, sections

NVIDIA_SMI_TIMEOUT_S = 30  # a driver in a bad state can hang nvidia-smi
PCI_DEVICES = "/sys/bus/pci/devices"


def pci_script(devices: str = PCI_DEVICES) -> str:
    """The PCI class of every NVIDIA function (vendor 0x10de): a GPU is seen here before any driver answers."""
    return (f"for d in {shlex.quote(devices)}/*; do [ \"$(cat \"$d/vendor\" 2>/dev/null)\" = 0x10de ] && "
            "cat \"$d/class\" 2>/dev/null; done")


# Each in a `@@kit NAME` section: nvidia-smi's GPUs, the driver of each, and the NVIDIA GPUs on the PCI bus.
SCRIPT = [
    f"echo '{MARK}gpus'; timeout {NVIDIA_SMI_TIMEOUT_S} nvidia-smi -L 2>/dev/null",
    f"echo '{MARK}drivers'; timeout {NVIDIA_SMI_TIMEOUT_S} nvidia-smi --query-gpu=driver_version "
    "--format=csv,noheader 2>/dev/null",
    f"echo '{MARK}pcigpus'; {pci_script()}",
]
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*")  # ASCII digits only (\d takes any script's)


@dataclass(frozen=True)
class Gpus:
    listed: int = 0                 # what nvidia-smi lists (0: none, or no working driver)
    drivers: tuple[str, ...] = ()   # the driver version of each GPU
    pci: int = 0                    # NVIDIA display / 3D controllers on the PCI bus

    @property
    def count(self) -> int:
        return max(self.listed, self.pci)


def parse(sections: dict[str, str]) -> Gpus:
    """SCRIPT's sections -> Gpus. What a failing nvidia-smi prints (on stdout) is neither a GPU nor a version."""
    return Gpus(listed=sum(l.startswith("GPU ") for l in lines(sections.get("gpus", ""))),
                drivers=tuple(l.strip() for l in lines(sections.get("drivers", "")) if _VERSION.fullmatch(l.strip())),
                pci=sum(l.strip().startswith("0x03") for l in lines(sections.get("pcigpus", ""))))


# ---------------------------------------------------------------- build.flavor auto

def decide(requested: str, where: str, gpus: dict[str, int], *, this_machine: bool = False) -> tuple[str, str]:
    """(flavor, why) for auto or tf from each host's NVIDIA GPUs: the GPU flavor when every host has some, the CPU
    one when none has; hosts of both kinds are refused (one image cannot serve both). A flavor is kept as it is."""
    if requested not in AUTO_FLAVORS:
        return requested, f"build.flavor is {requested}"
    cpu, gpu = AUTO_FLAVORS[requested]
    with_gpus = [h for h, n in gpus.items() if n]
    without = [h for h in gpus if not gpus[h]]
    if with_gpus and without:
        raise BadInput(f"{where}: {_hosts(with_gpus)} {_have(with_gpus)} NVIDIA GPUs and {_hosts(without)} "
                       f"{_have(without)} none; one image cannot serve both",
                       hint=f"list only one kind of host in hosts.txt, or set build.flavor: {cpu} in kit.yaml to use "
                            "CPUs everywhere")
    if this_machine:
        n = max(gpus.values(), default=0)
        return (gpu, f"this machine has {n} NVIDIA GPU{'s' if n > 1 else ''}") if n else \
            (cpu, "this machine has no NVIDIA GPU")
    if with_gpus:
        return gpu, "every host has NVIDIA GPUs (" + ", ".join(f"{h}: {n}" for h, n in gpus.items()) + ")"
    return cpu, "no host has an NVIDIA GPU"


def _hosts(names: list[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


def _have(names: list[str]) -> str:
    return "have" if len(names) > 1 else "has"


# ---------------------------------------------------------------- the driver against the image's CUDA line

def version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def fitting_line(driver: str) -> str | None:
    """The newest CUDA line kit builds whose minimum driver this one meets; None when none does."""
    return next((line for line, c in CUDA_LINES.items() if version(driver) >= version(c.min_driver)), None)


def driver_problem(drivers: tuple[str, ...], flavor: str, line: str | None) -> tuple[str, str] | None:
    """(what is wrong, the fix) when a host's NVIDIA driver is older than the image's CUDA line needs; None when it
    runs it (or nothing is known: no GPU driver answered, or the image's line is not known)."""
    if not line or not drivers:
        return None
    need, oldest = min_driver(line), min(drivers, key=version)
    if version(oldest) >= version(need):
        return None
    whose = "TensorFlow's CUDA" if flavor == "tf-gpu" else "the image's CUDA"
    text = f"NVIDIA driver {oldest} is older than {need}, the minimum for {whose} {line}"
    fits = fitting_line(oldest) if flavor == "gpu" else None
    if fits:  # (kit.yaml's line, not a flag: kit up takes the image of kit.yaml's settings, whatever kit build made)
        return (f"{text}; CUDA {fits} runs on it",
                f'build for CUDA {fits}: put `cuda: "{fits}"` in the build section of kit.yaml (a new kit.yaml: '
                f'`build: {{cuda: "{fits}"}}`), which kit build and kit up both read, and run kit up again; or install '
                f"NVIDIA driver {need} or newer on the host")
    oldest_line = min(CUDA_LINES, key=lambda l: version(CUDA_LINES[l].min_driver))
    floor = CUDA_LINES[oldest_line].min_driver
    also = f' ({floor} or newer runs CUDA {oldest_line}: `cuda: "{oldest_line}"` in kit.yaml\'s build section)' \
        if flavor == "gpu" and floor != need else ""
    return (f"{text}; no CUDA line kit builds runs on it: install NVIDIA driver {need} or newer{also}",
            f"install NVIDIA driver {need} or newer on the host (and reboot){also}")


# ---------------------------------------------------------------- reading a machine on its own (kit build)

def probe(runner) -> Gpus:
    """One machine's GPUs, read with SCRIPT alone (changes nothing; no root needed)."""
    return parse(sections(runner.run("\n".join(SCRIPT), timeout=NVIDIA_SMI_TIMEOUT_S * 3).stdout))
