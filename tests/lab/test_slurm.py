"""`kit prepare --slurm`: the lab's three hosts become a Slurm cluster (Debian's slurm-wlm and munge, one slurmd per
host), `kit doctor`'s Slurm section reads it, and `kit run --on slurm` runs jobs on it (tests/lab/slurmlab.py makes
and removes it)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness import interrupt, read_until, release_cpu_groups, throttle, wait_for
from helpers import REPO, run_kit
from kit.bench import figures as benchfigures
from kit.backends.slurm import sbatch
from slurmlab import (CLUSTER, MUNGE_KEY, PREPARE, cancel_jobs, job_port_rules, lab_users, live, node_pythons,
                      pid_files, recap, slurm_cluster, stop, user_project)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def slurm(lab, tmp_path_factory):
    """The hosts have a fabric beside their network, as GPU servers do (kit prepare's firewall takes its addresses
    too); its ports stay down but for the test that trains over it, so the other jobs' survey finds one network."""
    lab.fabric()
    try:
        for h in lab.hosts:
            lab.fabric_link(h, False)
        with slurm_cluster(lab, tmp_path_factory.mktemp("slurm")) as s:
            yield s
    finally:
        lab.unshape()
        lab.no_fabric()


@pytest.fixture(autouse=True)
def no_job_left(slurm):
    """A test's jobs end with it, when it fails too (a killed `kit run` leaves its Slurm job running): the next test
    finds the nodes' cores free, not taken by the job of one before."""
    yield
    cancel_jobs(slurm)


def test_check_mode_shows_the_plan_and_changes_nothing(slurm):
    r = slurm.check
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert {h: f for h, (_, u, f) in recap(r.stdout).items()} == {h.address: 0 for h in slurm.hosts}, r.stdout[-3000:]
    assert "check mode: nothing was changed" in r.stdout
    h1 = slurm.hosts[0]
    assert f"+NodeName={slurm.nodes[h1.address]} NodeAddr={h1.address} " in r.stdout, r.stdout[-5000:]  # --diff
    assert slurm.after_check == {"conf": False, "daemons": [], "key": True, "kept key": False}


def test_prepare_makes_the_three_lab_hosts_idle_slurm_nodes(slurm):
    r = slurm.prepared
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "hosts are prepared" in r.stdout
    states = slurm.wait_idle()
    assert states == {slurm.nodes[h.address]: (h.address, "idle") for h in slurm.hosts}, states
    conf = Path("/etc/slurm/slurm.conf").read_text()
    primary = slurm.primary
    assert f"SlurmctldHost={slurm.nodes[primary.address]}({primary.address})" in conf
    assert re.search(r"^PartitionName=kit Nodes=\S+ Default=YES MaxTime=INFINITE State=UP$", conf, re.M), conf
    key = slurm.lab.home / ".kit" / CLUSTER / "slurm" / "munge.key"
    assert key.stat().st_mode & 0o777 == 0o600 and MUNGE_KEY.read_bytes() == key.read_bytes()
    assert MUNGE_KEY.stat().st_mode & 0o777 == 0o400
    # README's next steps (kit export --to venv, kit run --on slurm) go to the primary with no line to write first
    assert f"slurm.login is now {primary.address}, the primary" in " ".join(r.stdout.split()), r.stdout[-2000:]
    assert yaml.safe_load((slurm.project / "kit.yaml").read_text())["slurm"] == {"login": primary.address}


def test_a_job_step_runs_on_every_node(slurm):
    """The nodes take work: munge credentials, slurmd on every host and the controller agree."""
    r = slurm.run("timeout 60 srun --nodes=3 --ntasks-per-node=1 hostname -s", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.split()) == sorted(slurm.nodes.values())


def test_doctor_shows_the_slurm_section_all_ok(slurm):
    r = slurm.kit("doctor", "--json", "--hosts", "hosts.txt", timeout=300)
    report = json.loads(r.stdout)
    found = {(f["host"], f["check"]): f for f in report["findings"] if f["check"] in SLURM_CHECKS}
    assert set(found) == {(h.address, c) for h in slurm.hosts for c in ("slurm node", "munge")} | \
        {(slurm.primary.address, "slurmctld")}, report
    assert [f for f in found.values() if f["level"] != "ok"] == []
    assert r.returncode == 0, [f for f in report["findings"] if f["level"] != "ok"]
    text = slurm.kit("doctor", "--hosts", "hosts.txt", timeout=300)
    assert f"{slurm.nodes[slurm.hosts[2].address]} is idle" in text.stdout, text.stdout


SLURM_CHECKS = ("slurmctld", "slurm node", "munge")


def test_a_docker_cluster_on_the_slurm_nodes_is_refused_unless_kit_yaml_allows_it(slurm, project, tmp_path):
    """Its jobs are root in the hosts' network, and the Slurm jobs' ports are kept by uid: kit up stops before it
    changes anything, naming each host and the setting that allows it."""
    folder = tmp_path / "docker-cluster"
    folder.mkdir()
    (folder / "kit.yaml").write_text((project / "kit.yaml").read_text())
    slurm.lab.hosts_file(folder / "hosts.txt")
    r = run_kit("up", "--hosts", "hosts.txt", "--dry-run", cwd=folder, env=slurm.lab.env, timeout=300)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    for h in slurm.hosts:
        assert f"  {h.address}: this host is a node of the Slurm cluster kit prepared" in r.stderr, r.stderr
    assert "fix: give the Docker cluster and Slurm hosts of their own, or set cluster.share_hosts_with_slurm: " \
           "true" in r.stderr


