"""How fast the image reaches 1, 3 and 8 hosts, and how many bytes leave this machine; then what a change of the extra
pip packages sends.

    .venv/bin/python bench/image_distribution.py                     # uplink 200 Mbit/s, hosts 1 Gbit/s
    .venv/bin/python bench/image_distribution.py --unshaped          # the veths as they are: what the shared CPU costs

Makes its own lab of eight hosts (network namespaces with their own sshd and
dockerd; see tests/lab/harness.py) and removes it afterwards. Shaped, this
machine's link into the lab is a token bucket of --uplink (tc tbf on the lab's
bridge) and each host's link one of --host-rate, so the network, not the two
cores the hosts share, should bound the copy. Each `up` starts with no image on
any host. Prints figures and ratios; never passes or fails on them.
"""

from __future__ import annotations

import argparse
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


def sent(output: str) -> dict:
    figures = image_summary(output)
    if figures is None:
        sys.exit(f"no image summary in kit up's output:\n{output[-3000:]}")
    return figures


def cold_up(lab: Lab, project: Path, hosts_file: str) -> tuple[float, dict]:
    lab.forget_images()
    seconds, out = timed_kit(lab, project, "up", "--hosts", hosts_file)
    timed_kit(lab, project, "down")
    return seconds, sent(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uplink", default="200mbit", help="this machine's link into the lab (tc tbf)")
    parser.add_argument("--host-rate", default="1gbit", help="each host's link (tc tbf)")
    parser.add_argument("--unshaped", action="store_true", help="leave every link as the veths make it")
    args = parser.parse_args()
    counts = (1, 3, 8)
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as work, Lab(max(counts), Path(work)) as lab:
        project = make_project(Path(work) / "project", lab, "bench")
        for k in counts:
            lab.hosts_file(project / f"hosts{k}.txt", lab.hosts[:k])
        timed_kit(lab, project, "up", "--hosts", "hosts1.txt")  # warm-up: each layer is compressed once, here
        timed_kit(lab, project, "down")
        if not args.unshaped:
            lab.shape(args.host_rate)
            lab.shape_uplink(args.uplink)
        runs = {k: cold_up(lab, project, f"hosts{k}.txt") for k in counts}

        # The extra packages change: the image's top layers alone are new, and only they travel.
        lab.forget_images()
        timed_kit(lab, project, "up", "--hosts", f"hosts{max(counts)}.txt")
        config = yaml.safe_load((project / "kit.yaml").read_text())
        config["build"] = {**config.get("build", {}), "pip_packages": [EXTRA]}
        (project / "kit.yaml").write_text(yaml.safe_dump(config))
        build = run_kit("build", "--no-verify", cwd=project, timeout=40 * 60)
        if build.returncode:
            sys.exit(f"kit build with {EXTRA} failed:\n{build.stdout[-3000:]}{build.stderr[-3000:]}")
        changed_s, out = timed_kit(lab, project, "up", "--hosts", f"hosts{max(counts)}.txt")
        changed = sent(out)
        tag = re.search(r"loaded image (\S+)", out)[1]
        ids = {h.docker("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip() for h in lab.hosts}
        timed_kit(lab, project, "down")

    link = "unshaped veths" if args.unshaped else f"uplink {args.uplink}, hosts {args.host_rate}"
    one = runs[1]
    compressed = one[1]["stream_mb"]
    print(f"the image to N hosts, none holding it ({link}); image {one[1]['image_gb']:.2f} GB, "
          f"{compressed:,.0f} MB compressed in {one[1]['of']} layers")
    print(f"{'':<10}{'up s':>8}{'ratio':>7}{'image s':>9}{'ratio':>7}{'bytes there s':>15}{'ratio':>7}"
          f"{'MB from here':>14}{'x image':>9}{'MB host to host':>17}")
    for k, (seconds, s) in runs.items():
        print(f"{f'up({k})':<10}{seconds:>8.1f}{seconds / one[0]:>7.2f}{s['seconds']:>9.1f}"
              f"{s['seconds'] / one[1]['seconds']:>7.2f}{s['arrived']:>15.1f}{s['arrived'] / one[1]['arrived']:>7.2f}"
              f"{s['from_here_mb']:>14,.0f}{s['from_here_mb'] / compressed:>9.2f}{s['between_mb']:>17,.0f}")
    print("image s: the image step of up; bytes there s: until every host had every byte of its layers (the rest of "
          "the image step is docker load applying them, on the cores and disk the lab's hosts share)")
    print(f"goal: up(8)/up(1) <= 1.5: {runs[8][0] / one[0]:.2f}; bytes from here for 8 hosts <= 1.1x the compressed "
          f"image: {runs[8][1]['from_here_mb'] / compressed:.2f}x")
    print(f"extra pip package {EXTRA!r} added, up on {max(counts)} hosts holding the old image: "
          f"{changed['layers']} of {changed['of']} layers, {changed['stream_mb']:,.1f} MB compressed sent "
          f"({changed['stream_mb'] / compressed:.1%} of the compressed image, "
          f"{changed['stream_mb'] / (changed['image_gb'] * 1000):.2%} of its {changed['image_gb']:.2f} GB); "
          f"{changed['from_here_mb']:,.1f} MB left this machine; up took {changed_s:.1f} s; "
          f"hosts with the new image ID: {'all' if len(ids) == 1 and '' not in ids else ids}")


if __name__ == "__main__":
    main()
