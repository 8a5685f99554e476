"""`kit bench allreduce` on a lab of three hosts whose links are shaped to --rate (1 Gbit/s): busbw / link for
Horovod (Gloo) and torch.distributed (Gloo), message sizes from 1 KiB to 256 MiB.

    .venv/bin/python bench/allreduce.py [--rate 1gbit] [--repeat 3] [--horovod-option "--cycle-time-ms 5"]

Makes its own lab (network namespaces with their own sshd and dockerd; see tests/lab/harness.py), brings a cluster
up, prints what `kit bench allreduce` prints (the link is the slowest `kit bench net` measures), then each backend's
busbw / link at 64 MiB over --repeat runs, and removes everything. Prints figures; never passes or fails on them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "lab")]
from harness import bench_cluster, timed_kit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit", help="every host's link (tc tbf), e.g. 1gbit or 10gbit")
    parser.add_argument("--repeat", type=int, default=3, help="runs at 64 MiB after the whole sweep")
    parser.add_argument("--horovod-option", default="", help="Horovod knobs to try, e.g. '--cycle-time-ms 5'")
    args = parser.parse_args()
    knobs = shlex.split(args.horovod_option)
    with bench_cluster(args.rate) as (lab, project):
        _, text = timed_kit(lab, project, "bench", "allreduce", *knobs)
        print(f"$ {shlex.join(['kit', 'bench', 'allreduce', *knobs])}   # 3 hosts, every link {args.rate}\n{text}")
        link = json.loads(timed_kit(lab, project, "bench", "net", "--json")[1])["slowest"][0]["gbits"]
        ratios: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            _, out = timed_kit(lab, project, "bench", "allreduce", "--min-size", "64M", "--max-size", "64M",
                               "--seconds", "4", "--link-gbits", f"{link:.4f}", "--json", *knobs)
            for r in json.loads(out)["results"]:
                label = f"{'Horovod' if r['backend'] == 'horovod' else 'torch.distributed'} ({r['transport']})"
                ratios.setdefault(label, []).append(r["busbw_per_link"])
    print(f"busbw / link at 64 MiB, {args.repeat} runs of about 4 s each (link {link:.3f} Gbit/s)")
    for label, found in ratios.items():
        print(f"  {label:<28} median {statistics.median(found):.2f}  (runs: {', '.join(f'{x:.2f}' for x in found)})")


if __name__ == "__main__":
    main()
