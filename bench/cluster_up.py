"""`kit up` on the lab: 1 host vs 3 hosts (parallel fan-out), a second up (no-op),
and image distribution time beside image size.

    .venv/bin/python bench/cluster_up.py [--rate 1gbit]

Makes its own lab of three hosts (network namespaces with their own sshd and
dockerd; see tests/lab/harness.py) and removes it afterwards. `--rate` shapes
every host's link with a token bucket (tc tbf), like a 1 GbE cluster. Prints figures and ratios;
never passes or fails on them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "lab")]
from harness import Lab, image_summary, make_project, timed_kit  # noqa: E402


def copied(output: str) -> tuple[float, float, float]:
    """(seconds, image GB, compressed MB) from kit up's image summary."""
    figures = image_summary(output)
    return figures["seconds"], figures["image_gb"], figures["stream_mb"]


def fresh(lab: Lab, project: Path) -> None:
    """Down, and the image gone from every host, so the next up is a cold one."""
    timed_kit(lab, project, "down")
    lab.forget_images()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", help="rate of every host's link (tc tbf), e.g. 1gbit")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as work, Lab(3, Path(work)) as lab:
        project = make_project(Path(work) / "project", lab, "bench")
        lab.hosts_file(project / "one.txt", lab.hosts[:1])
        lab.hosts_file(project / "three.txt")
        if args.rate:
            lab.shape(args.rate)
        timed_kit(lab, project, "up", "--hosts", "one.txt")  # warm-up: makes the compressed archive once
        fresh(lab, project)

        t1, out1 = timed_kit(lab, project, "up", "--hosts", "one.txt")
        fresh(lab, project)
        t3, out3 = timed_kit(lab, project, "up", "--hosts", "three.txt")
        t_again, out_again = timed_kit(lab, project, "up", "--hosts", "three.txt")
        timed_kit(lab, project, "down")
    assert "no change" in out_again
    d1, gb, mb = copied(out1)
    d3, _, _ = copied(out3)
    link = args.rate or "unshaped veth"
    print(f"kit up on the lab ({link}); image {gb:.2f} GB, {mb:,.0f} MB compressed")
    print(f"{'':<34}{'seconds':>9}  ratio")
    print(f"{'up, 1 host (cold)':<34}{t1:>9.1f}  1.00")
    print(f"{'up, 3 hosts (cold)':<34}{t3:>9.1f}  {t3 / t1:.2f}  (3 hosts / 1 host; 1.00 = perfectly parallel)")
    print(f"{'up, 3 hosts again (no-op)':<34}{t_again:>9.1f}  {t_again / t3:.2f}  (of the cold up)")
    print(f"{'up without the image, 1 host':<34}{t1 - d1:>9.1f}  1.00")
    print(f"{'up without the image, 3 hosts':<34}{t3 - d3:>9.1f}  {(t3 - d3) / (t1 - d1):.2f}  "
          "(connect, preflight, keys, containers, SSH check: in parallel)")
    print(f"{'image to 1 host':<34}{d1:>9.1f}  {mb / d1:,.0f} MB/s compressed")
    print(f"{'image to 3 hosts (a chain)':<34}{d3:>9.1f}  {3 * mb / d3:,.0f} MB/s compressed in all")
    print("note: the lab's hosts share this machine's cores, so three `docker load`s compete for them; on real "
          "hosts each loads on its own CPU. bench/image_distribution.py measures the chain on 8 hosts.")


if __name__ == "__main__":
    main()
