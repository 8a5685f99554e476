"""What ranks write cannot grow kit on the control machine without limit: a rank that writes 150 MB with no newline
is shown as the head of its line and a count of the rest, kit's memory stays bounded, and kit ends with the job."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import lab_cluster

pytestmark = pytest.mark.lab
LINE_KEPT = 64 << 10  # kit.runners.base.LINE_KEPT, written out: the test also ran against kit before it had one
JOBS = Path(__file__).parent / "jobs"
STREAM_MB = 150
KIT_LIMIT_S = 600
GROWN_CAP = 64 << 20  # what kit may grow by over a small job's run: a line's head, the stream's chunks in flight

# kit as a child of this wrapper, whose children's peak RSS is kit's own (kit starts no process on this machine).
MEASURED = ("import json, resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print(json.dumps({'peak': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10}), "
            "file=sys.stderr); sys.exit(code)")


@pytest.fixture(scope="module")
def cluster(project, lab):
    with lab_cluster(lab, project, "lab", "--hosts", "hosts.txt"):
        yield project


def measured_kit(project: Path, lab, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    """A kit command as the lab's user, and kit's peak resident memory in bytes."""
    argv = [sys.executable, "-c", MEASURED, sys.executable, "-m", "kit", *args]
    with subprocess.Popen(argv, cwd=project, env={**os.environ, "COLUMNS": "200", **lab.env}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=KIT_LIMIT_S)
        except subprocess.TimeoutExpired:  # kit too, not only its wrapper: else it holds the cluster
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"kit {' '.join(args)} did not end within {KIT_LIMIT_S} s")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err), json.loads(err.strip().splitlines()[-1])["peak"]


def test_a_rank_printing_without_newlines_keeps_kit_bounded(project, lab, cluster):
    small, baseline = measured_kit(project, lab, "run", str(JOBS / "endless_line.py"), "--np", "2", "--", "0")
    assert small.returncode == 3, small.stdout[-3000:] + small.stderr[-3000:]
    r, peak = measured_kit(project, lab, "run", str(JOBS / "endless_line.py"), "--np", "2", "--", str(STREAM_MB))
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    assert "rank 1] rank 1 wrote a short line" in r.stdout
    left_out = re.search(r"\[kit: (\d+) more bytes of this line left out\]", r.stdout)
    assert left_out and int(left_out[1]) > (STREAM_MB - 1) << 20, r.stdout[-3000:]
    assert re.search(r"^\[\S+ rank 0\] xxx", r.stdout, re.M) and max(map(len, re.findall("x+", r.stdout))) <= LINE_KEPT
    assert "rank 0 on" in r.stderr and "(exit 3)" in r.stderr, r.stderr[-3000:]
    print(f"kit's peak RSS: {baseline >> 20} MiB for a small job, {peak >> 20} MiB with a {STREAM_MB} MB line")
    assert peak - baseline < GROWN_CAP, f"kit grew by {(peak - baseline) >> 20} MiB ({baseline >> 20} MiB for a " \
                                        f"small job, {peak >> 20} MiB with a {STREAM_MB} MB line)"
