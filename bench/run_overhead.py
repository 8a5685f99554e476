"""`kit run` on the lab: what kit adds to a job that does nothing, against the same launcher typed by hand in the
containers, for horovodrun and torchrun; and the CIFAR-10 example's images/sec for --np 1 and --np 3.

    .venv/bin/python bench/run_overhead.py [--repeat 3] [--rate 1gbit]

Makes its own lab of three hosts (tests/lab/harness.py), brings the cluster up, measures, and removes everything.
Prints figures and ratios; never passes or fails on them. The lab's three hosts share this machine's cores: kit's
own work and the launchers' compete for them, as they would not on three servers.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "lab")]
from harness import Lab, bench_cluster, timed_kit  # noqa: E402

JOBS = REPO / "tests" / "lab" / "jobs"
CIFAR = REPO / "examples" / "cifar10_cnn_horovod.py"
WORKSPACE = "/var/lib/kit/bench/workspace"


def without_kits_connections(lab: Lab) -> None:
    """Close the SSH connections kit's job supervisor keeps open in the containers (for ten minutes after a job):
    by hand, without kit, there are none to ride."""
    for h in lab.hosts:
        h.docker("exec", "kit-bench", "sh", "-c", "pkill -f '[C]ontrolMaster=auto'; true")


def by_hand_horovod(lab: Lab) -> float:
    """horovodrun typed in the primary's container, as people do it without kit."""
    without_kits_connections(lab)
    hosts = ",".join(f"{h.address}:1" for h in lab.hosts)
    started = time.monotonic()
    lab.hosts[0].docker("exec", "-w", WORKSPACE, "kit-bench", "horovodrun", "--gloo", "-np", "3", "-H", hosts,
                        "-p", "12345", "--network-interface", "eth0", "python", "-u", "noop.py")
    return time.monotonic() - started


def by_hand_torchrun(lab: Lab, port: int) -> float:
    """torchrun typed in every host's container at once (a static rendezvous on the primary), until the last ends."""
    without_kits_connections(lab)
    def node(i: int) -> None:
        lab.hosts[i].docker("exec", "-w", WORKSPACE, "-e", "GLOO_SOCKET_IFNAME=eth0", "kit-bench", "torchrun",
                            "--nnodes=3", "--nproc-per-node=1", f"--node-rank={i}",
                            f"--master-addr={lab.hosts[0].address}", f"--master-port={port}", "noop_ddp.py")
    started = time.monotonic()
    nodes = [threading.Thread(target=node, args=(i,)) for i in range(len(lab.hosts))]
    for t in nodes:
        t.start()
    for t in nodes:
        t.join()
    return time.monotonic() - started


def images_per_sec(output: str) -> float:
    return float(re.findall(r"images/sec ([\d.]+)", output)[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", help="rate of every host's link (tc tbf), e.g. 1gbit")
    args = parser.parse_args()
    rows = []
    with bench_cluster(args.rate) as (lab, project):
        for launcher, script, by_hand in (("horovod", "noop.py", by_hand_horovod),
                                          ("torchrun", "noop_ddp.py", by_hand_torchrun)):
            run = ["run", "--launcher", launcher, str(JOBS / script)]
            timed_kit(lab, project, *run)  # copies the script once, as a user's first run does
            kit_s, hand_s = [], []
            for i in range(args.repeat):  # in turns: what else the machine does weighs on both alike
                kit_s.append(timed_kit(lab, project, *run)[0])
                hand_s.append(by_hand(lab) if launcher == "horovod" else by_hand(lab, 29600 + i))
            rows.append((launcher, statistics.median(kit_s), statistics.median(hand_s), kit_s, hand_s))
        rates = {}
        for np in (1, 3):
            _, out = timed_kit(lab, project, "run", "-np", str(np), str(CIFAR), "--epochs", "2", "--samples", "3072")
            rates[np] = images_per_sec(out)
    print(f"kit run on the lab ({args.rate or 'unshaped veth'}), a no-op job on 3 hosts, median of {args.repeat}")
    print(f"{'':<34}{'kit run':>9}{'by hand':>9}{'kit adds':>10}  each run (kit | by hand)")
    for launcher, k, d, kit_s, hand_s in rows:
        print(f"{'no-op job, ' + launcher + ' (s)':<34}{k:>9.2f}{d:>9.2f}{k - d:>+10.2f}  "
              f"{' '.join(f'{x:.2f}' for x in kit_s)} | {' '.join(f'{x:.2f}' for x in hand_s)}")
    print(f"{'CIFAR-10 example, -np 1 (images/sec)':<34}{rates[1]:>9.1f}")
    print(f"{'CIFAR-10 example, -np 3 (images/sec)':<34}{rates[3]:>9.1f}  {rates[3] / rates[1]:.2f} x -np 1 "
          "(the lab's hosts share this machine's cores)")


if __name__ == "__main__":
    main()
