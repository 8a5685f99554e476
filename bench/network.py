"""The training network on a lab of three hosts with two networks: the hosts.txt network shaped to --slow (100
Mbit/s) and a fabric shaped to --fast (1 Gbit/s) that the workstation is not on, plus a docker0 with the same address
on every host. `kit bench allreduce` at 64 MiB over the network kit chose by itself (no setting), then over the
hosts.txt network (cluster.network: ssh, kit's choice before it measured): busbw / link side by side, each against
the fabric's rate.

    .venv/bin/python bench/network.py [--slow 100mbit] [--fast 1gbit] [--repeat 3]

Makes its own lab (tests/lab/harness.py), prints what `kit up` says of the training network, then each setting's
busbw at 64 MiB over --repeat runs, and removes everything. The lab's hosts share this machine's two cores: at 1
Gbit/s Gloo's allreduce is not CPU-bound there (busbw / link reaches 1.0, see docs/health.md); the cores busy during
each figure (its CPU floor) are printed beside it. Prints figures; never passes or fails on them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "lab")]
from harness import Lab, make_project, timed_kit  # noqa: E402

RATES = {"k": 1e-6, "m": 1e-3, "g": 1.0}


def gbits(rate: str) -> float:
    m = re.fullmatch(r"(\d+)([kmg])bit", rate)
    return int(m[1]) * RATES[m[2]]


def busy() -> tuple[int, int]:
    """(busy, all) jiffies of this machine's CPUs since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)  # less idle and iowait


def allreduce(lab, project, repeat: int) -> dict[str, list[tuple[float, float]]]:
    """backend -> [(busbw Gbit/s, the machine's cores busy during the run: its CPU floor)] at 64 MiB."""
    found: dict[str, list[tuple[float, float]]] = {}
    cores = os.cpu_count() or 1
    for _ in range(repeat):
        before = busy()
        _, out = timed_kit(lab, project, "bench", "allreduce", "--min-size", "64M", "--max-size", "64M", "--seconds",
                           "3", "--link-gbits", "1", "--json")
        after = busy()
        share = (after[0] - before[0]) / max(after[1] - before[1], 1) * cores
        for r in json.loads(out)["results"]:
            found.setdefault(r["backend"], []).append((r["busbw_gbits"], share))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", default="100mbit", help="the hosts.txt network's links (tc tbf)")
    parser.add_argument("--fast", default="1gbit", help="the fabric's links (tc tbf)")
    parser.add_argument("--repeat", type=int, default=3, help="runs at 64 MiB of each setting")
    args = parser.parse_args()
    fabric = gbits(args.fast)
    results = {}
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as work, Lab(3, Path(work)) as lab:
        project = make_project(Path(work) / "project", lab, "bench")
        lab.fabric()
        lab.shape(args.slow)
        lab.shape_fabric(args.fast)
        try:
            seconds, said = timed_kit(lab, project, "up", "--hosts", "hosts.txt")
            print(f"$ kit up --hosts hosts.txt   # {seconds:.0f} s; hosts.txt network {args.slow}, fabric {args.fast}")
            print("\n".join(line for line in said.splitlines() if "training network" in line or "misses" in line))
            results["chosen by kit (no setting)"] = allreduce(lab, project, args.repeat)
            config = project / "kit.yaml"
            settings = yaml.safe_load(config.read_text())
            settings["cluster"]["network"] = "ssh"
            config.write_text(yaml.safe_dump(settings))
            _, said = timed_kit(lab, project, "up")
            print("$ kit up   # cluster.network: ssh")
            print("\n".join(line for line in said.splitlines() if "training network" in line))
            results["the hosts.txt network (cluster.network: ssh)"] = allreduce(lab, project, args.repeat)
        finally:
            timed_kit(lab, project, "down")
    print(f"\nallreduce at 64 MiB, 3 ranks on 3 hosts; busbw / the fabric's {fabric:g} Gbit/s; medians of "
          f"{args.repeat} runs; CPU: this machine's cores busy during the run (of {os.cpu_count()}: its floor)")
    print(f"{'network':<46} {'backend':<8} {'busbw Gbit/s':>13} {'/ fabric':>9} {'CPU':>6}")
    for where, by_backend in results.items():
        for backend, runs in by_backend.items():
            busbw = statistics.median(b for b, _ in runs)
            cpu = statistics.median(c for _, c in runs)
            print(f"{where:<46} {backend:<8} {busbw:>13.3f} {busbw / fabric:>9.2f} {cpu:>6.2f}")
    chosen, plain = (results[k] for k in results)
    for backend in chosen:
        ratio = statistics.median(b for b, _ in chosen[backend]) / statistics.median(b for b, _ in plain[backend])
        print(f"{backend}: the chosen network's busbw is {ratio:.1f}x the hosts.txt network's")


if __name__ == "__main__":
    main()
