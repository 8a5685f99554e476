"""`kit`'s entry point: the command's own module alone is imported (its start is every command's start, `kit run`'s
included); `kit` with no command, --help, completion and anything else get kit.app, every command."""

from __future__ import annotations

import importlib
import os
import sys

# Each command, by the module of kit.cli that has it (tests/unit/test_cli_names.py checks it against kit.app).
MODULES = {"run": "jobs", "logs": "joblogs", "jobs": "joblist", "stop": "joblist", "attach": "joblogs",
           "stacks": "joblogs",
           "build": "build", "up": "cluster", "prepare": "cluster", "status": "cluster", "down": "cluster",
           "exec": "cluster", "cp": "data", "demo": "demo", "doctor": "doctor", "bench": "bench",
           "export": "export", "push": "push"}


def main() -> None:
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    module = MODULES.get(command) if "_KIT_COMPLETE" not in os.environ else None
    if module is None:
        from kit.app import main as everything
        everything()
        return
    importlib.import_module(f"kit.cli.{module}")
    from kit.cli.common import app
    app(prog_name="kit")
