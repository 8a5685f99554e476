"""`kit doctor` and `kit bench net` on a lab of three hosts, every link shaped to --rate and one host's to --slow.

    .venv/bin/python bench/health.py [--rate 1gbit] [--slow 100mbit]

Makes its own lab (network namespaces with their own sshd and dockerd; see tests/lab/harness.py), brings a cluster
up, prints what both commands print, and removes everything. Prints figures; never passes or fails on them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "lab")]
from harness import bench_cluster  # noqa: E402
from helpers import run_kit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit", help="every host's link (tc tbf), e.g. 1gbit")
    parser.add_argument("--slow", default="100mbit", help="the last host's link, e.g. 100mbit ('' for none)")
    args = parser.parse_args()
    with bench_cluster(args.rate) as (lab, project):
        if args.slow:
            lab.shape(args.slow, lab.hosts[-1:])
        for argv in (["doctor"], ["bench", "net"]):
            r = run_kit(*argv, cwd=project, env={**lab.env, "COLUMNS": "120"}, timeout=1800)
            print(f"$ kit {' '.join(argv)}   # links {args.rate}" + (f", {lab.hosts[-1].address} {args.slow}"
                                                                        if args.slow else ""))
            print(r.stdout + r.stderr)


if __name__ == "__main__":
    main()
