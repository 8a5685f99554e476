"""Size of kit's multi-stage CPU image next to a single-stage build of the same recipe.

    .venv/bin/python bench/image_size.py [kit build flags]

Without flags it uses the lab's inputs (tests/lab/harness.py: the debootstrapped
base, the CPU torch wheel, this machine's CA). Both images are built with
`kit build` (cached ones are reused) and measured with the Docker engine. Prints
figures and their ratio; never passes or fails on them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import docker

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lab"))
from harness import cpu_build_flags  # noqa: E402

COMPILERS = "for c in cc gcc g++ c++ clang cmake; do command -v $c; done; true"


def build(flags: list[str]) -> str:
    r = subprocess.run([sys.executable, "-m", "kit", "build", *flags, "--no-verify"],
                       capture_output=True, text=True, timeout=60 * 60)
    if r.returncode != 0:
        sys.exit(f"kit build {' '.join(flags)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return re.search(r"(\S+:\S+-[0-9a-f]{12})", r.stdout)[1]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as work:
        flags = sys.argv[1:] or cpu_build_flags(Path(work))
        client = docker.from_env(timeout=600)
        rows = []
        for name, extra in (("multi-stage (kit)", []), ("single-stage", ["--single-stage"])):
            tag = build(flags + extra)
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
