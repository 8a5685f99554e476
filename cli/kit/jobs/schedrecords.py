"""kit's notes of the jobs it gave a scheduler (Slurm, Kubernetes): one JSON file a job, <scheduler>/<id>.json in
kit's home, written whole (a new file renamed into place)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Callable, TypeVar

from kit.cluster.identity import state_root

T = TypeVar("T")


def folder(scheduler: str) -> Path:
    return state_root() / scheduler


def save(scheduler: str, record) -> None:
    where = folder(scheduler)
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = where / f"{record.id}.json"
    path.with_suffix(".new").write_text(json.dumps(asdict(record)))
    path.with_suffix(".new").replace(path)


def load(scheduler: str, make: Callable[[dict], T]) -> list[T]:
    """Every note `make` accepts (it raises TypeError or ValueError for one that is not kit's), oldest id first."""
    found = []
    for path in sorted(folder(scheduler).glob("*.json")):
        try:
            found.append(make(json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # not kit's, or half-written: never fatal to listing the others
    return found