def test_doctor_names_the_host_whose_slurmd_stopped_and_a_second_prepare_changes_that_alone(slurm):
    """kit prepare --slurm a second time: on the host whose slurmd was stopped it starts it again (its one change);
    everything else it finds done (no change on the other hosts, no daemon restarted)."""
    broken = slurm.hosts[2]
    node = slurm.nodes[broken.address]
    pids = {str(p): live(p) for p in pid_files(slurm.nodes.values())}
    stop(live(Path(f"/run/slurmd-{node}.pid")))
    r = slurm.kit("doctor", "--json", "--hosts", "hosts.txt", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    failed = [f for f in json.loads(r.stdout)["findings"] if f["level"] == "fail"]
    assert [(f["host"], f["check"]) for f in failed] == [(broken.address, "slurm node")], failed
    assert "slurmd" in failed[0]["text"] and "kit prepare --slurm --hosts hosts.txt" in failed[0]["fix"], failed
    again = slurm.kit(*PREPARE)
    assert again.returncode == 0, again.stdout[-5000:] + again.stderr[-2000:]
    assert recap(again.stdout) == {h.address: (int(h is broken), 0, 0) for h in slurm.hosts}, again.stdout[-4000:]
    assert slurm.wait_idle()[node] == (broken.address, "idle")
    now = {str(p): live(p) for p in pid_files(slurm.nodes.values())}
    restarted = f"/run/slurmd-{node}.pid"
    assert now[restarted] and {p: now[p] for p in now if p != restarted} == {p: pids[p] for p in pids if p != restarted}
    back = slurm.kit("doctor", "--json", "--hosts", "hosts.txt", timeout=300)
    assert back.returncode == 0, back.stdout


# ---------------------------------------------------------------- jobs on the lab's Slurm: kit run --on slurm
#
# Two users submit over SSH to the primary, the login host; the nodes' Python is kit's images' venv (slurmlab.py).

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ALLREDUCE = Path(__file__).resolve().parents[2] / "cli" / "kit" / "bench" / "jobs" / "allreduce.py"
JOBS = Path(__file__).resolve().parent / "jobs"
SECRET = "kitlab-slurm-Sup3rSecret-value"


@pytest.fixture(scope="module")
def envs(slurm, project, tmp_path_factory):
    with node_pythons(project, tmp_path_factory.mktemp("tf-build")) as found:
        yield found


@pytest.fixture(scope="module")
def users(slurm):
    with lab_users() as names:
        yield names


def kit_as(slurm, folder: Path, *args: str, timeout: int = 600):
    return run_kit(*args, cwd=folder, env=slurm.lab.env, timeout=timeout)


def ranks_by_node(out: str, said: str = "") -> dict[int, str]:
    """rank -> its node, from the ranks' lines in kit's output (those that begin with `said`)."""
    return {int(rank): node for node, rank in re.findall(rf"^\[(\S+) rank (\d+)\] {re.escape(said)}", out, re.M)}


LAUNCHES = {
    "horovod": ([], EXAMPLES / "cifar10_cnn_horovod.py", ["--epochs", "2", "--samples", "1536"],
                r"^\[\S+ rank 0\] epoch \d: loss ([\d.]+)"),
    "torchrun": (["--launcher", "torchrun"], EXAMPLES / "ddp_train.py", ["--epochs", "3"],
                 r"^\[\S+ rank 0\] epoch \d: loss ([\d.]+)"),
    "tf": (["--launcher", "tf"], EXAMPLES / "tf_multiworker.py", ["--epochs", "2", "--samples", "1536"],
           r"^\[\S+ rank 0\] epoch \d: loss ([\d.]+)"),
}


def readme_slurm_steps() -> list[str]:
    """The commands of README's Slurm block, their comments left out."""
    section = (REPO / "README.md").read_text().split("## When the lab becomes a Slurm cluster", 1)[1]
    block = re.search(r"\n\n((?:    kit .*\n)+)", section)[1]
    return [line.split("#", 1)[0].strip() for line in block.splitlines()]


def test_readmes_slurm_steps_reach_a_running_job_as_it_writes_them(slurm, envs, tmp_path):
    """A new user's path, command for command: `kit prepare --slurm` (the fixture's, in the project folder: its
    kit.yaml, with the slurm.login prepare wrote, is copied with the example), the nodes' Python exported (/shared is
    the lab's shared filesystem, where the same image's was exported: nothing to do), the job, kit jobs. No kit.yaml
    line written by hand between them."""
    prepare, export, run, listed = readme_slurm_steps()
    assert prepare.split()[1:] == list(PREPARE) and "hosts are prepared" in slurm.prepared.stdout
    folder = tmp_path / "project"
    (folder / "examples").mkdir(parents=True)
    shutil.copy(slurm.project / "kit.yaml", folder / "kit.yaml")
    shutil.copy(EXAMPLES / "cifar10_cnn_horovod.py", folder / "examples")
    play = lambda step, **kw: run_kit(*shlex.split(step)[1:], cwd=folder, env=slurm.lab.env, **kw)
    assert export.startswith("kit export --to venv -o /shared/envs/kit")
    r = play(export.replace("/shared/envs/kit", str(Path(envs["horovod"]).parents[1])), timeout=600)
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    r = play(run, timeout=600)
    there = re.search(r"; its folder there: (/\S+)$", r.stdout, re.M)
    try:  # (it is also the Horovod case of test_each_launcher_trains_across_three_nodes)
        assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
        job = re.search(rf"^kit: job (\S+) is Slurm job (\d+) on {slurm.primary.address}: Horovod \(Gloo\) on 3 node",
                        r.stdout, re.M)
        assert job and re.search(r"^\[\S+ rank 0\] epoch 2: loss [\d.]+ accuracy", r.stdout, re.M), r.stdout[-3000:]
        trained_on_every_node(slurm, folder, r, job[1], job[2], "horovod", LAUNCHES["horovod"][3])
        assert play(listed).returncode == 0
    finally:  # (the job's folder in the login user's home: this machine's user's, on the lab)
        if there:
            shutil.rmtree(there[1], ignore_errors=True)


@pytest.mark.parametrize("launcher", [launcher for launcher in LAUNCHES if launcher != "horovod"])
def test_each_launcher_trains_across_three_nodes(slurm, envs, users, tmp_path, launcher):
    """torchrun and tf here; Horovod's is README's job (test_readmes_slurm_steps_reach_a_running_job_as_it_writes_them),
    checked by the same lines."""
    flags, script, args, loss = LAUNCHES[launcher]
    folder = user_project(slurm, tmp_path / "project", users[0], envs[launcher])
    shutil.copy(script, folder / script.name)
    r = kit_as(slurm, folder, "run", "--on", "slurm", "--nodes", "3", *flags, script.name, *args)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    submitted = re.search(r"^kit: job (\S+) is Slurm job (\d+) on (\S+): ", r.stdout, re.M)
    assert submitted and submitted[3] == f"{users[0]}@{slurm.primary.address}", (r.stdout + r.stderr)[-3000:]
    trained_on_every_node(slurm, folder, r, submitted[1], submitted[2], launcher, loss)


def trained_on_every_node(slurm, folder: Path, r, job: str, slurm_id: str, launcher: str, loss: str) -> None:
    """A job's ranks on all three nodes, named by node; its loss going down; kit jobs and kit logs --rank after it."""
    nodes = ranks_by_node(r.stdout)
    assert set(nodes.values()) == set(slurm.nodes.values()), nodes
    losses = [float(x) for x in re.findall(loss, r.stdout, re.M)]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    assert re.search(rf"✓ job {job} finished \(Slurm job {slurm_id}\)", r.stdout)
    listed = [json.loads(line) for line in kit_as(slurm, folder, "jobs", "--json").stdout.splitlines()]
    mine = next(row for row in listed if row["id"] == job)
    assert (mine["on"], mine["slurm_id"], mine["state"], mine["exit"], mine["launcher"]) == \
        ("slurm", slurm_id, "succeeded", 0, launcher)
    lines = kit_as(slurm, folder, "logs", job, "--rank", "1").stdout.splitlines()
    assert lines and all(line.startswith(f"[{nodes[1]} rank 1] ") for line in lines), lines[:5]


def test_a_failing_rank_names_itself_and_its_node(slurm, envs, users, tmp_path):
    folder = user_project(slurm, tmp_path / "project", users[0], envs["horovod"])
    (folder / "fail.py").write_text("import sys, time\nimport horovod.torch as hvd\nhvd.init()\n"
                                    "print('up', hvd.rank(), flush=True)\n"
                                    "sys.exit(3) if hvd.rank() == 1 else time.sleep(120)\n")
    r = kit_as(slurm, folder, "run", "--on", "slurm", "--nodes", "3", "fail.py")
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-2000:]
    node = slurm.nodes[slurm.hosts[1].address]
    assert re.search(rf"error: rank 1 on {node} failed first \(exit 3\); Slurm stopped the job's other tasks", r.stderr)
    wait_for("the other ranks to end", lambda: not any(h.processes("fail.py") for h in slurm.hosts), timeout=30)


