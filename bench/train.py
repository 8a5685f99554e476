"""`kit bench train` on a lab of three hosts whose links are shaped to --rate (1 Gbit/s): the CIFAR-10 example on
1, 2 and 3 hosts, images/s, speedup and scaling efficiency, and the PNG it draws.

    .venv/bin/python bench/train.py [--rate 1gbit] [--png scaling.png]

Makes its own lab (see tests/lab/harness.py), brings a cluster up, prints what `kit bench train --hosts 1,2,3`
prints, copies its plot to --png, and removes everything. The lab's hosts share this machine's cores, so the
scaling it shows is the machine's, not a network's. Prints figures; never passes or fails on them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "lab")]
from harness import bench_cluster, timed_kit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit", help="every host's link (tc tbf), e.g. 1gbit")
    parser.add_argument("--png", type=Path, default=Path("kit-bench-train.png"), help="where the plot is copied")
    args = parser.parse_args()
    with bench_cluster(args.rate) as (lab, project):
        _, text = timed_kit(lab, project, "bench", "train", "--hosts", "1,2,3")
        print(f"$ kit bench train --hosts 1,2,3   # every link {args.rate}\n{text}")
        saved = sorted((lab.home / ".kit" / "bench" / "bench").glob("train-*.json"))[-1]
        shutil.copyfile(json.loads(saved.read_text())["png"], args.png)
    print(f"the plot: {args.png}")


if __name__ == "__main__":
    main()
