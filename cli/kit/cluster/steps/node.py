from __future__ import annotations

from dataclasses import dataclass, field

from kit.config.hosts import Host
from kit.cluster.place import Place
from kit.runners import Runner
from kit.cluster.steps.facts import HostFacts


@dataclass
class Node:
    """One host during a workflow: how to reach it, what it looks like, what was done."""

    host: Host
    runner: Runner
    place: Place                # where its container lives
    address: str = ""           # the container's address: the host's, or its own on a private network
    facts: HostFacts | None = None
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # worth telling the user, but not a change

    @property
    def name(self) -> str:
        return self.host.name
