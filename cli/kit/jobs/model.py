"""One job, described once, and what a back end does with it.

A Job is what `kit run` was asked for: the script and its arguments, the launcher, the shape (processes, hosts,
nodes, ranks a node, GPUs), the ranks' variables, the policy when it fails or hangs, and the back end's own options.
A back end (kit's SSH cluster, Slurm, Kubernetes; kit.cli.backends has the table) turns it into its native job and
declares which of kit run's options it takes: one check (refused) refuses the others, in the same words for each.
The model is TorchX's: an AppDef every scheduler translates, each declaring its run options. Pure: no I/O.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol

from kit.errors import BadInput

# kit run's options every back end takes (by the name of kit run's parameter): the job itself, where it is recorded.
COMMON = frozenset({"script", "args", "launcher", "env", "env_file", "detach", "config", "name", "on"})


JOB_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")  # kit's job ids, on every back end: new_job_id()


# How a scheduler's job is placed (Slurm's, Kubernetes'): said where kit run refuses the SSH cluster's -H or -np.
SCHEDULER_PLACEMENT = "--nodes, --np or --ntasks-per-node and --gpus-per-node say where ranks run"


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def parse_duration(text: str, flag: str) -> float:
    """30s, 10m, 2h, 90 (seconds), 0 -> seconds."""
    m = re.fullmatch(r"(\d{1,7})([smh]?)", text.strip())
    if not m:
        raise BadInput(f"{flag}: '{text}' is not a duration", hint=f"give e.g. {flag} 30s, 10m or 2h (0: never)")
    return float(int(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[m[2]])


JOB_FORMS = "a job id, a unique start of one, its last 4 characters (after the last dash), or last (the newest)"


def check_job_ref(text: str) -> str:
    """How a user may name a job (checked before any host is asked): `last`, a whole id, the start of one, or the
    4-hex tail after its last dash, as people read it off the screen."""
    if text != "last" and not re.fullmatch(r"[0-9a-f-]{1,20}", text):
        raise BadInput(f"'{text}' is not a job id", hint=f"give {JOB_FORMS}; `kit jobs` lists them")
    return text


def pick_record(ref: str, found: dict, where: str):
    """The record (of a scheduler's jobs, by kit's id) that `ref` names, None when it names none of them: then it is
    the cluster's to look up. A ref that fits several is refused with them."""
    ids = [i for i in found if JOB_ID.fullmatch(i)]
    if not ids or ref != "last" and ref not in ids and \
            not any(i.startswith(ref) or i.rsplit("-", 1)[-1] == ref for i in ids):
        return None
    return found[resolve_job(ref, ids, where)]


def resolve_job(ref: str, ids: list[str], cluster: str) -> str:
    """The job `ref` names among the cluster's job ids (check_job_ref's forms). Ids start with their time, so the
    newest is the greatest; a start or tail that fits several is refused with them listed."""
    check_job_ref(ref)
    if not ids:
        raise BadInput(f"no jobs on cluster {cluster} yet", hint="`kit run train.py` starts one")
    if ref == "last" or ref in ids:
        return max(ids) if ref == "last" else ref
    found = sorted(i for i in ids if i.startswith(ref) or i.rsplit("-", 1)[-1] == ref)
    if len(found) == 1:
        return found[0]
    if not found:
        raise BadInput(f"no job {ref} on cluster {cluster}", hint=f"give {JOB_FORMS}; `kit jobs` lists them")
    shown = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    tails = all(i.rsplit("-", 1)[-1] == ref for i in found)  # then the last 4 characters are what fits several
    raise BadInput(f"job {ref} is ambiguous on cluster {cluster}: it fits {shown}",
                   hint=f"give more of the id: its start, e.g. {found[-1]}" if tails else
                   "give more of the id, or its last 4 characters")