def test_variables_reach_the_ranks_and_no_slurm_record_or_file_of_the_job(slurm, envs, users, tmp_path):
    folder = user_project(slurm, tmp_path / "project", users[0], envs["horovod"])
    shutil.copy(JOBS / "print_env.py", folder / "print_env.py")
    r = run_kit("run", "--on", "slurm", "--nodes", "2", "-e", "WANDB_API_KEY", "print_env.py", cwd=folder,
                env={**slurm.lab.env, "WANDB_API_KEY": SECRET})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    assert r.stdout.count(digest) == 2  # both ranks had it
    slurm_id = re.search(r"is Slurm job (\d+)", r.stdout)[1]
    seen = slurm.run(f"scontrol show job -dd {slurm_id}; squeue -a -o %all; sacct -c -a -P; "
                     f"cat ~{users[0]}/kit-jobs/*/kit-job.sbatch; ls -a ~{users[0]}/kit-jobs/*/.kit/env").stdout
    assert f"JobId={slurm_id}" in seen and "#SBATCH --nodes=2" in seen
    assert SECRET not in seen and SECRET not in r.stdout + r.stderr
    assert not re.search(r"^\d{8}-\d{6}-[0-9a-f]{4}$", seen, re.M)  # the variables' file went with the job


HUNG = """import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(time.monotonic()))  # docs/schedulers.md's handler, short
import torch
import horovod.torch as hvd
hvd.init()
print("start", os.environ["KIT_RESTART"], flush=True)
if "--hang-now" not in sys.argv:  # steps until Slurm's warning before the time limit: the ranks stop together
    end = time.monotonic() + 150
    while time.monotonic() < end and hvd.allreduce(torch.tensor(float(bool(got))), op=hvd.Sum).item() == 0:
        time.sleep(0.5)
    while not got and time.monotonic() < end:  # (Slurm signals every task at once: this one's own, a moment later)
        time.sleep(0.1)
    print("checkpoint saved" if got else "no warning", flush=True)
print("waits", hvd.rank(), flush=True)
if hvd.rank() == 1:  # a collective the others never reach: each waits for the others for good
    hvd.broadcast(torch.ones(4), root_rank=0, name="params")
else:
    hvd.allreduce(torch.ones(4), name="grads")
print("never", flush=True)
"""


