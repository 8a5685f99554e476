"""The same CIFAR-10 job through `kit run` on the SSH cluster and through `kit run --on slurm` on the lab's Slurm:
images/s side by side, and the time from `kit run` to the job's first training step.

    .venv/bin/python bench/slurm.py [--repeat 2] [--epochs 2] [--samples 3072]

Makes its own lab of three hosts (tests/lab/harness.py), brings kit's cluster up on it, makes the same hosts a
Slurm cluster with `kit prepare --slurm` (tests/lab/slurmlab.py: runtime none, the nodes' Python a copy of kit's
image's venv), runs the job on each in turns, and removes everything. The first step is the first optimizer step
of rank 0, stamped by a hook the job's folder adds around the example (the example itself is unchanged). The lab's
hosts share this machine's cores: images/s is the machine's CPU floor, not a network's, on both.
Prints figures; never passes or fails on them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "lab")]
from harness import bench_cluster  # noqa: E402
from slurmlab import lab_users, node_pythons, slurm_cluster, user_project  # noqa: E402

CIFAR = REPO / "examples" / "cifar10_cnn_horovod.py"
# Runs the example with a hook that prints when rank 0's first optimizer step is done (wall clock, this machine's).
FIRST_STEP = """\
import os, runpy, sys, time
from torch.optim.optimizer import register_optimizer_step_post_hook
def first(optimizer, args, kwargs, done=[]):
    if not done and os.environ.get("HOROVOD_RANK", "0") == "0":
        done.append(1)
        print("first step at %.3f" % time.time(), flush=True)
register_optimizer_step_post_hook(first)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def job_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(CIFAR, folder / CIFAR.name)
    (folder / "first_step.py").write_text(FIRST_STEP)
    return folder


def timed(argv: list[str], cwd: Path, env: dict) -> tuple[float, float, str]:
    """(images/s of the last epoch, seconds from the start of kit run to rank 0's first step, output)."""
    started = time.time()
    r = subprocess.run([sys.executable, "-m", "kit", *argv], cwd=cwd, capture_output=True, text=True, timeout=1800,
                       env={**env, "COLUMNS": "200"})
    if r.returncode != 0:
        raise RuntimeError(f"kit {' '.join(argv)} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    rate = float(re.findall(r"images/sec ([\d.]+)", r.stdout)[-1])
    first = float(re.search(r"first step at ([\d.]+)", r.stdout)[1])
    return rate, first - started, r.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=3072)
    args = parser.parse_args()
    job = [CIFAR.name, "--epochs", str(args.epochs), "--samples", str(args.samples)]
    results = {"kit run (SSH cluster, -np 3)": [], "kit run --on slurm (--nodes 3)": []}
    with bench_cluster() as (lab, project):
        work = project.parent
        with slurm_cluster(lab, work / "slurm", check=False) as slurm, \
                node_pythons(project, work / "tf", tf=False) as pythons, lab_users(("kitlab-bench",)) as users:
            on_slurm = job_folder(user_project(slurm, work / "on-slurm", users[0], pythons["horovod"]))
            here = job_folder(work / "on-cluster")
            env = {**os.environ, **lab.env}
            for _ in range(args.repeat):  # in turns: what else the machine does weighs on both alike
                results["kit run (SSH cluster, -np 3)"].append(
                    timed(["run", "-c", str(project / "kit.yaml"), "-np", "3", "--workdir", str(here),
                           str(here / "first_step.py"), *job], here, env)[:2])
                *figures, shown = timed(["run", "--on", "slurm", "--nodes", "3", "first_step.py", *job], on_slurm, env)
                results["kit run --on slurm (--nodes 3)"].append(tuple(figures))
    print("$ kit run --on slurm --nodes 3 first_step.py " + " ".join(job) + "   # the last run's output")
    print(shown)
    print(f"CIFAR-10 example, {args.epochs} epochs of {args.samples} generated images, 3 ranks on the lab's 3 hosts, "
          f"{args.repeat} runs each, in turns")
    print(f"{'':<34}{'images/s':>10}{'to 1st step (s)':>17}  each run (images/s, s)")
    for name, runs in results.items():
        print(f"{name:<34}{statistics.median(r for r, _ in runs):>10.1f}{statistics.median(s for _, s in runs):>17.2f}"
              f"  {'  '.join(f'{r:.0f}, {s:.2f}' for r, s in runs)}")
    print("(the lab's hosts share this machine's 2 cores: images/s is its CPU floor on both, not the network's)")


if __name__ == "__main__":
    main()
