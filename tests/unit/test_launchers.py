"""torchrun and tf launches: the commands kit builds, and the script that starts them on every host
(run here with `ssh` replaced by a local shell; tests/lab runs them over the real cluster SSH)."""

import json
import os
import subprocess
import time

from kit.jobs.commands.horovod import Failures, rank_command, split_rank
from kit.jobs.commands.launchers import tf_config
from kit.backends.cluster.supervisor.launch import NodeCommand, Slot, fanout_script, torch_ranks, torchrun_argv

SLOTS = [Slot("a", "10.0.0.1", 2), Slot("b", "10.0.0.2", 1)]


def test_torchrun_node_command():
    assert torchrun_argv(3, 2, 1, "10.0.0.1", 29611, ["python", "-u", "t.py"]) == [
        "torchrun", "--nnodes=3", "--nproc-per-node=2", "--node-rank=1", "--master-addr=10.0.0.1",
        "--master-port=29611", "--tee=3", "--no-python", "python", "-u", "t.py"]


def test_torch_ranks_follow_the_inventory():
    assert [s.host for s in torch_ranks(SLOTS, None)] == ["a", "a", "b"]
    assert [s.host for s in torch_ranks(SLOTS, 2)] == ["a", "a", "b", "b"]


def test_tf_config_of_a_worker():
    assert json.loads(tf_config(["10.0.0.1:4001", "10.0.0.2:4002"], 1)) == {
        "cluster": {"worker": ["10.0.0.1:4001", "10.0.0.2:4002"]}, "task": {"type": "worker", "index": 1}}


# `ssh [-o OPTION]... HOST CMD...` running CMD here
SSH_HERE = 'ssh() { while [ "$1" = -o ]; do shift 2; done; shift; sh -c "$*"; }\n'


def run_fanout(tmp_path, nodes: list[NodeCommand]) -> tuple[subprocess.CompletedProcess, float]:
    """The script as the primary's container runs it, with `ssh [-o OPTION]... HOST CMD...` running CMD here."""
    script = SSH_HERE + fanout_script(str(tmp_path), nodes)
    started = time.monotonic()
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "KIT_JOB": "job-1"})
    return r, time.monotonic() - started


def test_fanout_labels_lines_and_passes_the_environment(tmp_path):
    (tmp_path / "t.py").write_text("import os\nprint('job', os.environ['KIT_JOB'], os.getcwd())\n")
    r, _ = run_fanout(tmp_path, [
        NodeCommand("a", "10.0.0.1", ("sh", "-c", "echo '[0]<stdout>:from rank 0'; echo torchrun says hi"), None),
        NodeCommand("b", "10.0.0.2", tuple(rank_command("t.py", [])), 1),
    ])
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert lines == sorted(["[0]<stdout>:from rank 0", "a: torchrun says hi", f"[1]<stdout>:job job-1 {tmp_path}",
                            next(l for l in lines if l.startswith("[1]<stdout>:@@kit-exit 0 "))])


def test_a_hosts_failure_counts_when_job_control_reaped_it_before_the_fanout_waited(tmp_path):
    """Under load a host's pipeline can end, and bash's job control reap it, before `wait -n` looks: its status then
    comes from `wait PID`, which must be ssh's failure (pipefail), not the 0 of the sed after it. `jobs` makes bash
    reap it at a known point (what load did by chance: a torchrun job whose node exited 3 was recorded as done)."""
    nodes = [NodeCommand("c", "10.0.0.3", ("sh", "-c", "echo going; exit 3"), None)]
    script = SSH_HERE + fanout_script(str(tmp_path), nodes).replace(
        "code=0\n", "sleep 0.5; jobs >/dev/null\ncode=0\n", 1)
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "c: its processes ended with status 3" in r.stdout


def test_the_first_failure_stops_the_others_and_names_the_rank(tmp_path):
    (tmp_path / "fail.py").write_text("import sys, time\ntime.sleep(0.5)\nsys.exit(3)\n")
    (tmp_path / "wait.py").write_text("import time\nprint('waiting', flush=True)\ntime.sleep(30)\n")
    r, seconds = run_fanout(tmp_path, [
        NodeCommand("a", "10.0.0.1", tuple(rank_command("wait.py", [])), 0),
        NodeCommand("b", "10.0.0.2", tuple(rank_command("fail.py", [])), 1),
    ])
    assert r.returncode == 3 and seconds < 20, (r.stdout, r.stderr)
    assert "b: its processes ended with status 3; stopping the others" in r.stdout
    failures = Failures()
    for line in r.stdout.splitlines():
        failures.feed(*split_rank(line))
    assert failures.first() == (1, 3)


def test_the_reaper_finds_a_jobs_children_that_dropped_its_environment():
    """A rank's child started with `env -i` has no KIT_JOB: it is found as a descendant. Run for real here."""
    import os
    import secrets
    import subprocess
    import time

    from kit.backends.cluster.supervisor.launch import parse_killed, reap_script
    job = f"test-{secrets.token_hex(4)}"
    rank = subprocess.Popen(["env", f"KIT_JOB={job}", "sh", "-c", "env -i sleep 300 & sleep 300 & wait"],
                            start_new_session=True)
    try:
        time.sleep(0.5)
        r = subprocess.run(["sh", "-c", reap_script(job)], capture_output=True, text=True, timeout=60)
        count, killed = r.stdout.splitlines()[:2]
        assert count == "3", r.stdout + r.stderr  # the rank's shell, its sleep, and the env -i sleep
        assert sorted(w.split(":")[1] for w in parse_killed(r.stdout).split()) == ["sh", "sleep", "sleep"], killed
        rank.wait(timeout=10)
        time.sleep(0.5)
        states = subprocess.run(["ps", "-o", "stat=", "-s", str(rank.pid)], capture_output=True, text=True).stdout
        assert [s for s in states.split() if not s.startswith("Z")] == []  # killed (zombies wait for init)
    finally:
        try:
            os.killpg(rank.pid, 9)
        except ProcessLookupError:
            pass
