"""Size of kit's multi-stage CPU image next to a single-stage build of the same recipe.

    .venv/bin/python bench/image_size.py [kit build flags]

Without flags it builds kit's defaults from what this machine has (as
cli/demo does). Both images are built with `kit build` (cached ones are reused)
and measured with the Docker engine. Prints figures and their ratio; never
passes or fails on them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import docker

COMPILERS = "for c in cc gcc g++ c++ clang cmake; do command -v $c; done; true"


def build(flags: list[str], work: str) -> str:
    r = subprocess.run([sys.executable, "-m", "kit", "build", *flags, "--no-verify"], cwd=work,
                       capture_output=True, text=True, timeout=60 * 60)
    if r.returncode != 0:
        sys.exit(f"kit build {' '.join(flags)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return re.search(r"(\S+:\S+-[0-9a-f]{12})", r.stdout)[1]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as work:  # no kit.yaml there: kit's defaults
        flags = sys.argv[1:]
        client = docker.from_env(timeout=600)
        rows = []
        for name, extra in (("multi-stage (kit)", []), ("single-stage", ["--single-stage"])):
            tag = build(flags + extra, work)
            size = client.images.get(tag).attrs["Size"]
            found = client.containers.run(tag, ["-c", COMPILERS], entrypoint="sh", network_mode="none",
                                          remove=True).decode().split()
            rows.append((name, tag, size, ", ".join(Path(c).name for c in found) or "none"))
    print(f"{'recipe':<20} {'size':>9}  {'compilers in image':<28} tag")
    for name, tag, size, compilers in rows:
        print(f"{name:<20} {size / 1e9:>7.2f} GB  {compilers:<28} {tag}")
    multi, single = rows[0][2], rows[1][2]
    print(f"single-stage / multi-stage size: {single / multi:.2f}x "
          f"({(single - multi) / 1e6:,.0f} MB saved by building Horovod in a separate stage)")


if __name__ == "__main__":
    main()