def test_a_hung_job_is_named_with_every_ranks_stack_by_kits_watch_and_without_it_ended_by_the_time_limit(
        slurm, envs, users, tmp_path):
    """Rank 1 waits on a broadcast while the others wait in an allreduce: the same job twice, side by side (a core
    a task, so that both run at once).

    With kit's hang watch (--hang-timeout 60s, three nodes): within the timeout + 30 s of the ranks' last step kit
    names rank 1 and its node, keeps every rank's stack (faulthandler's, on scancel --signal=USR2) beside the job's
    output, and cancels it; `kit jobs` shows it hung.

    Without it (--hang-timeout 0, --time 1, two nodes, the script's SIGUSR1 handler): SIGUSR1 to the job's tasks
    reaches each rank (under kit's task, which ignores it itself) and the script saves its checkpoint; then it hangs,
    and Slurm's time limit ends it: kit says so, from Slurm's state, and records `timeout` (before, it named rank 0 as
    the rank that failed first, exit 143, and recorded `failed`). The test sends the signal as Slurm's warning does
    (scancel --signal=USR1, to the job's tasks) once both ranks started: with a limit of a minute, Slurm's own
    (`--signal=USR1@120`, which Slurm may send up to a minute early) comes as the job starts, before any handler."""
    env = {**os.environ, **slurm.lab.env, "COLUMNS": "200"}
    limited = user_project(slurm, tmp_path / "limited", users[0], envs["horovod"])
    (limited / "hung.py").write_text(HUNG)
    timeout = subprocess.Popen([sys.executable, "-m", "kit", "run", "--on", "slurm", "--nodes", "2", "--time", "1",
                                "--cpus-per-task", "1", "--hang-timeout", "0", "hung.py"], cwd=limited,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    watched = user_project(slurm, tmp_path / "watched", users[0], envs["horovod"])
    (watched / "hung.py").write_text(HUNG)
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--on", "slurm", "--nodes", "3", "--cpus-per-task",
                             "1", "--hang-timeout", "60s", "hung.py", "--hang-now"], cwd=watched,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        started = read_until(timeout, lambda seen: len(re.findall(r"^\[\S+ rank \d\] start 0$", "".join(seen), re.M))
                             == 2, 240)
        slurm.run("scancel --signal=USR1 " + re.search(r"is Slurm job (\d+)", started[0])[1])
        seen = read_until(proc, lambda seen: len(ranks_by_node("".join(seen), "waits")) == 3, 240)
        waiting = time.monotonic()
        out, err = proc.communicate(timeout=300)
        elapsed = time.monotonic() - waiting
        limited_out, limited_err = timeout.communicate(timeout=400)
        limited_out = "".join(started) + limited_out
    finally:
        proc.kill()
        timeout.kill()
    out = "".join(seen) + out
    assert proc.returncode == 1, out[-3000:] + err[-3000:]
    assert elapsed < 60 + 30, elapsed
    nodes = ranks_by_node(out)
    assert sorted(nodes) == [0, 1, 2], out[-5000:]
    job, slurm_id = re.search(r"^kit: job (\S+) is Slurm job (\d+)", out, re.M).groups()
    said = " ".join(err.split())
    hung = re.search(r"error: job \S+ hung: no rank has made progress for \d+ s: rank 1 on (\S+) is at (.*); the "
                     r"other 2 ranks wait at (.*); Slurm job \d+ was cancelled \(\w+\), every rank's stack is in "
                     r"(\S+)", said)
    assert hung and hung[1] == nodes[1] and "hung.py:17" in hung[2] and "hung.py:19" in hung[3], said
    assert hung[4].endswith(f"/kit-{slurm_id}-stacks"), said
    for rank in range(3):
        text = slurm.run(f"cat {hung[4]}/rank-{rank}.txt").stdout
        assert text.startswith(f"rank {rank} on {nodes[rank]}\n") and "most recent call first" in text, text
        assert ("hung.py\", line 17" if rank == 1 else "hung.py\", line 19") in text, text
    rows = {row["id"]: row for row in map(json.loads, kit_as(slurm, watched, "jobs", "--json").stdout.splitlines())}
    assert rows[job]["state"] == "failed" and rows[job]["hang"].startswith("no rank has made progress"), rows[job]
    assert f"{job} hung: no rank has made progress" in " ".join(kit_as(slurm, watched, "jobs").stdout.split())

    out = limited_out + limited_err
    assert sorted(re.findall(r"^\[\S+ rank (\d)\] checkpoint saved$", limited_out, re.M)) == ["0", "1"], out[-3000:]
    assert len(re.findall(r"^\[\S+ rank \d\] start 0$", limited_out, re.M)) == 2  # KIT_RESTART: the first start
    job, slurm_id = re.search(r"^kit: job (\S+) is Slurm job (\d+)", limited_out, re.M).groups()
    # (a rank's traceback as the time limit ends it may name the script, hung.py: that is not kit saying "hung")
    assert timeout.returncode != 0 and "failed first" not in out and "hung" not in out.replace("hung.py", ""), \
        out[-3000:]
    assert f"error: job {job} reached its time limit, and Slurm ended it (Slurm job {slurm_id}: timeout)" in \
        " ".join(limited_err.split()), limited_err
    rows = {row["id"]: row for row in map(json.loads, kit_as(slurm, limited, "jobs", "--json").stdout.splitlines())}
    assert rows[job]["state"] == "timeout", rows[job]
    wait_for("no process of the jobs", lambda: not any(h.processes("hung.py") for h in slurm.hosts), timeout=60)


