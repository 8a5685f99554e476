"""The supervisor's script: the modules of kit.backends.cluster.supervisor as one standard-library-only Python source, which kit sends
to the primary's container and runs there (`python -I -c SOURCE PLAN`, `python -I -c SOURCE --start`)."""

from __future__ import annotations

import inspect
import re
from types import ModuleType

from kit.backends.cluster.supervisor import heartbeats, launch, starter, supervise
from kit.jobs import pace

# The modules of the script, in the order they are shipped: each uses names of the ones before it only.
MODULES = (launch, heartbeats, pace, starter, supervise)
# The mark of a module's import of another of them: dropped from the script, where that module's names are defined
# already. An import of kit without it fails the build of the script.
TOGETHER = "# shipped together"
FUTURE = "from __future__ import annotations"
_KIT_IMPORT = re.compile(r"\s*(from\s+kit[\s.]|import\s+kit\b)")


def source(modules: tuple[ModuleType, ...] = MODULES) -> str:
    """The modules' sources one after the other, under one `from __future__ import annotations` at the very top (it
    must come first), each without its own and without its marked imports of the others."""
    parts = [FUTURE + "\n"]
    for module in modules:
        kept = []
        for number, line in enumerate(inspect.getsource(module).splitlines(), 1):
            if line.strip() == FUTURE or (line.rstrip().endswith(TOGETHER) and _KIT_IMPORT.match(line)):
                continue
            if _KIT_IMPORT.match(line) or line.rstrip().endswith(TOGETHER):
                raise ValueError(f"{module.__name__}:{number}: `{line.strip()}` cannot be shipped: the supervisor's "
                                 f"script imports nothing of kit (mark a one-line import of a module shipped before "
                                 f"it with `{TOGETHER}`)")
            kept.append(line)
        parts.append("\n".join(kept) + "\n")
    return "\n\n".join(parts)
