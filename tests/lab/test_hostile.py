"""Hostile jobs and hostile output on three lab hosts, all on one cluster (one `kit up`, one `kit down`).

What ranks write reaches the user's terminal with its control characters made visible (kit.shown): a job's ESC, C1 and
line-separator characters never reach `kit run`'s, `kit logs`' or `kit jobs`' output as they are, and Rich markup in it
is printed as written.

What ranks write cannot grow kit on the control machine without limit: a rank that writes 150 MB with no newline is
shown as the head of its line and a count of the rest, kit's memory stays bounded, and kit ends with the job.

A hostile job forges its exit record, makes its pid file a FIFO, leaves `env -i` daemons adopted by the container's
init (dressed as sshd's connections, as a copy of sh named sshd, as a job's supervisor, as the image's ssh), makes its
exit file a FIFO and its output.log a link to /dev/zero. kit still tells it running, stops it within a
bound with nothing of it left, keeps a later job's variables from it (/run/kit is a tmpfs, the file 0600), and reads
its folder without blocking or flooding.

The tests run in the order written: the jobs that only write come first, the jobs that try to outlive kit last, each
of those stopped with nothing of it left before the next starts, so no test starts on another's daemons.
"""

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import kit, lab_cluster, wait_for

pytestmark = pytest.mark.lab
JOBS = Path(__file__).parent / "jobs"

# terminal safety
ESCAPES = JOBS / "escapes.py"
RAW = re.compile("[\x1b\x07\x80-\x9f\u2028\u2029]")
VISIBLE = ("\\x1b[2J", "\\x1b[1;1H", "\\x1b]52;c:aGFja2Vk\\x07", "c1\\x9b31m", "sep\\u2028after", "bell\\x07")

# hostile output
LINE_KEPT = 64 << 10  # kit.runners.base.LINE_KEPT, written out: the test also ran against kit before it had one
STREAM_MB = 150
KIT_LIMIT_S = 600
GROWN_CAP = 64 << 20  # what kit may grow by over a small job's run: a line's head, the stream's chunks in flight

# kit as a child of this wrapper, whose children's peak RSS is kit's own (kit starts no process on this machine).
MEASURED = ("import json, resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print(json.dumps({'peak': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10}), "
            "file=sys.stderr); sys.exit(code)")

# hostile jobs
HOSTILE = str(JOBS / "outlive.py")
JOBS_DIR = "/var/lib/kit/lab/jobs"
CONTAINER = "kit-lab"


@pytest.fixture(scope="module")
def cluster(project, lab):
    with lab_cluster(lab, project, "lab", "--hosts", "hosts.txt"):
        yield project


def shows_it_visibly(out: str, markup: bool = True) -> None:
    assert not RAW.search(out), repr(RAW.findall(out))
    for escape in VISIBLE:
        assert escape in out, (escape, out[-3000:])
    if markup:
        assert "[bold]x[/bold]" in out, out[-3000:]


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


def in_container(h, *argv: str):
    return h.docker("exec", CONTAINER, *argv, check=False)


def daemons(lab) -> dict[str, list[int]]:
    return {h.name: pids for h in lab.hosts if (pids := h.processes("kit-hostile-daemon"))}


def job_left(lab) -> dict[str, list[int]]:
    return {h.name: pids for h in lab.hosts if (pids := h.processes("kit-hostile-daemon|outlive\\.py"))}


def start(project, lab, mode: str, *options: str, args: tuple[str, ...] = (), np: int = 3) -> str:
    r = kit(project, lab, "run", "-d", *options, HOSTILE, "--np", str(np), "--", JOBS_DIR, mode, *args, timeout=300)
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


def test_a_ranks_escape_sequences_reach_the_terminal_visible(project, lab, cluster):
    run = kit(project, lab, "run", str(ESCAPES), "--np", "1")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    shows_it_visibly(run.stdout)
    job = re.search(r"^✓ job (\S+) finished", run.stdout, re.M)[1]  # kit's line, not the rank's fake one
    assert re.search(r"^\[\S+ rank 0\] before\\x1b\[2J", run.stdout, re.M), run.stdout[-3000:]  # its prefix kept

    logs = kit(project, lab, "logs", job)
    assert logs.returncode == 0, logs.stderr
    shows_it_visibly(logs.stdout)

    jobs = kit(project, lab, "jobs")
    assert jobs.returncode == 0, jobs.stderr
    assert not RAW.search(jobs.stdout), repr(RAW.findall(jobs.stdout))
    # the rank wrote the same into its folder's `hang` record: the supervisor's own record of the end replaced it
    assert "forged the hang record" in run.stdout and "aGFja2Vk" not in jobs.stdout, jobs.stdout[-3000:]


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


def test_a_job_that_forges_its_exit_fifos_its_pid_and_leaves_a_daemon_is_stopped_with_nothing_left(project, lab,
                                                                                                   cluster):
    assert not job_left(lab)  # the daemons counted below are this job's alone
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


# The ways a daemon of outlive.py's `daemon` mode looks like what kit keeps, by its argv[0].
DAEMONS = {"kit-hostile-daemon": "env -i, setsid, a double fork", "sshd: root@notty": "named as sshd's connections",
           "/usr/sbin/sshd": "a copy of sh at /tmp/sshd", "ssh": "the image's ssh, its ProxyCommand a loop",
           "python": "dressed as a job's supervisor"}


