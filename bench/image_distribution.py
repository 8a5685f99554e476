"""How fast the image reaches 1, 3 and 8 hosts, and how many bytes leave this machine; then what a change of the extra
pip packages sends.

    .venv/bin/python bench/image_distribution.py                     # uplink 200 Mbit/s, hosts 1 Gbit/s
    .venv/bin/python bench/image_distribution.py --unshaped          # the veths as they are: what the shared CPU costs
    .venv/bin/python bench/image_distribution.py --host-cpu 0.2      # each host its own 0.2 of a core, as separate
                                                                     # machines each have their own CPU

Makes its own lab of eight hosts (network namespaces with their own sshd and
dockerd; see tests/lab/harness.py) and removes it afterwards. Shaped, this
machine's link into the lab is a token bucket of --uplink (tc tbf on the lab's
bridge) and each host's link one of --host-rate, so the network, not the two
cores the hosts share, should bound the copy. Each `up` starts with no image on
any host. It reads what each host's Docker engine spends (CPU time) and prints
the least time that many loads take on this machine's shared cores, beside the
figures and ratios; never passes or fails on them. With --host-cpu, every
process of a host (its sshd and dockerd, and what they start) runs under a CPU
quota of its own (a cgroup), so a host has the same CPU whether 1 or 8 run:
the lab then stands for separate machines, which it cannot otherwise on two
cores.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "lab")]
from harness import Lab, image_summary, make_project, timed_kit  # noqa: E402
from helpers import run_kit  # noqa: E402

EXTRA = "tqdm"  # the extra package the second build adds: small, pure Python
COUNTS = (1, 3, 8)  # hosts


def sent(output: str) -> dict:
    figures = image_summary(output)
    if figures is None:
        sys.exit(f"no image summary in kit up's output:\n{output[-3000:]}")
    return figures


def busy_cpu() -> float:
    """CPU seconds this machine's cores have been busy (not idle, not waiting on the disk) since it started."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def cold_up(lab: Lab, project: Path, k: int, host_cpu: float | None) -> tuple[float, dict]:
    """up on the first k hosts, none holding the image, each on `host_cpu` of a core if given; the image summary's
    figures, with what the hosts' Docker engines spent loading it (CPU seconds per host) and what the whole machine
    spent during up."""
    lab.forget_images()
    hosts = lab.hosts[:k]
    engines, machine = [h.engine_cpu() for h in hosts], busy_cpu()
    with lab.cpu_per_host(host_cpu) if host_cpu else contextlib.nullcontext():
        seconds, out = timed_kit(lab, project, "up", "--hosts", f"hosts{k}.txt")
    figures = {**sent(out), "machine_cpu": busy_cpu() - machine,
               "engine_cpu": sum(h.engine_cpu() - e for h, e in zip(hosts, engines)) / k}
    timed_kit(lab, project, "down")
    return seconds, figures


