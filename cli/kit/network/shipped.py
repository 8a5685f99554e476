"""The network survey's script: kit.network's links, choose, wire and survey as one standard-library-only Python source,
run as `python -I -c SCRIPT ...` in the cluster's containers, and written beside a Slurm job's tasks as
.kit/kit_net.py."""

from __future__ import annotations

from kit.network import choose, links, survey, wire
from kit.backends.cluster.supervisor.shipped import source

MODULES = (links, choose, wire, survey)


def script() -> str:
    return source(MODULES)