RESUMED = """import os, time
import torch
import horovod.torch as hvd
hvd.init()
step = int(open("ckpt.txt").read()) if os.path.exists("ckpt.txt") else 0
print("start", os.environ["KIT_RESTART"], "ranks", hvd.size(), "step", step, flush=True)
while step < 40:
    hvd.allreduce(torch.ones(1), name="step")
    step += 1
    if hvd.rank() == 0 and step % 5 == 0:  # a checkpoint every 5 steps
        with open("ckpt.new", "w") as f:
            f.write(str(step))
        os.replace("ckpt.new", "ckpt.txt")
        print("checkpoint", step, flush=True)
    time.sleep(0.25)
print("done", step, flush=True)
"""


def test_a_node_slowed_mid_job_is_named_the_straggler_by_kits_watch(slurm, envs, users, tmp_path):
    """CIFAR on three nodes; after its first epoch each rank gets a CPU quota of 0.6 of a core, and the one on rank
    2's node half of it: kit's watch, reading the heartbeats from the login host, names that node within 3 minutes
    (--straggler-window 10s here), with what its rank does; `kit jobs` keeps it, and `kit jobs --ranks` shows the
    node against the others meanwhile."""
    folder = user_project(slurm, tmp_path / "slowed", users[0], envs["horovod"])
    shutil.copy(EXAMPLES / "cifar10_cnn_horovod.py", folder)
    env = {**os.environ, **slurm.lab.env, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--on", "slurm", "--nodes", "3", "--cpus-per-task",
                             "1", "--straggler-window", "10s", "cifar10_cnn_horovod.py", "--epochs", "400",
                             "--samples", "1536"], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True)
    try:
        seen = read_until(proc, lambda seen: any("] epoch 1: loss" in line for line in seen), 300)
        assert not any("straggler" in line for line in seen), "".join(seen)
        node = ranks_by_node("".join(seen))[2]
        for h in slurm.hosts:  # (each node's rank; a quota of its own node's, rank 2's node's half the others')
            throttle(h, "cifar10_cnn_horovod", 0.3 if slurm.nodes[h.address] == node else 0.6)
        slowed = time.monotonic()
        seen += read_until(proc, lambda more: any("straggler:" in line for line in more), 180)
        named = time.monotonic() - slowed
        # (read from the login host while the job runs on, once the watch named the node: a reading begun sooner may
        # span the moment the quotas began, and show the node less slowed than it is)
        ranks = kit_as(slurm, folder, "jobs", "--ranks", "--json")
        assert proc.poll() is None, "".join(seen)[-3000:]
        interrupt(proc, 120)  # (Ctrl-C: kit cancels the job)
    finally:
        release_cpu_groups()
        proc.kill()
    said = [line for line in seen if "straggler:" in line]
    assert len(said) == 1 and named < 180, "".join(seen)[-3000:]
    assert re.fullmatch(rf"kit: straggler: host {re.escape(node)} \(rank 2\) [\d.]+x slower than the others for \d+ "
                        r"s; its rank (waits for data|computes|waits in collectives) \d+% of the time\n", said[0]), said
    job = re.search(r"^kit: job (\S+) is Slurm job", "".join(seen), re.M)[1]
    rows = {row["id"]: row for row in map(json.loads, kit_as(slurm, folder, "jobs", "--json").stdout.splitlines())}
    assert rows[job]["straggler"] == said[0].removeprefix("kit: ").strip(), rows[job]
    paces = {row["rank"]: row for row in map(json.loads, ranks.stdout.splitlines())}
    assert sorted(paces) == [0, 1, 2] and paces[2]["host"] == node, ranks.stdout
    assert paces[2]["vs_others"] >= 1.5 > paces[0]["vs_others"], paces
    wait_for("no process of the job", lambda: not any(h.processes("cifar10_cnn") for h in slurm.hosts), timeout=60)


