"""cli/kit's shape: modules a reader holds at once, and layers that only import downwards.

Read from the source's syntax trees, every import counted (those inside functions too: an import deferred to
break a circle is still a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import REPO

PACKAGE = REPO / "cli" / "kit"
MAX_LINES = 450


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "kit":
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "kit")
    return {m for m in found if m in MODULES and m != "kit"}


GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def _circles() -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while (w := stack.pop()) != v:
                part.append(w)
            if part:
                circles.append(sorted([v, *part]))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return circles


def test_no_module_passes_the_line_limit():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_import_circle():
    assert _circles() == []


def _importers(prefix: str) -> set[str]:
    return {m for m, targets in GRAPH.items() if not m.startswith(prefix) and any(t.startswith(prefix) for t in targets)}


def test_only_the_entry_points_import_the_commands():
    assert _importers("kit.cli") <= {"kit.app", "kit.main"}


@pytest.mark.parametrize("low, allowed", [
    ("kit.runners", {"kit.errors", "kit.config.hosts"}),   # how a host is reached knows nothing of what is run there
    ("kit.jobs.commands", None),                             # argv builders: never a step, a runner or the CLI
])
def test_a_low_layer_imports_nothing_above_it(low, allowed):
    used = {t for m, targets in GRAPH.items() if m.startswith(low) for t in targets if not t.startswith(low)}
    above = {t for t in used if t.startswith(("kit.cli", "kit.cluster.steps", "kit.runners"))} if allowed is None \
        else used - allowed
    assert above == set()


def test_steps_import_no_workflow_built_on_steps():
    """A workflow (kit.cluster.lifecycle, kit.backends.cluster.run, kit.doctor.check, ...) runs steps; a step importing one turns the layers over."""
    workflows = {m for m in _importers("kit.cluster.steps") if not m.startswith("kit.cli")} - {"kit.app", "kit.main"}
    used = {t for m, targets in GRAPH.items() if m.startswith("kit.cluster.steps") for t in targets}
    assert used & workflows == set()


def test_the_graph_sees_the_package():
    assert {"kit.config.settings", "kit.backends.cluster.run", "kit.runners.ssh", "kit.cli.common"} <= set(MODULES)
    assert "kit.errors" in GRAPH["kit.runners.ssh"]


def test_few_modules_are_loose_at_the_top_and_each_package_says_what_it_owns():
    """cli/kit/ in packages by concern (config, image, cluster, data, jobs, backends, doctor, bench, ...): the top
    holds the entry points and what every package uses; each package's docstring says what it owns."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= 15, loose
    silent = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py")
              if not ast.get_docstring(ast.parse(p.read_text()))]
    assert silent == []
