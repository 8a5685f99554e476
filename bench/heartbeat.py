"""What the rank launcher's heartbeat (the hang watch of `kit run`) costs a rank: the same work run by kit's rank
launcher with the heartbeat (as in a job) and without it, side by side.

    .venv/bin/python bench/heartbeat.py [--repeat 5]

Two kinds of work, each in the rank's main thread: Python bytecode (a loop that holds the interpreter), and native
code that lets it go (sha256 of large buffers, as torch's kernels do). Runs here, with this Python; writes the
heartbeats in a temporary folder. Prints figures and ratios; never passes or fails on them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "cli"))
from kit.jobs.commands.horovod import RANK_LAUNCHER  # noqa: E402

WORK = {
    "python bytecode": "x = 0\nfor i in range(20_000_000):\n    x += i * i % 7\n",
    "native (no GIL)": "import hashlib\nb = bytes(64 << 20)\nfor _ in range(12):\n    hashlib.sha256(b).digest()\n",
    # the same bytecode as a training loop marked for kit's pace watch: 200,000 steps of 100 iterations each (steps
    # of microseconds: real ones take milliseconds), each batch from a loader kit_pace.data times
    "python, steps marked": "import kit_pace\nx = 0\nfor batch in kit_pace.data(range(200_000)):\n"
                            "    for i in range(batch * 100, batch * 100 + 100):\n        x += i * i % 7\n"
                            "    kit_pace.step()\n",
}


def once(script: Path, beat: bool, progress: str) -> float:
    env = {**os.environ, "KIT_PROGRESS_DIR": progress}
    env.pop("KIT_JOB", None)
    if beat:
        env.update(KIT_JOB="bench", HOROVOD_RANK="0")
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", RANK_LAUNCHER, str(script)], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'work':<22} {'without heartbeat':>18} {'with heartbeat':>16} {'ratio':>7}")
    medians = {}
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as tmp:
        for name, code in WORK.items():
            script = Path(tmp) / "work.py"
            script.write_text(code)
            without, with_ = [], []
            for _ in range(args.repeat):  # interleaved, so a change of the machine's load hits both alike
                without.append(once(script, False, tmp))
                with_.append(once(script, True, tmp))
            a, b = statistics.median(without), statistics.median(with_)
            medians[name] = a, b
            print(f"{name:<22} {a:>16.2f} s {b:>14.2f} s {b / a:>7.3f}")
    print("(medians of", args.repeat, "runs each; ratio: with / without)")
    (plain, _), (marked, beat) = medians["python bytecode"], medians["python, steps marked"]
    print(f"the same bytecode as 200,000 marked steps: {marked / plain:.3f} of its time unmarked without the "
          f"heartbeat, {beat / plain:.3f} with it (marks and the pace's counters together: an upper bound, at steps "
          "of microseconds)")


if __name__ == "__main__":
    main()
