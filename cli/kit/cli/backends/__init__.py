"""Where `kit run` runs a job, and the job commands' way to each: the table of back ends (kit.jobs.model.Backend),
one module each. `kit run`, `kit jobs`, `kit logs`, `kit stop`, `kit attach` and `kit stacks` go through this table
and name no back end; a back end is one module here (and its package in kit.backends) and one line in BACKENDS."""

from __future__ import annotations

from typing import Any

from kit.cli.backends.cluster import Cluster
from kit.cli.backends.k8s import Kubernetes
from kit.cli.backends.slurm import Slurm
from kit.cli.common import Where
from kit.errors import BadInput

BACKENDS = {b.name: b for b in (Cluster(), Slurm(), Kubernetes())}
DEFAULT = "cluster"


def in_turn() -> list:
    """The back ends in the order a job reference is looked up and `kit jobs` lists them: the schedulers' jobs are
    recorded on this machine, by id; the cluster's are read from its primary when used, so the default back end
    comes last: it takes any reference the others do not know, and its table ends the list."""
    return sorted(BACKENDS.values(), key=lambda b: b.name == DEFAULT)


def backend(on: str):
    """The back end --on names."""
    if on not in BACKENDS:
        raise BadInput(f"--on: '{on}' is not where kit runs jobs",
                       hint=f"use {DEFAULT} (the default), " + " or ".join(n for n in BACKENDS if n != DEFAULT))
    return BACKENDS[on]


def completion(option: str) -> tuple[str, ...]:
    """The values of an option of a back end's own, for the shell's completion."""
    return tuple(v for b in BACKENDS.values() for v in getattr(b, "completions", {}).get(option, ()))


def find(ref: str, where: Where) -> tuple[Any, Any]:
    """(the back end whose job `ref` names, its record of it), asked in_turn()."""
    return next((b, found) for b in in_turn() if (found := b.find(ref, where)) is not None)


# The commands a back end may lack that are not `kit COMMAND`: (how a user types it, what it reads)
SAID = {"ranks": ("kit jobs --ranks", "ranks' pace")}


def needs(b, command: str, ref: str) -> None:
    """A command a back end does not have (kit attach, kit stacks, kit jobs --ranks), refused in the same words for
    each."""
    if command not in b.commands:
        has = [n.title for n in BACKENDS.values() if command in n.commands]
        typed, what = SAID.get(command, (f"kit {command}", command))
        raise BadInput(f"{typed}: job {ref} runs on {b.title}, where kit has no {what}",
                       hint=f"{typed} is for jobs on {' and '.join(has)}; `kit logs {ref} -f` follows this "
                            "one's output")