def report(runs: dict[int, tuple[float, dict]], link: str, host_cpu: float | None) -> None:
    """The table of up(N): printed as soon as it is measured, so a failure of the second part keeps it."""
    one = runs[1]
    compressed = one[1]["stream_mb"]
    print(f"the image to N hosts, none holding it ({link}); image {one[1]['image_gb']:.2f} GB, "
          f"{compressed:,.0f} MB compressed in {one[1]['of']} layers")
    cores = os.cpu_count() or 1
    # The k loads alone: on the shared cores, and on each host's own quota, whichever is slower.
    floor = {k: max(k * s["engine_cpu"] / cores, s["engine_cpu"] / host_cpu if host_cpu else 0)
             for k, (_, s) in runs.items()}
    print(f"{'':<10}{'up s':>8}{'ratio':>7}{'image s':>9}{'ratio':>7}{'bytes there s':>15}{'ratio':>7}"
          f"{'MB from here':>14}{'x image':>9}{'MB host to host':>17}{'load CPU s/host':>17}{'CPU floor s':>13}"
          f"{'machine CPU s':>15}")
    for k, (seconds, s) in runs.items():
        print(f"{f'up({k})':<10}{seconds:>8.1f}{seconds / one[0]:>7.2f}{s['seconds']:>9.1f}"
              f"{s['seconds'] / one[1]['seconds']:>7.2f}{s['arrived']:>15.1f}{s['arrived'] / one[1]['arrived']:>7.2f}"
              f"{s['from_here_mb']:>14,.0f}{s['from_here_mb'] / compressed:>9.2f}{s['between_mb']:>17,.0f}"
              f"{s['engine_cpu']:>17.1f}{floor[k]:>13.1f}{s['machine_cpu']:>15.1f}")
    print("image s: the image step of up; bytes there s: until every host had every byte of its layers (the rest of "
          "the image step is docker load applying them, on the cores and disk the lab's hosts share)")
    quota = f", or that / each host's {host_cpu} of a core if more," if host_cpu else ""
    print(f"load CPU s/host: what each host's Docker engine spent on up (docker load: the layers unpacked, hashed and "
          f"written); CPU floor s: hosts x that / this machine's {cores} cores{quota} the least time the loads can "
          f"take here whatever kit does, as every lab host shares these cores (real hosts each have their own); "
          f"machine CPU s: every process on this machine during up, kit's own included")
    most = COUNTS[-1]
    print(f"goal: up({most})/up(1) <= 1.5: {runs[most][0] / one[0]:.2f} (the {most} loads alone need {floor[most]:.0f} s "
          f"here, {floor[most] / one[0]:.2f}x up(1)); bytes from here for {most} hosts <= 1.1x the compressed image: "
          f"{runs[most][1]['from_here_mb'] / compressed:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uplink", default="200mbit", help="this machine's link into the lab (tc tbf)")
    parser.add_argument("--host-rate", default="1gbit", help="each host's link (tc tbf)")
    parser.add_argument("--unshaped", action="store_true", help="leave every link as the veths make it")
    parser.add_argument("--host-cpu", type=float, metavar="CORES",
                        help="each host's own CPU quota while up runs (e.g. 0.2: 8 hosts take 1.6 of the 2 cores)")
    args = parser.parse_args()
    if args.host_cpu is not None and not 0.01 <= args.host_cpu <= (os.cpu_count() or 1):
        parser.error(f"--host-cpu: between 0.01 and this machine's {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as work, Lab(COUNTS[-1], Path(work)) as lab:
        project = make_project(Path(work) / "project", lab, "bench")
        for k in COUNTS:
            lab.hosts_file(project / f"hosts{k}.txt", lab.hosts[:k])
        timed_kit(lab, project, "up", "--hosts", "hosts1.txt")  # warm-up: each layer is compressed once, here
        timed_kit(lab, project, "down")
        if not args.unshaped:
            lab.shape(args.host_rate)
            lab.shape_uplink(args.uplink)
        runs = {k: cold_up(lab, project, k, args.host_cpu) for k in COUNTS}
        link = "unshaped veths" if args.unshaped else f"uplink {args.uplink}, hosts {args.host_rate}"
        report(runs, link + (f", each host {args.host_cpu} of a core" if args.host_cpu else ""), args.host_cpu)

        # The extra packages change: the image's top layers alone are new, and only they travel.
        lab.forget_images()
        timed_kit(lab, project, "up", "--hosts", f"hosts{COUNTS[-1]}.txt")
        config = yaml.safe_load((project / "kit.yaml").read_text())
        config["build"] = {**config.get("build", {}), "pip_packages": [EXTRA]}
        (project / "kit.yaml").write_text(yaml.safe_dump(config))
        build = run_kit("build", "--no-verify", cwd=project, timeout=40 * 60)
        if build.returncode:
            sys.exit(f"kit build with {EXTRA} failed:\n{build.stdout[-3000:]}{build.stderr[-3000:]}")
        changed_s, out = timed_kit(lab, project, "up", "--hosts", f"hosts{COUNTS[-1]}.txt")
        changed = sent(out)
        tag = re.search(r"loaded image (\S+)", out)[1]
        ids = {h.docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip() for h in lab.hosts}
        timed_kit(lab, project, "down")

    print(f"extra pip package {EXTRA!r} added, up on {COUNTS[-1]} hosts holding the old image: "
          f"{changed['layers']} of {changed['of']} layers, {changed['stream_mb']:,.1f} MB compressed sent "
          f"({changed['stream_mb'] / runs[1][1]['stream_mb']:.1%} of the compressed image, "
          f"{changed['stream_mb'] / (changed['image_gb'] * 1000):.2%} of its {changed['image_gb']:.2f} GB); "
          f"{changed['from_here_mb']:,.1f} MB left this machine; up took {changed_s:.1f} s; "
          f"hosts with the new image ID: {'all' if len(ids) == 1 and '' not in ids else ids}")


if __name__ == "__main__":
    main()