def daemon_kinds(lab) -> dict[str, set[str]]:
    """Each host's kinds of daemon (DAEMONS) that live now."""
    found = {}
    for name, pids in daemons(lab).items():
        for pid in pids:
            try:
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if argv0 in DAEMONS:
                found.setdefault(name, set()).add(argv0)
    return found


def test_a_later_jobs_variables_are_unreadable_to_an_earlier_jobs_leftover(project, lab, cluster):
    """The job leaves five daemons on every host, each dressed as something kit keeps; `kit stop` ends them all."""
    assert not job_left(lab)  # the daemons below are this test's job's alone
    job = start(project, lab, "daemon")
    every = {h.name: set(DAEMONS) for h in lab.hosts}
    wait_for("the job's five daemons on every host", lambda: daemon_kinds(lab) == every, timeout=120)
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


def test_what_a_job_started_over_ssh_on_the_next_host_ends_with_it(project, lab, cluster):
    """Each rank starts the copying loop on the next host over the cluster's SSH from a client of its own: the loop
    is that host's sshd's connection's child, which a host's reap keeps, until the client on the other host is
    stopped; the job ends by itself, and its end leaves nothing on any host."""
    assert not job_left(lab)
    job = start(project, lab, "chain", args=(",".join(h.address for h in lab.hosts),))

    def chained() -> set[str]:  # the hosts where the loop runs as what an SSH connection started
        def by_ssh(pid: int) -> bool:
            try:
                return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sh\0-c\0")
            except OSError:
                return False
        return {name for name, pids in daemons(lab).items() if any(map(by_ssh, pids))}
    wait_for("the loop on every host, started over SSH", lambda: chained() == {h.name for h in lab.hosts}, timeout=60)
    wait_for("the job's end", lambda: record(project, lab, job)["state"] == "succeeded", timeout=120)
    wait_for("nothing of the job left", lambda: not job_left(lab), timeout=10)


def loops(lab) -> int:
    """The copying loops that live now, on every host."""
    def is_loop(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sh\0-c\0while")
        except OSError:
            return False
    return sum(1 for pids in daemons(lab).values() for pid in pids if is_loop(pid))


def nothing_reads_the_next_jobs_variables(project, lab) -> None:
    secret = f"kit-test-{secrets.token_hex(8)}"
    later = start(project, lab, "sleep", "-e", f"HOSTILE_TEST_SECRET={secret}")
    wait_for("the later job's end", lambda: record(project, lab, later)["state"] == "succeeded", timeout=120)
    for h in lab.hosts:
        assert secret not in in_container(h, "cat", "/tmp/kit-stolen").stdout, h.name


def test_a_chain_through_a_host_the_job_does_not_run_on_ends_with_the_job(project, lab, cluster):
    """A job on two hosts (-H) whose rank goes over SSH into the third host and from there back into the first: its
    end sweeps every host of the cluster, not only the job's, until nothing is left (the loop on the first host lives
    as long as the third host's client does); a later job's variables are read by nothing."""
    assert not job_left(lab)
    h1, h2, h3 = lab.hosts
    job = start(project, lab, "hops", "-H", f"{h1.address},{h2.address}", np=2,
                args=(f"{h3.address},{h1.address}", "15"))
    wait_for("the chain's two loops (on the third host, then back on the first)", lambda: loops(lab) == 2, timeout=60)
    assert {h.name for h in lab.hosts if h.processes("kit-hostile-daemon")} >= {h1.name, h3.name}
    wait_for("the job's end", lambda: record(project, lab, job)["state"] == "succeeded", timeout=120)
    wait_for("nothing of the job left on any host", lambda: not job_left(lab), timeout=10)
    nothing_reads_the_next_jobs_variables(project, lab)


def test_a_chain_of_six_hops_between_two_hosts_ends_with_kit_stop(project, lab, cluster):
    """Six hops back and forth between the second host and the first (each hop's loop and client live as long as the
    hop before it): more than the four sweeps kit made once. `kit stop` sweeps every host until a round stops nothing,
    bounded by time: nothing of the job is left, and a later job's variables are read by nothing."""
    assert not job_left(lab)
    h1, h2, _ = lab.hosts
    job = start(project, lab, "hops", args=(",".join([h2.address, h1.address] * 3), "120"))
    wait_for("the chain's six loops", lambda: loops(lab) == 6, timeout=90)
    stop(project, lab, job)
    wait_for("nothing of the job left on any host", lambda: not job_left(lab), timeout=10)
    nothing_reads_the_next_jobs_variables(project, lab)


def test_run_kit_is_a_tmpfs_in_every_container(lab, cluster):
    for h in lab.hosts:
        seen = in_container(h, "sh", "-c", "stat -f -c %T /run/kit; stat -c '%a %u' /run/kit")
        assert seen.stdout.split("\n")[:2] == ["tmpfs", "700 0"], (h.name, seen.stdout, seen.stderr)


def test_a_job_folder_of_fifos_and_links_neither_blocks_nor_floods_kit(project, lab, cluster):
    assert not job_left(lab)  # what is checked as left below is this job's alone
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