CONNECT = """import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close(); print("connected")
except ConnectionRefusedError:
    print("refused")
except OSError:
    print("dropped")
"""


def connects(h, user: str, address: str, port: int) -> str:
    """Whether a program of the user's on the host reaches address:port: connected, refused or dropped."""
    return h.run_in("runuser", "-u", user, "--", "/usr/bin/python3", "-c", CONNECT, address, str(port)).stdout.strip()


SQUAT = """import select, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16); s.settimeout(0.5); print("ready", flush=True)
n, end = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end and not select.select([sys.stdin], [], [], 0)[0]:   # (until the test closes its stdin)
    try:
        s.accept()[0].close(); n += 1
    except OSError:
        pass
print("accepted", n, flush=True)
"""


def test_another_users_program_on_a_jobs_port_gets_none_of_its_connections_and_is_named(slurm, envs, users, tmp_path):
    """Another lab user's program listens on the port the next job gets (TF's first worker port), on every node,
    before the job starts: the job's workers cannot serve there and connect to it, and kit's Prolog keeps their
    connections from it (the program accepted none); each node's task that looks before Slurm ends the job names the
    port and whose it is."""
    folder = user_project(slurm, tmp_path / "project", users[0], envs["tf"])
    flags, script, args, _ = LAUNCHES["tf"]
    shutil.copy(script, folder / script.name)
    dummy = slurm.run("sbatch --parsable --hold --wrap true").stdout.strip()   # the ids Slurm gives are in order
    slurm.run(f"scancel {dummy}")
    slurm_id = int(dummy) + 1
    port = sbatch.JOB_PORT_BASE + slurm_id % sbatch.JOB_PORT_BLOCKS * sbatch.JOB_PORT_BLOCK
    other = int(slurm.primary.run_in("id", "-u", users[1]).stdout)
    squatters = [subprocess.Popen([*h.nsenter, "runuser", "-u", users[1], "--", "/usr/bin/python3", "-c", SQUAT,
                                   str(port), "240"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for h in slurm.hosts]
    try:
        assert [p.stdout.readline().strip() for p in squatters] == ["ready"] * 3
        r = kit_as(slurm, folder, "run", "--on", "slurm", "--nodes", "3", *flags, script.name, *args, timeout=400)
        said = r.stdout + r.stderr
        assert re.search(rf"^kit: job \S+ is Slurm job {slurm_id} ", r.stdout, re.M), said[-3000:]
        assert r.returncode != 0, said[-3000:]
        named = re.findall(rf"kit: port {port} of this job on (\S+) is held by uid {other}, another user's program",
                           said)
        failed = re.search(r"error: rank \d+ on (\S+) failed first", said)
        assert failed and failed[1] in named, said[-4000:]   # the task that ended the job said why
        # each other node's task names it too, unless Slurm ended that task (after the first one failed) before it
        # looked: the tasks start one after another, and the first to reach the port fails at once
        ended = set(re.findall(r"srun: error: (\S+): task \d+: Terminated", said))
        assert set(named) <= set(slurm.nodes.values()), said[-4000:]
        assert set(slurm.nodes.values()) - set(named) <= ended, said[-4000:]
    finally:   # (their stdin closed: each says how many it accepted, and ends)
        accepted = [p.communicate(timeout=30)[0].split()[-2:] for p in squatters]
    assert accepted == [["accepted", "0"]] * 3, accepted


PLANTED = "kit-ExitCode=0:0-JobState=COMPLETED-WorkDir=/elsewhere"  # the fields kit reads, in a name a job gives itself


def test_kit_stop_leaves_nothing_of_the_job_on_any_node(slurm, envs, users, tmp_path):
    """The job renames itself (and sets its comment) with the fields kit reads: kit still sees it running, and stops
    it. Slurm's warning before the time limit (SIGUSR1 to every process of the job, which may come as it starts)
    leaves Horovod's rendezvous serving: the ranks still starting need it."""
    folder = user_project(slurm, tmp_path / "project", users[0], envs["horovod"])
    (folder / "long_job.py").write_text(
        "import os, signal, subprocess, time\nimport horovod.torch as hvd\nhvd.init()\n"
        "signal.signal(signal.SIGUSR1, lambda *a: print('warned', hvd.rank(), flush=True))\n"
        "if hvd.rank() == 0:\n"
        f"    subprocess.run(['scontrol', 'update', 'JobId=' + os.environ['SLURM_JOB_ID'], 'JobName={PLANTED}',\n"
        "                    'Comment=JobState=COMPLETED ExitCode=0:0 WorkDir=/elsewhere'], check=True)\n"
        "print('up', hvd.rank(), flush=True)\ntime.sleep(600)\n")
    r = kit_as(slurm, folder, "run", "--on", "slurm", "--detach", "--nodes", "3", "long_job.py")
    assert r.returncode == 0, r.stdout + r.stderr
    job, slurm_id = re.search(r"^kit: job (\S+) is Slurm job (\d+)", r.stdout, re.M).groups()
    wait_for("the job's three ranks", lambda: len([h for h in slurm.hosts if h.processes("long_job.py")]) >= 1
             and kit_as(slurm, folder, "logs", job).stdout.count(" up ") == 3, timeout=120)
    assert f"JobName={PLANTED} " in slurm.run(f"scontrol show job -o {slurm_id}").stdout
    rows = {row["id"]: row for row in map(json.loads, kit_as(slurm, folder, "jobs", "--json").stdout.splitlines())}
    assert (rows[job]["state"], rows[job]["exit"]) == ("running", None), rows[job]
    # Horovod's rendezvous (no authentication) listens on the first node's training address and the job's port alone,
    # a port kit's firewall keeps to the cluster: this machine, which is no host of it, is not let in; and kit's Prolog
    # keeps it to the job's user on the job's nodes: another user there is not let in either.
    port = sbatch.JOB_PORT_BASE + int(slurm_id) % sbatch.JOB_PORT_BLOCKS * sbatch.JOB_PORT_BLOCK
    slurm.run(f"scancel --signal=USR1 {slurm_id}")  # as Slurm's warning: to every process of the job's tasks
    wait_for("each rank's SIGUSR1 handler", lambda: kit_as(slurm, folder, "logs", job).stdout.count(" warned ") == 3,
             timeout=60)
    listening = {h.address: [line.split()[3] for line in h.run_in("ss", "-Hltn").stdout.splitlines()
                             if line.split()[3].endswith(f":{port}")] for h in slurm.hosts}
    served = {address: found for address, found in listening.items() if found}
    assert len(served) == 1, listening  # (the rendezvous still serves)
    (found,) = served.values()
    assert len(found) == 1 and not found[0].startswith(("0.0.0.0:", "*:", "[::]:")), found  # one address, no wildcard
    bound = found[0].rpartition(":")[0]
    with pytest.raises(OSError):
        socket.create_connection((bound, port), timeout=3).close()
    for h in slurm.hosts:
        assert connects(h, users[1], bound, port) == "dropped", h.name
        assert connects(h, users[0], bound, port) == "connected", h.name
    started = time.monotonic()
    stop = kit_as(slurm, folder, "stop", job)
    assert stop.returncode == 0 and f"job {job} stopped" in stop.stdout, stop.stdout + stop.stderr
    wait_for("no process of the job", lambda: not any(h.processes("long_job.py") for h in slurm.hosts), timeout=30)
    assert time.monotonic() - started < 30
    rows = {row["id"]: row for row in map(json.loads, kit_as(slurm, folder, "jobs", "--json").stdout.splitlines())}
    assert rows[job]["state"] == "stopped"
    wait_for("the Epilog to remove the job's port rules on every node",
             lambda: not any(job_port_rules(h) for h in slurm.hosts), timeout=30)


def test_two_users_jobs_queue_and_both_finish(slurm, envs, users, tmp_path):
    """Each takes every core of the three nodes: the second waits in Slurm's queue for the first."""
    import subprocess
    runs = []
    for user in users:
        folder = user_project(slurm, tmp_path / user, user, envs["horovod"])
        shutil.copy(JOBS / "noop.py", folder / "noop.py")
        runs.append(subprocess.Popen([sys.executable, "-m", "kit", "run", "--on", "slurm", "--nodes", "3",
                                      "--ntasks-per-node", "2", "noop.py"], cwd=folder, text=True,
                                     env={**os.environ, **slurm.lab.env, "COLUMNS": "200"},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=600) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], outs
    ids = [re.search(r"is Slurm job (\d+)", out)[1] for out, _ in outs]
    jobs = {}
    for user, slurm_id in zip(users, ids):
        shown = slurm.run(f"scontrol show job -o {slurm_id}").stdout
        assert f"UserId={user}(" in shown and "JobState=COMPLETED" in shown, shown
        jobs[slurm_id] = dict(re.findall(r"(StartTime|EndTime)=(\S+)", shown))
    first, second = sorted(jobs.values(), key=lambda j: j["StartTime"])
    assert second["StartTime"] >= first["EndTime"], jobs  # queued, not sharing the cores



@pytest.mark.alone  # bandwidth against the fabric's rate
def test_a_job_trains_over_the_fabric_its_tasks_measured(slurm, envs, users, tmp_path):
    """With the fabric up at 1 Gbit/s and the nodes' network (their NodeAddr) at 100 Mbit/s, the job's tasks survey
    the nodes' networks before their ranks start: a 64 MiB allreduce of Horovod's then reaches 0.85 of the fabric's
    rate (over the NodeAddr network it could not pass 0.1 of it)."""
    lab = slurm.lab
    for h in lab.hosts:
        lab.fabric_link(h, True)
    lab.shape("100mbit")
    lab.shape_fabric("1gbit")
    try:
        folder = user_project(slurm, tmp_path / "project", users[0], envs["horovod"])
        shutil.copy(ALLREDUCE, folder / ALLREDUCE.name)
        size = str(64 << 20)
        r = kit_as(slurm, folder, "run", "--on", "slurm", "--nodes", "3", ALLREDUCE.name, "horovod", "--min-bytes", size,
                   "--max-bytes", size, "--seconds", "1")
    finally:
        lab.unshape()
        for h in lab.hosts:
            lab.fabric_link(h, False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-5000:]
    assert re.search(r"\[\S+ rank 0\] kit: training network: 10\.232\.0\.0/24 \(fabric0\), 0\.9\d Gbit/s measured, 3 of "
                     r"3 nodes; Slurm over 10\.231\.77\.0/24", r.stdout), out[-3000:]
    figures = [f for line in r.stdout.splitlines() if (f := benchfigures.parse_result(line.split("] ", 1)[-1]))]
    assert len(figures) == 1 and figures[0].ranks == 3 and figures[0].bytes == 64 << 20, figures
    assert figures[0].busbw_gbits >= 0.85, figures[0]


@pytest.mark.last  # the node it lost stays down
def test_a_job_that_lost_a_node_starts_again_on_the_others_from_its_checkpoint(slurm, envs, users, tmp_path):
    """--restarts 1 --min-np 2 on three nodes: after its first checkpoint, the node of rank 2 loses its slurmd and
    the job's tasks (SIGKILL, as a node that fails). Slurm keeps the job running, waiting for that node until its
    SlurmdTimeout (300 s); kit's watch sees that node's rank write no heartbeat while the others ended, cancels the
    job, and submits it again without that node on the two others, where it resumes from the checkpoint and ends 0.
    `kit jobs` shows the restart and the node left out; `kit logs` both starts. The module's last test: the node it
    lost stays down (kit prepare --slurm brings it back, 30 s, that no test after it needs)."""
    folder = user_project(slurm, tmp_path / "resumed", users[0], envs["horovod"])
    (folder / "resumed.py").write_text(RESUMED)
    env = {**os.environ, **slurm.lab.env, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--on", "slurm", "--nodes", "3", "--cpus-per-task",
                             "1", "--restarts", "1", "--min-np", "2", "resumed.py"], cwd=folder,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    lost = None
    try:
        seen = read_until(proc, lambda seen: "] checkpoint 5\n" in "".join(seen)
                          and len(ranks_by_node("".join(seen), "start 0")) == 3, 240)
        lost = ranks_by_node("".join(seen))[2]
        h = next(h for h in slurm.hosts if slurm.nodes[h.address] == lost)
        os.kill(live(Path(f"/run/slurmd-{lost}.pid")), signal.SIGKILL)
        for pid in h.processes(r"slurmstepd|kit_task\.py|resumed\.py"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:  # (the lost node stays down: this is the module's last test)
        proc.kill()
        if lost:  # marked down, as an admin would: the cancelled start on it then ends now, not at its SlurmdTimeout
            slurm.run(f"scontrol update NodeName={lost} State=DOWN Reason=lost-in-the-test", check=False)
    out = "".join(seen) + out
    said = " ".join(out.split())
    assert proc.returncode == 0, out[-4000:] + err[-3000:]
    job, first = re.search(r"^kit: job (\S+) is Slurm job (\d+)", out, re.M).groups()
    assert re.search(rf"kit: job {job} lost {lost} \(its ranks wrote no heartbeat for \d+ s and left no exit line\), "
                     rf"while its other ranks ended; cancelling Slurm job {first} ", said), out[-4000:]
    again = re.search(rf"kit: restart 1 of 1: left out {lost} \(its ranks wrote no heartbeat for \d+ s and left no exit "
                      rf"line(; Slurm says it is not responding)?\); job {job} is Slurm job (\d+) now, on 2 node\(s\), "
                      r"KIT_RESTART=1", said)
    assert again, out[-4000:]
    resumed = re.findall(r"^\[(\S+) rank (\d)\] start 1 ranks 2 step (\d+)$", out, re.M)
    assert sorted(rank for _, rank, _ in resumed) == ["0", "1"] and lost not in {node for node, _, _ in resumed}, out
    assert all(int(step) >= 5 for _, _, step in resumed), resumed  # from the checkpoint, not from the start
    assert re.search(r"^\[\S+ rank 0\] done 40$", out, re.M), out[-3000:]
    assert f"job {job} finished (Slurm job {again[2]}) after 1 restart; left out {lost}" in said, out[-2000:]
    rows = {row["id"]: row for row in map(json.loads, kit_as(slurm, folder, "jobs", "--json").stdout.splitlines())}
    assert (rows[job]["state"], rows[job]["restarts"], rows[job]["left_out"], rows[job]["np"]) == \
        ("succeeded", 1, [lost], 2), rows[job]
    assert f"1 (left out {lost})" in kit_as(slurm, folder, "jobs").stdout
    logs = kit_as(slurm, folder, "logs", job).stdout
    assert f"kit: start 0 of job {job} (KIT_RESTART=0), Slurm job {first}:" in logs and \
        f"kit: start 1 of job {job} (KIT_RESTART=1), Slurm job {again[2]}:" in logs, logs[-3000:]
    assert logs.index("] start 0 ranks 3 step 0") < logs.index("start 1 of job") < logs.index("] start 1 ranks 2 "), logs
    wait_for("no process of the job", lambda: not any(h.processes("resumed.py") for h in slurm.hosts), timeout=60)
