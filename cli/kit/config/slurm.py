"""kit.yaml's slurm section: where and how `kit run --on slurm` submits a job (SlurmConfig)."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

_LOGIN = re.compile(r"^(?:[a-z_][a-z0-9_-]{0,31}@)?[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_SLURM_TIME = re.compile(r"^(?:\d{1,4}-)?\d{1,5}(?::\d{1,2}){0,2}$")
_SLURM_PATH = re.compile(r"^[A-Za-z0-9_./+-]+$")
_SLURM_MEMORY = re.compile(r"^[1-9][0-9]{0,8}[KMGT]?$")  # as sbatch --mem reads it: 64G, 500M, 4096 (MB)

# The fix shown for a bad value of each setting (kit.config.settings.HINTS has every section's).
HINTS: dict[str, str] = {
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
    "cpus_per_task": "use a number of CPUs from 1 to 4096 for each task, or leave it out for the node's CPUs shared "
                     "among its tasks (and its GPUs)",
    "mem": "use a memory size for each node as sbatch reads it: 64G, 500M (a number alone is MB)",
    "mem_per_gpu": "use a memory size for each GPU as sbatch reads it: 16G, 500M (a number alone is MB)",
    "subnet": "use the network the ranks talk over, e.g. 10.1.0.0/16, or leave it out for the one that holds "
              "every node's address",
}


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
    cpus_per_task: int | None = None   # default (kit run): each node's CPUs, its share for the job's GPUs, a task
    mem: str | None = None         # each node's memory for the job (sbatch --mem); default: Slurm's
    mem_per_gpu: str | None = None  # or each GPU's (sbatch --mem-per-gpu)

    @field_validator("login")
    @classmethod
    def _login(cls, v: str | None) -> str | None:
        if v is not None and not _LOGIN.fullmatch(v):
            raise ValueError(f"'{v}' is not host or user@host")
        return v

    @field_validator("partition", "account")
    @classmethod
    def _slurm_name(cls, v: str | None) -> str | None:
        if v is not None and not _SLURM_NAME.fullmatch(v):
            raise ValueError(f"'{v}' is not a Slurm name")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not _SLURM_TIME.fullmatch(str(v)):
            raise ValueError(f"'{v}' is not a time limit")
        return v if v is None else str(v)

    @field_validator("workdir", "python_path", "container_image")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        """An allow-list: the path reaches the sbatch script and the login host's shell."""
        if v is not None and (not _SLURM_PATH.fullmatch(v) or ".." in v.split("/") or v.startswith("-")):
            raise ValueError(f"{v!r} is not a path of letters, digits and _ . / + -")
        return v

    @field_validator("cpus_per_task")
    @classmethod
    def _cpus(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= 4096:
            raise ValueError(f"{v} is not from 1 to 4096")
        return v

    @field_validator("mem", "mem_per_gpu")
    @classmethod
    def _memory(cls, v: str | None) -> str | None:
        if v is not None and not _SLURM_MEMORY.fullmatch(str(v)):
            raise ValueError(f"'{v}' is not a memory size such as 64G or 500M")
        return v if v is None else str(v)

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
        if self.mem and self.mem_per_gpu:
            raise ValueError("mem and mem_per_gpu both say the job's memory: give one")
        return self