@dataclass(frozen=True)
class Policy:
    """What the watch does when a job fails or hangs."""

    restarts: int = 0              # start it again after a failure, on the hosts that answer, this many times
    min_np: int | None = None      # ... with at least this many processes (None: all of them)
    hang_timeout: float = 600      # seconds without progress of any rank before it counts as hung (0: never)
    straggler_window: float = 120  # seconds a host must be slower than the others before it is named (0: never)

    def check(self, launcher: str) -> None:
        """--restarts and --min-np as every back end that restarts a job reads them; bad input is refused."""
        if not 0 <= self.restarts <= 100:
            raise BadInput(f"--restarts: {self.restarts} is not from 0 to 100",
                           hint="give how often the job may start again")
        if self.restarts and launcher == "tf":
            raise BadInput("--restarts: kit does not start TF workers again (MultiWorkerMirroredStrategy fixes its "
                           "workers at start)",
                           hint="drop --restarts; a TF job resumes from its checkpoint when run again")
        if self.min_np is not None and (not self.restarts or self.min_np < 1):
            raise BadInput(f"--min-np: {self.min_np} " + ("is below 1" if self.min_np < 1 else
                                                          "is for a job that restarts"),
                           hint="give --restarts N with --min-np M, M from 1 to the job's processes")


@dataclass(frozen=True)
class Job:
    """A job as `kit run` was asked for it, whichever back end runs it. options: the back end's own, by the name of
    kit run's parameter (partition, kind, ...), each it declares, given or not; read with option()."""

    script: Path
    args: tuple[str, ...] = ()
    launcher: str = "horovod"
    np: Optional[int] = None                 # processes (horovod)
    hosts: Optional[str] = None              # -H host:slots,... (the cluster)
    nproc_per_node: Optional[int] = None     # torchrun's processes a host (the cluster)
    nodes: Optional[int] = None              # a scheduler's nodes (pods)
    ntasks_per_node: Optional[int] = None
    gpus_per_node: Optional[int] = None
    workdir: Optional[Path] = None           # the folder copied for the job (default: the script's)
    env: tuple[str, ...] = ()                # -e, as given
    env_files: tuple[Path, ...] = ()         # --env-file: read for the variables, never copied
    detach: bool = False
    policy: Policy = Policy()
    options: Mapping[str, Any] = field(default_factory=dict)
    config: Optional[Path] = None            # kit.yaml, and the cluster's name (--config, --name)
    name: Optional[str] = None

    def option(self, name: str) -> Any:
        """A back end's own option; one it did not declare is not there (KeyError): it would never be given."""
        return self.options[name]


class Backend(Protocol):
    """Where a job runs. `where`: what the command names (kit.cli.common.Where: --config, --name, the cluster as
    recorded here). find() resolves a job reference to the back end's record of it (None: not its job); logs, stop,
    attach and stacks take that record."""

    name: str                 # as --on spells it
    title: str                # as a person reads it: kit's cluster, Slurm, Kubernetes
    options: frozenset[str]   # kit run's parameters it takes (COMMON and its own)
    placement: str            # which of its options place the ranks, for the refusal's fix
    commands: frozenset[str]  # which of attach and stacks it has (methods of those names)

    def run(self, job: Job) -> None: ...
    def find(self, ref: str, where: Any) -> Any: ...
    def logs(self, found: Any, where: Any, rank: Optional[int], follow: bool, tail: Optional[int]) -> None: ...
    def stop(self, found: Any, where: Any) -> str: ...
    def rows(self, where: Any) -> list[dict]: ...
    def show(self, rows: list[dict]) -> None: ...


def refused(backend: Backend, given: Mapping[str, str], others: Mapping[str, Backend]) -> BadInput | None:
    """The one refusal of kit run's options a back end does not take. given: each option given (its parameter's
    name -> the flag as kit run spells it); others: every back end, by name, to say where the option belongs."""
    foreign = [name for name in given if name not in backend.options]
    if not foreign:
        return None
    flags = ", ".join(given[name] for name in foreign)
    takers = [b.name for b in others.values() if b is not backend and all(n in b.options for n in foreign)]
    where = f"add --on {' or --on '.join(takers)}, or drop {'it' if len(foreign) == 1 else 'them'}" if takers else \
        f"drop {'it' if len(foreign) == 1 else 'them'}"
    return BadInput(f"{flags}: not for --on {backend.name} ({backend.title})",
                    hint=f"{where} (on {backend.title}, {backend.placement})")
