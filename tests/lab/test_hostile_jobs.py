"""A hostile job on three lab hosts: it forges its exit record,
makes its pid file a FIFO, leaves `env -i` daemons adopted by the container's init, makes its exit file a FIFO and
its output.log a link to /dev/zero. kit still tells it running, stops it within a bound with nothing of it left,
keeps a later job's variables from it (/run/kit is a tmpfs, the file 0600), and reads its folder without blocking
or flooding."""

import json
import re
import secrets
import time
from pathlib import Path

import pytest

from harness import kit, lab_cluster, wait_for

pytestmark = pytest.mark.lab
HOSTILE = str(Path(__file__).parent / "jobs" / "outlive.py")
JOBS_DIR = "/var/lib/kit/lab/jobs"
CONTAINER = "kit-lab"


@pytest.fixture(scope="module")
def cluster(project, lab):
    with lab_cluster(lab, project, "lab", "--hosts", "hosts.txt"):
        yield project


def in_container(h, *argv: str):
    return h.docker("exec", CONTAINER, *argv, check=False)


def daemons(lab) -> dict[str, list[int]]:
    return {h.name: pids for h in lab.hosts if (pids := h.processes("kit-hostile-daemon"))}


def job_left(lab) -> dict[str, list[int]]:
    return {h.name: pids for h in lab.hosts if (pids := h.processes("kit-hostile-daemon|outlive\\.py"))}


def start(project, lab, mode: str, *options: str) -> str:
    r = kit(project, lab, "run", "-d", *options, HOSTILE, "--np", "3", "--", JOBS_DIR, mode, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return re.search(r"job (\S+) started \(detached\)", r.stdout)[1]


def record(project, lab, job_id: str) -> dict:
    listed = kit(project, lab, "jobs", "--json", timeout=120)
    assert listed.returncode == 0, listed.stderr
    return next(r for r in map(json.loads, listed.stdout.splitlines()) if r["id"] == job_id)


def stop(project, lab, job_id: str) -> float:
    started = time.monotonic()
    stopped = kit(project, lab, "stop", job_id, timeout=180)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    return time.monotonic() - started


def test_a_job_that_forges_its_exit_fifos_its_pid_and_leaves_a_daemon_is_stopped_with_nothing_left(project, lab,
                                                                                                   cluster):
    job = start(project, lab, "forge")
    pid = f"{JOBS_DIR}/{job}/pid"
    wait_for("the job's daemons and its FIFO", lambda: len(daemons(lab)) == 3 and
             in_container(lab.hosts[0], "test", "-p", pid).returncode == 0, timeout=120)
    assert in_container(lab.hosts[0], "cat", f"{JOBS_DIR}/{job}/exit").stdout.strip() == "0"  # forged
    assert record(project, lab, job)["state"] == "running"
    elapsed = stop(project, lab, job)
    assert elapsed < 60, elapsed
    wait_for("nothing of the job left", lambda: not job_left(lab), timeout=30)
    assert record(project, lab, job)["state"] == "stopped"


def test_a_later_jobs_variables_are_unreadable_to_an_earlier_jobs_leftover(project, lab, cluster):
    job = start(project, lab, "daemon")
    wait_for("the job's daemons", lambda: len(daemons(lab)) == 3, timeout=120)
    stop(project, lab, job)
    wait_for("the leftovers' end", lambda: not daemons(lab), timeout=10)  # before the next job's variables exist
    secret = f"kit-test-{secrets.token_hex(8)}"
    later = start(project, lab, "sleep", "-e", f"HOSTILE_TEST_SECRET={secret}")
    env = f"/run/kit/env/{later}"
    for h in lab.hosts:  # while it runs: in memory, root's alone
        seen = in_container(h, "sh", "-c", f"stat -f -c %T {env}; stat -c '%a %u' {env}")
        assert seen.stdout.split("\n")[:2] == ["tmpfs", "600 0"], (h.name, seen.stdout, seen.stderr)
    wait_for("the later job's end", lambda: record(project, lab, later)["state"] == "succeeded", timeout=120)
    for h in lab.hosts:
        assert secret not in in_container(h, "cat", "/tmp/kit-stolen").stdout, h.name
        assert in_container(h, "test", "-e", env).returncode != 0, h.name  # removed at its end


def test_run_kit_is_a_tmpfs_in_every_container(lab, cluster):
    for h in lab.hosts:
        seen = in_container(h, "sh", "-c", "stat -f -c %T /run/kit; stat -c '%a %u' /run/kit")
        assert seen.stdout.split("\n")[:2] == ["tmpfs", "700 0"], (h.name, seen.stdout, seen.stderr)


def test_a_job_folder_of_fifos_and_links_neither_blocks_nor_floods_kit(project, lab, cluster):
    job = start(project, lab, "fifo")
    folder = f"{JOBS_DIR}/{job}"
    wait_for("the job's FIFO and link", lambda: in_container(lab.hosts[0], "test", "-L", f"{folder}/output.log")
             .returncode == 0 and in_container(lab.hosts[0], "test", "-p", f"{folder}/exit").returncode == 0,
             timeout=120)
    started = time.monotonic()
    listed = kit(project, lab, "jobs", timeout=60)
    assert listed.returncode == 0 and re.search(rf"^{job}\s.*running", listed.stdout, re.M), listed.stdout
    logs = kit(project, lab, "logs", job, timeout=30)
    assert logs.returncode == 0, logs.stderr
    assert "output.log is not a regular file" in logs.stdout and len(logs.stdout) < 10000, logs.stdout[:2000]
    assert time.monotonic() - started < 60
    assert stop(project, lab, job) < 60
    wait_for("the job's end", lambda: record(project, lab, job)["state"] == "stopped", timeout=60)
    assert not job_left(lab)
