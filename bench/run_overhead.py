"""`kit run` on the lab: launch overhead against a direct horovodrun, and the CIFAR-10
example's images/sec for --np 1 and --np 3.

    .venv/bin/python bench/run_overhead.py [--repeat 3] [--rate 1gbit]

Makes its own lab of three hosts (tests/lab/harness.py), brings the cluster up,
measures, and removes everything. Prints figures and ratios; never passes or
fails on them.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "lab")]
from harness import Lab, bench_cluster, timed_kit  # noqa: E402

NOOP = REPO / "tests" / "lab" / "jobs" / "noop.py"
CIFAR = REPO / "examples" / "cifar10_cnn_horovod.py"


def direct(lab: Lab, argv: list[str]) -> float:
    """The same horovodrun, typed by hand in the primary's container."""
    started = time.monotonic()
    lab.hosts[0].docker("exec", "-w", "/var/lib/kit/bench/workspace", "kit-bench", *argv)
    return time.monotonic() - started


def images_per_sec(output: str) -> float:
    return float(re.findall(r"images/sec ([\d.]+)", output)[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", help="rate of every host's link (tc tbf), e.g. 1gbit")
    args = parser.parse_args()
    with bench_cluster(args.rate) as (lab, project):
        timed_kit(lab, project, "run", str(NOOP), "--np", "3")  # copies the script once, like a user's second run
        hosts = ",".join(f"{h.address}:1" for h in lab.hosts)
        by_hand = ["horovodrun", "--gloo", "-np", "3", "-H", hosts, "-p", "12345", "--network-interface", "eth0",
                   "python", "-u", "noop.py"]
        kit_s = [timed_kit(lab, project, "run", str(NOOP), "--np", "3")[0] for _ in range(args.repeat)]
        direct_s = [direct(lab, by_hand) for _ in range(args.repeat)]
        rates = {}
        for np in (1, 3):
            _, out = timed_kit(lab, project, "run", str(CIFAR), "--np", str(np), "--", "--epochs", "2", "--samples", "3072")
            rates[np] = images_per_sec(out)
    k, d = statistics.median(kit_s), statistics.median(direct_s)
    print(f"kit run on the lab ({args.rate or 'unshaped veth'}), median of {args.repeat}")
    print(f"{'':<44}{'value':>9}  ratio")
    print(f"{'no-op job, kit run (s)':<44}{k:>9.2f}  {k / d:.2f}  (kit / by hand)")
    print(f"{'no-op job, horovodrun in the primary (s)':<44}{d:>9.2f}  1.00")
    print(f"{'CIFAR-10 example, --np 1 (images/sec)':<44}{rates[1]:>9.1f}  1.00")
    print(f"{'CIFAR-10 example, --np 3 (images/sec)':<44}{rates[3]:>9.1f}  {rates[3] / rates[1]:.2f}  "
          "(3 ranks / 1; the lab's hosts share this machine's cores)")


if __name__ == "__main__":
    main()
