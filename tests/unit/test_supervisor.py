"""The job's supervisor (kit.backends.cluster.supervisor), run here as the primary's container runs it: `python -c SOURCE PLAN`,
apart from any kit, with the cluster SSH replaced by a local shell (the ssh_shim fixture; tests/lab runs it over
the real cluster SSH, with real launchers). Its record, the follower reading it, restarts on the hosts that still
answer, the hang watch, and the discovery script."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kit.backends.cluster import control as jobcontrol
from kit.errors import KitError
from kit.backends.cluster import run as jobs
from kit.jobs.commands.horovod import rank_command
from kit.jobs.commands.launchers import tf_config
from kit.backends.cluster.supervisor import launch, starter
from kit.backends.cluster.supervisor.heartbeats import Beat, hang_report
from kit.backends.cluster.supervisor.launch import (ENV_DIR, MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, NodeCommand,
                                                    Plan, Slot, discovery_script, fill, parse_discovery)
from kit.backends.cluster.supervisor.starter import COPIED, MANIFEST_END

pytestmark = pytest.mark.alone  # timings of a few seconds: tests/run's other stream waits meanwhile

HOSTS = [Slot("a", "10.0.0.1", 1), Slot("b", "10.0.0.2", 1), Slot("c", "10.0.0.3", 1)]


def job_id() -> str:
    return jobs.new_job_id()


def supervise(tmp_path: Path, plan: Plan, timeout: float = 90) -> tuple[subprocess.CompletedProcess, Path]:
    """Write the plan and run the supervisor to its end, as `docker exec -d` starts it; then its folder."""
    folder = Path(plan.folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(plan.dump())
    r = subprocess.run([sys.executable, "-c", jobs.SUPERVISOR, str(folder / "plan.json")], capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, "KIT_SUPERVISOR": plan.id,
                                                        "KIT_PROGRESS_DIR": f"{os.environ['SHIM']}/progress/10.0.0.1"},
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 0, r.stderr
    return r, folder


def tf_plan(tmp_path: Path, job: str, scripts: list[str], hosts=HOSTS, **kw) -> Plan:
    """A tf-style launch: one rank a host, each host's command a script run by kit's rank launcher."""
    workers = [f"{h.address}:0" for h in hosts]
    nodes = [NodeCommand(h.host, h.address, ("env", f"TF_CONFIG={tf_config(workers, i)}",
                                             *rank_command(script, [])), i)
             for i, (h, script) in enumerate(zip(hosts, scripts))]
    return Plan(job, str(tmp_path / "jobs" / job), str(tmp_path), "tf", list(hosts), len(hosts), None, 12345, [],
                [], nodes, **kw)


def leftovers(job: str) -> list[int]:
    """Processes here that still carry the job's mark."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and f"KIT_JOB={job}".encode() in (p / "environ").read_bytes().split(b"\0"):
                found.append(int(p.name))
        except OSError:
            pass
    return found


def test_the_supervisor_records_the_job_and_kit_follows_it_to_its_exit_code(tmp_path, ssh_shim):
    """Every line from the start, the hosts of the ranks, then the exit code of the first failure; a follower whose
    reader went away (kit killed) ends nothing."""
    (tmp_path / "ok.py").write_text("print('from', __import__('os').environ['KIT_JOB'])\n")
    (tmp_path / "fail.py").write_text("import time\ntime.sleep(1)\nprint('failing')\nraise SystemExit(3)\n")
    job = job_id()
    plan = tf_plan(tmp_path, job, ["ok.py", "fail.py", "ok.py"])
    done = threading.Thread(target=supervise, args=(tmp_path, plan))
    done.start()
    follow = shlex.split(jobcontrol.follow_command("kit-lab", plan.folder, job))[-1]
    quitter = subprocess.run(f"sh -c {shlex.quote(follow)} | head -c 0", shell=True, timeout=60)
    lines = subprocess.run(["sh", "-c", follow], capture_output=True, text=True, timeout=60).stdout.splitlines()
    done.join(timeout=90)
    assert quitter.returncode == 0
    assert lines[0] == "@@kit-ranks a b c" and jobcontrol.launch_ranks(lines[0]) == ["a", "b", "c"]
    assert f"[0]<stdout>:from {job}" in lines and "[1]<stdout>:failing" in lines
    assert "b: its processes ended with status 3; stopping the others" in lines
    assert lines[-1] == f"{jobcontrol.END_MARK} 3"
    folder = Path(plan.folder)
    assert (folder / "exit").read_text() == "3\n" and (folder / "ranks").read_text() == "a b c\n"
    assert int((folder / "ended").read_text()) >= int((folder / "started").read_text())
    assert not (folder / "restarts").exists() and not leftovers(job)
    # followed again once it has ended: the whole output at once, and the same code
    assert subprocess.run(["sh", "-c", follow], capture_output=True, text=True, timeout=60).stdout.splitlines() == lines


RESUMING = """\
import os, sys
restart = int(os.environ["KIT_RESTART"])
print("restart", restart, "nodes", sys.argv[1], "rank", sys.argv[2], flush=True)
if restart == 0 and sys.argv[2] == "2":
    open(os.environ["SHIM"] + "/down", "w").write("10.0.0.3\\n")  # its host goes away
    raise SystemExit(3)
"""


def torch_plan(tmp_path: Path, job: str, **kw) -> Plan:
    """A torchrun-style launch (its node count, node rank and store port filled in at each launch), each host's
    command a script that prints them."""
    (tmp_path / "node.py").write_text(RESUMING)
    nodes = [NodeCommand(h.host, h.address, ("python", "-u", str(tmp_path / "node.py"), NNODES, NODE_RANK), None)
             for h in HOSTS]
    return Plan(job, str(tmp_path / "jobs" / job), str(tmp_path), "torchrun", list(HOSTS), 3, 1, 12345, [], [],
                nodes, **kw)


def test_a_job_whose_host_went_away_starts_again_on_the_hosts_that_answer(tmp_path, ssh_shim):
    job = job_id()
    r, folder = supervise(tmp_path, torch_plan(tmp_path, job, restarts=1, min_np=2))
    out = (folder / "output.log").read_text()
    assert (folder / "exit").read_text() == "0\n", out
    assert "restart 0 nodes 3 rank 2" in out and "restart 1 nodes 2 rank 1" in out and "restart 1 nodes 2 rank 2" not in out
    assert "kit: restart 1 of 1: left out c (no answer); 2 processes on a, b, KIT_RESTART=1" in out
    assert out.count("@@kit-ranks") == 2 and "@@kit-ranks a b\n" in out
    assert (folder / "restarts").read_text() == "1\n" and (folder / "left_out").read_text() == "c\n"
    assert not (folder / "phase").exists() and not leftovers(job)


def test_no_restart_below_min_np_and_none_left(tmp_path, ssh_shim):
    job = job_id()
    r, folder = supervise(tmp_path, torch_plan(tmp_path, job, restarts=1, min_np=3))
    out = (folder / "output.log").read_text()
    assert (folder / "exit").read_text() == "3\n"
    assert "kit: cannot start the job again: 2 processes fit on the hosts that answer (a, b), and --min-np is 3" in out
    job = job_id()
    (ssh_shim / "down").unlink()
    r, folder = supervise(tmp_path, torch_plan(tmp_path, job, restarts=0))
    assert (folder / "exit").read_text() == "3\n" and "kit: restart" not in (folder / "output.log").read_text(), (folder / "output.log").read_text()


def test_a_stopped_job_is_not_started_again(tmp_path, ssh_shim):
    (tmp_path / "wait.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    job = job_id()
    plan = tf_plan(tmp_path, job, ["wait.py"] * 3, restarts=2)
    done = threading.Thread(target=supervise, args=(tmp_path, plan))
    done.start()
    folder = Path(plan.folder)
    for _ in range(200):
        if (folder / "output.log").exists() and (folder / "output.log").read_text().count("up") == 3:
            break
        time.sleep(0.1)
    subprocess.run(["sh", "-c", shlex.split(jobcontrol.interrupt_command("c", str(folder), job))[-1]], check=True,
                   timeout=30)
    done.join(timeout=60)
    assert (folder / "exit").read_text() == "130\n" and not (folder / "restarts").exists()
    assert not leftovers(job)


WAIT = "import threading\n\ndef collective():\n    threading.Event().wait()\n\ncollective()\n"
SLEEP = "import time\n\ndef blocked():\n    time.sleep(600)\n\nblocked()\n"


def test_a_hang_is_found_named_and_stopped_with_every_ranks_stack(tmp_path, ssh_shim):
    """Three ranks that stop moving, one of them elsewhere: the supervisor names that one, keeps a stack for each
    rank and stops the job everywhere."""
    (tmp_path / "wait.py").write_text(WAIT)
    (tmp_path / "sleep.py").write_text(SLEEP)
    job = job_id()
    started = time.monotonic()
    r, folder = supervise(tmp_path, tf_plan(tmp_path, job, ["wait.py", "wait.py", "sleep.py"], hang_timeout=6))
    hang = (folder / "hang").read_text().strip()
    assert hang.startswith("no rank has made progress for ") and time.monotonic() - started < 60
    assert ": rank 2 on c is at sleep.py:4 in blocked; the other 2 ranks wait at " in hang
    assert hang.endswith(" in wait (from wait.py:4 in collective)") and "/threading.py:" in hang
    assert f"kit: {hang}. Every rank's stack: {folder}/stacks; stopping the job" in (folder / "output.log").read_text()
    assert sorted(p.name for p in (folder / "stacks").iterdir()) == ["rank-0.txt", "rank-1.txt", "rank-2.txt"]
    assert (folder / "stacks" / "rank-2.txt").read_text().startswith("rank 2 on c\n")
    assert (folder / "exit").read_text() != "0\n" and not leftovers(job)
    assert not any((ssh_shim / "progress").glob(f"*/{job}"))  # the heartbeats went with the ranks


def test_a_job_that_keeps_moving_is_not_hung(tmp_path, ssh_shim):
    """Steps of Python work (longer than the interpreter's 5 ms switch interval, so the heartbeat sees them), each
    followed by a wait at the same line. A step that is one native call holding the GIL is not seen: README says so."""
    (tmp_path / "busy.py").write_text("import time\nend = time.time() + 9\nwhile time.time() < end:\n"
                                      "    total = 0\n    for i in range(200000):\n        total += i\n"
                                      "    time.sleep(0.01)\n")
    job = job_id()
    r, folder = supervise(tmp_path, tf_plan(tmp_path, job, ["busy.py"] * 2, hosts=HOSTS[:2], hang_timeout=5))
    assert (folder / "exit").read_text() == "0\n" and not (folder / "hang").exists()


STEPS = """import glob, json, os, random, time
import kit_pace
busy = 0.2 if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 2 else 0.09   # host c's rank computes longer
end = time.monotonic() + 15
while time.monotonic() < end and not glob.glob("jobs/*/straggler"):   # (until kit has named one: the test is done)
    total = 0
    began = time.monotonic()
    while time.monotonic() - began < busy * random.uniform(0.9, 1.1):   # compute (Python work, seen moving)
        total += 1
    with kit_pace.comm():                     # the allreduce: the fast ranks wait for the slow one
        time.sleep(0.23 - busy)
    kit_pace.step()
"""


def test_a_host_whose_ranks_are_busier_than_the_others_is_named_a_straggler_once(tmp_path, ssh_shim):
    """Three ranks step together (0.23 s a step); host c's computes 0.2 s of it, the others 0.09 s and wait: c is
    named, once, in the job's output and its record, with what its rank does most (a window of 4 s here: the
    heartbeats read every second, each rank's figures over the last 4 s)."""
    (tmp_path / "steps.py").write_text(STEPS)
    job = job_id()
    r, folder = supervise(tmp_path, tf_plan(tmp_path, job, ["steps.py"] * 3, hang_timeout=6, pace_window=4))
    assert (folder / "exit").read_text() == "0\n", (folder / "output.log").read_text()[-2000:]
    said = [line for line in (folder / "output.log").read_text().splitlines() if "straggler" in line]
    assert len(said) == 1 and re.fullmatch(r"kit: straggler: host c \(rank 2\) 2\.\dx slower than the others for \d+ "
                                           r"s; its rank computes [89]\d% of the time", said[0]), said
    assert (folder / "straggler").read_text().strip() == said[0].removeprefix("kit: ")


FORGER = """import json, os, threading, time
import kit_pace
forger = json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0   # host a's rank lies about ranks it is not


def forge():
    folder = os.path.join(os.environ["KIT_PROGRESS_DIR"], os.environ["KIT_JOB"])
    began = time.monotonic()
    while True:
        t = time.monotonic() - began
        for rank in (1, 5, 6, 7, 8, 9):   # another host's rank, and ranks the job does not have: all busy 1 ms a step
            with open(os.path.join(folder, str(rank)), "w") as f:
                json.dump(dict(rank=rank, pid=os.getpid(), moves=int(t * 10), where="forged.py:1 in x\\nkit: all is "
                               "well", t=t, steps=int(t * 100), data_s=0.0, comm_s=t * 0.99), f)
        time.sleep(0.2)


if forger:
    threading.Thread(target=forge, daemon=True).start()
end = time.monotonic() + 9
while time.monotonic() < end:
    began = time.monotonic()
    while time.monotonic() - began < 0.09:   # every rank computes alike: nobody is slow
        pass
    with kit_pace.comm():
        time.sleep(0.14)
    kit_pace.step()
"""


def test_a_rank_that_writes_heartbeats_for_other_or_made_up_ranks_names_no_host_a_straggler(tmp_path, ssh_shim):
    """Host a's rank writes heartbeats for ranks 5-9 (the job has 3) and for b's rank 1, each 1 ms busy a step: read
    as they were, a's figure fell to nothing and b and c were twice the others. Only each rank's own host's
    heartbeat of it counts, so nobody is named."""
    (tmp_path / "forger.py").write_text(FORGER)
    job = job_id()
    r, folder = supervise(tmp_path, tf_plan(tmp_path, job, ["forger.py"] * 3, hang_timeout=6, pace_window=3))
    assert (folder / "exit").read_text() == "0\n", (folder / "output.log").read_text()[-2000:]
    assert not (folder / "straggler").exists(), (folder / "straggler").read_text()
    assert "straggler" not in (folder / "output.log").read_text()


def test_only_each_ranks_own_hosts_heartbeat_of_it_counts_and_where_prints_on_one_line():
    from kit.backends.cluster.supervisor.heartbeats import parse_beats, placed
    (beat,) = parse_beats("a", json.dumps(dict(rank=0, moves=1, where="x.py:1 in f\nkit: job 7 finished\r\x1b[2J")))
    assert beat.where == "x.py:1 in f?kit: job 7 finished??[2J"
    beats = [Beat("a", 0, 1, "x"), Beat("a", 1, 1, "x"), Beat("a", 7, 1, "x"), Beat("b", 1, 2, "y"),
             Beat("b", 1, 3, "z"), Beat("c", -1, 1, "x")]
    assert placed(beats, ["a", "b", "c"]) == [Beat("a", 0, 1, "x"), Beat("b", 1, 2, "y")]


def test_a_heartbeat_being_written_is_read_once(tmp_path):
    from kit.backends.cluster.supervisor.heartbeats import parse_beats, progress_script
    folder = tmp_path / "j1"
    folder.mkdir()
    (folder / "0").write_text('{"rank": 0, "pid": 1, "moves": 3, "where": "t.py:1 in f"}')
    (folder / "0.new").write_text('{"rank": 0, "pid": 1, "moves": 4, "where": "t.py:2 in f"}')
    (folder / "1").write_text("junk a rank wrote")
    out = subprocess.run(["sh", "-c", progress_script("j1")], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "KIT_PROGRESS_DIR": str(tmp_path)}).stdout
    assert parse_beats("a", out) == [Beat("a", 0, 3, "t.py:1 in f")]


def test_the_hang_report_names_the_odd_ones():
    beats = [Beat("a", 0, 5, "mpi_ops.py:90 in synchronize"), Beat("b", 1, 5, "mpi_ops.py:90 in synchronize"),
             Beat("c", 2, 3, "train.py:40 in main")]
    assert hang_report(beats, 600) == ("no rank has made progress for 600 s: rank 2 on c is at train.py:40 in main; "
                                       "the other 2 ranks wait at mpi_ops.py:90 in synchronize")
    assert hang_report(beats[:2], 60) == "no rank has made progress for 60 s: all 2 ranks wait at mpi_ops.py:90 in synchronize"
    assert hang_report([], 60) == "no rank has started in 60 s"
    tie = [Beat("a", 0, 5, "train.py:12 in save_ckpt"), Beat("b", 1, 5, "mpi_ops.py:90 in synchronize")]
    assert hang_report(tie, 60) == ("no rank has made progress for 60 s: rank 0 on a is at train.py:12 in save_ckpt; "
                                    "rank 1 on b is at mpi_ops.py:90 in synchronize")  # no majority: none blamed


def test_a_host_whose_heartbeats_were_not_read_is_no_progress():
    from kit.backends.cluster.supervisor.heartbeats import Watch
    watch = Watch(600)
    both = [Beat("a", 0, 5, "x"), Beat("b", 1, 7, "y")]
    watch.stalled(both)
    watch.since -= 700  # as if the last move was long ago
    assert watch.stalled(both[:1]) and watch.stalled(both)  # b unread, then read again unchanged: still quiet
    assert not watch.stalled([Beat("a", 0, 6, "x"), both[1]])  # a moved


def test_the_discovery_script_lists_the_hosts_that_answer_in_order(tmp_path, ssh_shim):
    """Generated from the cluster's hosts; horovodrun's --host-discovery-script format (address:slots)."""
    hosts = [Slot("a", "10.0.0.1", 2), Slot("b", "10.0.0.2", 1), Slot("c", "10.0.0.3", 4)]
    script = tmp_path / "discover"
    script.write_text(discovery_script(hosts))
    script.chmod(0o755)
    assert subprocess.run([str(script)], capture_output=True, text=True, timeout=30).stdout == \
        "10.0.0.1:2\n10.0.0.2:1\n10.0.0.3:4\n"
    (ssh_shim / "down").write_text("10.0.0.2\n")
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=30).stdout
    assert out == "10.0.0.1:2\n10.0.0.3:4\n" and parse_discovery(out, hosts) == [hosts[0], hosts[2]]
    assert sorted(set(line.split()[1] for line in (ssh_shim / "calls").read_text().splitlines())) == ["true"]
    assert "'10.0.0.2'" in discovery_script(hosts) or " 10.0.0.2 " in discovery_script(hosts)


def test_placeholders_are_filled_in_torchruns_options_only():
    node = NodeCommand("a", "10.0.0.1", ("torchrun", f"--nnodes={NNODES}", f"--node-rank={NODE_RANK}",
                                         f"--master-port={MASTER_PORT}", "--no-python", "python", "t.py", NNODES), None)
    assert fill(node, {NNODES: "2", NODE_RANK: "1", MASTER_PORT: "29500"}).argv == (
        "torchrun", "--nnodes=2", "--node-rank=1", "--master-port=29500", "--no-python", "python", "t.py", NNODES)


def test_a_plan_survives_its_file():
    plan = Plan(
        "j1", "/f", "/w", "torchrun", list(HOSTS), 3, 2, 12345, ["eth0"], ["python", "t.py"],
        [NodeCommand("a", "10.0.0.1", ("x",), None)], restarts=2, min_np=2, hang_timeout=30)
    assert Plan.load(plan.dump()) == plan
    assert json.loads(plan.dump())["hosts"][0] == {"host": "a", "address": "10.0.0.1", "slots": 1, "train": ""}


@pytest.mark.parametrize("hosts, np", [(HOSTS, 3), (HOSTS[:2], 2)])
def test_a_horovod_launch_on_the_hosts_that_answer(hosts, np):
    plan = Plan("j1", "/f", "/w", "horovod", list(HOSTS), 3, None, 2222, ["eth0"], ["--start-timeout", "60", "python", "t.py"], [])
    argv, ranks = plan.launch(list(hosts), "0")
    assert argv[:6] == ["horovodrun", "--gloo", "-np", str(np), "-H", ",".join(f"{h.address}:1" for h in hosts)]
    assert ranks == [h.host for h in hosts]


STORE = """\
import os, sys
restart, nodes, rank, store = int(os.environ["KIT_RESTART"]), *sys.argv[1:]
print("restart", restart, "nodes", nodes, "rank", rank, "store", store, flush=True)
if restart == 0 and rank == "0":
    open(os.environ["SHIM"] + "/down", "w").write("10.0.0.2\\n")  # node 0's host goes away
    raise SystemExit(3)
"""


def test_a_torchrun_job_on_hosts_without_the_supervisors_has_its_store_on_node_0_also_after_a_restart(tmp_path,
                                                                                                      ssh_shim):
    """`kit run -H b,c` on a cluster whose primary, where the supervisor runs, is a: node 0 (b) holds the store, on a
    port found free there; when b goes away, the restart makes c node 0 and the store's host; a runs none of it."""
    (tmp_path / "node.py").write_text(STORE)
    hosts = HOSTS[1:]
    nodes = [NodeCommand(h.host, h.address, ("python", "-u", str(tmp_path / "node.py"), NNODES, NODE_RANK,
                                             f"{MASTER_ADDR}:{MASTER_PORT}"), None) for h in hosts]
    job = job_id()
    plan = Plan(job, str(tmp_path / "jobs" / job), str(tmp_path), "torchrun", list(hosts), 2, 1, 12345, [], [],
                nodes, restarts=1, min_np=1, here="10.0.0.1")
    r, folder = supervise(tmp_path, plan)
    out = (folder / "output.log").read_text()
    assert (folder / "exit").read_text() == "0\n", out
    assert re.search(r"restart 0 nodes 2 rank 0 store 10\.0\.0\.2:\d+\n", out), out
    assert re.search(r"restart 1 nodes 1 rank 0 store 10\.0\.0\.3:\d+\n", out), out
    assert "kit: restart 1 of 1: left out b (no answer); 1 processes on c, KIT_RESTART=1" in out
    calls = (ssh_shim / "calls").read_text().splitlines()
    asked = [c.split()[0] for c in calls if "socket.socket()" in c]
    assert asked == ["10.0.0.2", "10.0.0.3"]  # each launch's node 0, for its store's port
    assert not [c for c in calls if c.startswith("10.0.0.1 ")] and not leftovers(job)


DOCKER_SHIM = r"""#!/bin/bash
# `docker exec [-i|-d] [-e X=Y]... CONTAINER COMMAND...` run here: the unit tests of kit's side of a job
[ "$1" = exec ] || exit 64
shift
detach=
while [ $# -gt 0 ]; do case "$1" in -i|-t) shift;; -d) detach=1; shift;; -e) export "$2"; shift 2;; -w) shift 2;; *) break;; esac; done
shift  # the container
export LANG=C.UTF-8 LC_ALL=C.UTF-8  # the image's locale (kit runs commands in C)
[ -z "$detach" ] || { setsid "$@" </dev/null >/dev/null 2>&1 & exit 0; }  # apart, as the engine starts it
exec "$@"
"""


@pytest.fixture
def docker_shim(ssh_shim: Path) -> Path:
    (ssh_shim / "docker").write_text(DOCKER_SHIM)
    (ssh_shim / "docker").chmod(0o755)
    return ssh_shim


def local_job(tmp_path: Path, scripts: list[str], **kw):
    """A tf-style job on the three stand-in hosts, its workspace tmp_path/ws (one folder: the hosts share this
    machine), kit's folders under tmp_path/kit, each host reached by a LocalRunner through the docker shim."""
    from kit.config.hosts import Host
    from kit.cluster.place import Place
    from kit.runners.local import LocalRunner
    from kit.cluster.state import ClusterState, HostState
    from kit.cluster.steps.node import Node
    workspace = tmp_path / "ws"
    workspace.mkdir()  # (kit up makes it on every host)
    plan = tf_plan(workspace, "-", scripts)
    hosts = [HostState(h.host, h.address, Place(f"kit-lab-{i}", str(tmp_path / "kit")), primary=i == 1)
             for i, h in enumerate(HOSTS, 1)]
    state = ClusterState("lab", "img:1", "sha256:abc", 12345, str(workspace), hosts=hosts)
    job = jobs.Job(job_id(), state, 3, tuple(HOSTS), (), (), launcher="tf", fanout=tuple(plan.nodes),
                   placed=tuple(HOSTS), **kw)
    nodes = [Node(Host(h.name, primary=h.primary), LocalRunner(h.name), h.place, address=h.address) for h in hosts]
    return job, nodes


WRITER = "import os\nopen('out-%s.txt' % os.environ['TF_CONFIG'][-3:-2], 'w').write(str(os.getsid(0)))\n"


def test_kit_copies_the_job_starts_its_supervisor_apart_and_follows_it_to_its_ending(tmp_path, docker_shim,
                                                                                    monkeypatch):
    """kit's side and the container's, run here: the job's folder copied (the primary's copy inside the conversation
    that starts the job), the supervisor in a session of its own, the output followed to its exit code, then what
    the supervisor recorded at the end: nothing left to reap, and each host's workspace for the spread."""
    monkeypatch.setenv("KIT_PROGRESS_DIR", f"{docker_shim}/progress/10.0.0.1")
    src = tmp_path / "src"
    src.mkdir()
    (src / "write.py").write_text(WRITER)
    job, nodes = local_job(tmp_path, ["write.py"] * 3)
    assert job.plan().spread and not job.plan().primary  # copy storage on three hosts, the primary one of them
    seen = []
    synced, starting = jobs.copy_and_start(job, nodes, src, lambda s: (f"copied {sum(s.sent.values())}",),
                                           follow=True)
    # (the three stand-in hosts share one folder: which of them found write.py there already is a race)
    assert set(synced.sent) == {"a", "b", "c"} and sum(synced.sent.values()) >= 1
    assert all(set(synced.manifests[h]) == {"write.py"} for h in "abc")
    outcome = jobs.follow_to_end(nodes, job.id, job.ranks_hosts(), lambda *line: seen.append(line), starting)
    assert outcome.exit_code == 0 and outcome.failure is None and outcome.leftovers == {} and not leftovers(job.id)
    assert seen[0] == (None, None, f"kit: copied {sum(synced.sent.values())}")
    assert set(outcome.after) == {"a", "b", "c"} and {"out-0.txt", "write.py"} <= set(outcome.after["a"])
    folder = Path(job.folder)
    assert (folder / "exit").read_text() == "0\n" and json.loads((folder / "plan.json").read_text())["id"] == job.id
    sessions = {int((tmp_path / "ws" / f"out-{i}.txt").read_text()) for i in range(3)}
    assert os.getsid(0) not in sessions  # the job ran in a session of its own, not kit's


def test_a_job_that_cannot_be_copied_to_every_host_does_not_start(tmp_path, docker_shim):
    """Host c does not answer the cluster SSH: kit says so, naming it, and the primary's starter removes the job's
    folder and the variables, its own and those it gave b; nothing ran."""
    (docker_shim / "down").write_text("10.0.0.3\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "write.py").write_text(WRITER)
    job, nodes = local_job(tmp_path, ["write.py"] * 3, env=(("SECRET_TOKEN", "v"),))
    env_dir = Path(ENV_DIR)
    with pytest.raises(Exception) as e:
        jobs.copy_and_start(job, nodes, src, lambda s: ("x",), follow=True)
    assert list(e.value.failures) == ["c"] and "Connection refused" in e.value.failures["c"].message
    for _ in range(50):  # (the starter sees its input end a moment after kit closes it)
        if not Path(job.folder).exists():
            break
        time.sleep(0.1)
    assert not Path(job.folder).exists() and not (env_dir / job.id).exists()
    assert not list((tmp_path / "ws").glob("out-*.txt"))


def test_no_job_starts_where_an_earlier_jobs_end_did_not_settle_until_a_sweep_finds_nothing(tmp_path, docker_shim):
    """A host marked by a sweep that did not settle (launch.UNSETTLED/<job>): the next job does not start, and says
    which job and what was still being stopped, with the fix; a sweep of that job that stops nothing takes the mark
    away, and the job starts."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "write.py").write_text(WRITER)
    job, nodes = local_job(tmp_path, ["write.py"] * 3)
    earlier = "20261203-120000-dead"
    mark = Path(launch.UNSETTLED) / earlier
    subprocess.run(["sh", "-c", launch.unsettled_mark(earlier, "4242:sh 4243:ssh")], check=True)
    try:
        assert mark.read_text() == f"{earlier} 4242:sh 4243:ssh\n"
        with pytest.raises(KitError) as e:
            jobs.copy_and_start(job, nodes, src, lambda s: ("x",), follow=True)
        said = f"{e.value.message} {e.value.output_tail}"
        assert f"the end of job {earlier} did not settle here (still stopping: {earlier} 4242:sh 4243:ssh)" in said
        assert f"`kit stop {earlier}` finds nothing of it" in said and not Path(job.folder).exists()
        swept = jobcontrol.sweep(nodes, earlier, strict=True)
        assert swept.killed == {} and swept.unsettled == {} and not mark.exists()
        synced, starting = jobs.copy_and_start(job, nodes, src, lambda s: ("x",), follow=True)
        assert jobs.follow_to_end(nodes, job.id, job.ranks_hosts(), lambda *line: None, starting).exit_code == 0
    finally:
        mark.unlink(missing_ok=True)
        if not any(mark.parent.iterdir()):
            mark.parent.rmdir()   # (as this test found it: kit's containers have their own /run/kit)


def test_a_file_name_the_job_left_in_the_workspace_cannot_answer_kit_for_the_starter(tmp_path, docker_shim):
    """A job leaves a file whose name holds a line of the starter's own (`@@kit-copied failed: ...`): the starter's
    listing of the workspace escapes the name as sha256sum does (one line), so the next job is copied and started as
    ever, and the file is listed by its name."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "write.py").write_text(WRITER)
    job, nodes = local_job(tmp_path, ["write.py"] * 3)
    planted = f"x\n{MANIFEST_END}\n{COPIED} failed: planted"
    (tmp_path / "ws" / planted).write_text("")
    synced, starting = jobs.copy_and_start(job, nodes, src, lambda s: ("x",), follow=True)
    outcome = jobs.follow_to_end(nodes, job.id, job.ranks_hosts(), lambda *line: None, starting)
    assert outcome.exit_code == 0 and synced.sent["a"] == 1
    assert synced.manifests["a"][planted] == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


UNPACK = """
import io, os, sys, tarfile
sys.path.insert(0, sys.argv[2])
from kit.backends.cluster.supervisor import starter
ws = sys.argv[1]
open(os.path.join(ws, "d"), "w").close()  # a file where the job's folder d goes: tar cannot write any file of it
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as t:
    for i in range(3000):
        blob = os.urandom(1024)
        info = tarfile.TarInfo("d/file-%05d" % i)
        info.size = len(blob)
        t.addfile(info, io.BytesIO(blob))
data = buf.getvalue()
inp = io.BytesIO(data + b'{"go": []}\\n')
print(starter.unpack(inp, len(data), ws))
print(inp.readline().decode(), end="")
"""


def test_the_starter_says_why_the_job_could_not_be_unpacked_however_much_tar_complains(tmp_path):
    """3 MB of the job's files and a complaint from tar for each of them (as on a full disk): tar is fed to the end,
    the answer is the end of its complaints, and the conversation goes on with the next message."""
    r = subprocess.run([sys.executable, "-c", UNPACK, str(tmp_path), str(Path(jobs.__file__).parent.parent)],
                       capture_output=True, text=True, timeout=60)
    said, after = r.stdout.splitlines()
    assert said.startswith(f"{COPIED} failed: ") and "d/file-02999: Cannot open: Not a directory" in said
    assert len(said) < 2100 and after == '{"go": []}'


def test_a_supervisor_that_does_not_start_is_said(tmp_path):
    from kit.backends.cluster.supervisor.starter import started
    assert started(str(tmp_path), wait=0.3) == "it did not start within 0 s"
    (tmp_path / "supervisor").write_text("42\n")
    assert started(str(tmp_path), wait=0.3) == ""


def test_what_a_rank_could_write_in_the_ending_is_read_strictly():
    assert jobcontrol.parse_reaped("a 3\nb x\n 4\nc 2 1\nd ²\n") == {"a": 3, "c 2": 1}
    assert jobcontrol.parse_after('{"a": "1234  ./x\\n"}') == {"a": {"x": "1234"}}
    for forged in ("[1]", '{"a": 1}', "{", '{"a": ["x"]}'):
        assert jobcontrol.parse_after(forged) is None
    ending = jobcontrol.parse_ending(["@@hang", "no rank moved", "@@nosuch", "x", "@@reaped", "a 1"])
    assert ending == {"hang": "no rank moved\n@@nosuch\nx", "reaped": "a 1"}


ODD_NAMES = ["logs\\run1.txt", "a\nb", "c\rd", "e\u2028" + "0" * 64 + "  write.py"]


def test_a_file_name_with_a_backslash_or_a_line_break_is_one_file_to_the_starter_and_to_sha256sum(tmp_path):
    """The primary's workspace before a job is the starter's listing, after it sha256sum's (MANIFEST): a job that
    wrote `logs\\run1.txt` (a Windows path on Linux) or a name with a line break must read as the same file in both,
    by its real name, or the spread copies a name that does not exist, and fails, after every later job. A name
    holding a line separator of Python's (U+2028) and a manifest line is no second line."""
    for i, name in enumerate(ODD_NAMES):
        (tmp_path / name).write_text(str(i))
    listed = subprocess.run(["sh", "-c", launch.MANIFEST.format(workspace=shlex.quote(str(tmp_path)))],
                            capture_output=True, check=True).stdout.decode()
    before, after = jobs.workspace.parse_manifest(starter.manifest(str(tmp_path))), \
        jobs.workspace.parse_manifest(listed)
    assert before == after and sorted(after) == sorted(ODD_NAMES)
    assert jobs.workspace.spread_plan({"a": before, "b": {}}, {"a": after, "b": {}}) == {}  # nothing was written


def test_a_file_name_that_is_not_utf8_on_another_host_does_not_stop_the_next_job(tmp_path, docker_shim):
    """A job left a file whose name is not UTF-8 (a dataset unzipped from cp437) in the workspace of its hosts: the
    starter still reads those workspaces and the next job starts."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "write.py").write_text(WRITER)
    job, nodes = local_job(tmp_path, ["write.py"] * 3)
    (tmp_path / "ws").joinpath(os.fsdecode(b"caf\xe9.txt")).write_text("x")
    synced, starting = jobs.copy_and_start(job, nodes, src, lambda s: ("x",), follow=True)
    outcome = jobs.follow_to_end(nodes, job.id, job.ranks_hosts(), lambda *line: None, starting)
    assert outcome.exit_code == 0 and set(synced.manifests) == {"a", "b", "c"}


def test_a_starter_whose_kit_went_away_while_it_answered_leaves_nothing_of_the_job(tmp_path, ssh_shim):
    """kit's link dropped while the starter gave the other hosts their part (its answer finds no reader): nothing
    starts, and the job's folder and variables go, here and on the host that was given them, as at the end of its
    input."""
    job = job_id()
    folder, ws = tmp_path / "jobs" / job, tmp_path / "ws"
    ws.mkdir()
    request = {"folder": str(folder), "files": {"plan.json": "{}"}, "env": {}, "source": jobs.SUPERVISOR,
               "follow": None, "workspace": str(ws), "env_file": "SECRET_TOKEN=v\n",
               "hosts": [{"name": "b", "address": "10.0.0.2"}], "job_files": {}, "copy": False}
    starter = subprocess.Popen([sys.executable, "-c", jobs.SUPERVISOR, "--start"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    starter.stdin.write(json.dumps(request).encode() + b"\n")
    starter.stdin.flush()
    assert starter.stdout.readline().decode().startswith(MANIFEST_END)
    starter.stdout.close()  # kit is gone
    starter.stdin.write(b'{"others": true}\n')
    starter.stdin.flush()
    try:
        starter.wait(timeout=30)
    finally:
        starter.kill()
    assert "10.0.0.2 umask 077" in (ssh_shim / "calls").read_text()  # b was given the variables...
    assert not (Path(ENV_DIR) / job).exists() and not folder.exists()  # ... and they are gone, as the folder


def test_a_launchers_ssh_rides_the_supervisors_connection_and_never_opens_one():
    """The cluster's client config (kit up writes it) names the supervisor's ControlPath with ControlMaster no:
    horovodrun's SSH rounds ride a connection kit keeps open, and none carries a job's mark beyond the job."""
    import re

    from kit.image.recipe import render_template
    config = render_template("ssh_config.j2", cluster="lab", port=12345, hosts=[(["a"], "10.0.0.1")], all_names=["a"])
    path = next(o for o in launch.CONNECTION if o.startswith("ControlPath=")).split("=", 1)[1]
    assert re.search(rf"^\s+ControlPath {re.escape(path)}$", config, re.M)
    assert re.search(r"^\s+ControlMaster no$", config, re.M) and "ControlPersist" not in config


def test_what_a_rank_writes_under_the_supervisors_names_is_not_read_as_its_end(tmp_path, ssh_shim):
    """A rank can write its job's folder: hosts named as left out (whose outputs kit would then not spread), a hang,
    restarts, an after.json. The supervisor writes each of those last, as it recorded them (empty when it did not)."""
    job = job_id()
    folder = tmp_path / "jobs" / job
    forge = "".join(f"open({str(folder / name)!r}, 'w').write({text!r})\n" for name, text in
                    (("left_out", "b c"), ("hang", "rank 1 hung"), ("restarts", "7"), ("env_kept", "10.0.0.9"),
                     ("after.json", '{"b": ""}')))
    (tmp_path / "forge.py").write_text(forge)
    r, folder = supervise(tmp_path, tf_plan(tmp_path, job, ["forge.py"] * 2, hosts=HOSTS[:2]))
    assert (folder / "exit").read_text() == "0\n"
    assert [n for n in ("left_out", "hang", "restarts", "env_kept", "after.json") if (folder / n).exists()] == []
    assert (folder / "reaped").exists()  # what the supervisor did record stays


class Answers:
    """A host's runner that answers every command with the same result (the reap's docker exec), or, given later
    counts, a reap's first round with it and each round after with the next count (the last repeated)."""

    def __init__(self, host: str, code: int, stdout: str = "", stderr: str = "", later: tuple[int, ...] = ()) -> None:
        self.host, self.answer, self.later, self.rounds = host, (code, stdout, stderr), list(later), 0
        self.commands: list[str] = []

    def run(self, command: str, timeout: float | None = None, **kw):
        from kit.runners.base import Result
        self.rounds += 1
        self.commands.append(command)
        if self.rounds > 1 and self.later:
            return Result(self.host, command, 0, f"{self.later[min(self.rounds - 2, len(self.later) - 1)]}\n", "")
        return Result(self.host, command, *self.answer)


def test_a_reap_that_failed_on_a_host_names_it_and_is_never_a_count_of_none():
    """kit stop's last step: a host where the reap could not run is an error naming the host and docker's words, not
    `nothing was left to kill` (a job's ranks went on there once, and kit said so); a host whose container no longer
    runs has nothing left of the job."""
    from kit.errors import HostsFailed
    from kit.config.hosts import Host
    from kit.cluster.place import Place
    from kit.cluster.steps.node import Node
    place = Place("kit-lab", "/var/lib/kit/lab")
    def nodes():
        return [Node(Host("a"), Answers("a", 0, "2\n", later=(0,)), place),
                Node(Host("b"), Answers("b", 1, stderr="Error response from daemon: container 1f2e is not running"), place),
                Node(Host("c"), Answers("c", 126, stderr="OCI runtime exec failed: exec failed: unable to start"), place)]
    with pytest.raises(HostsFailed) as e:
        jobcontrol.sweep(nodes(), "j1", strict=True)
    assert list(e.value.failures) == ["c"] and "OCI runtime exec failed" in str(e.value.failures["c"].output_tail)
    assert jobcontrol.sweep(nodes()[:2], "j1", strict=True).killed == {"a": 2}
    assert jobcontrol.sweep(nodes(), "j1").killed == {"a": 2}  # the end of a job whose supervisor did not end it: what it can


def test_a_sweep_goes_round_again_while_a_round_stopped_something_for_a_bounded_time_and_names_what_did_not_settle():
    """A process a job started on host b over SSH from a process on host a is that sshd's connection's child until
    the client on a is stopped, and only then adopted on b: b's first round may come too soon. So the sweep goes
    round every host again while a round stopped something, for a bounded time (not a count of rounds, which a
    longer chain outlasted); a host that still had something to stop at the bound is named with what, and marked."""
    from kit.config.hosts import Host
    from kit.cluster.place import Place
    from kit.cluster.steps.node import Node
    place = Place("kit-lab", "/var/lib/kit/lab")
    client, chained = Answers("a", 0, "1\n", later=(0,)), Answers("b", 0, "0\n", later=(1, 0))
    assert jobcontrol.sweep([Node(Host("a"), client, place), Node(Host("b"), chained, place)], "j1").killed == \
        {"a": 1, "b": 1}
    assert client.rounds == chained.rounds == 3  # the chain's client; its process, adopted; nothing: the end
    endless = Answers("a", 0, "1\nkilled: 77:sh\n", later=("1\nkilled: 77:sh",))  # (always something to stop)
    started = time.monotonic()
    swept = jobcontrol.sweep([Node(Host("a"), endless, place)], "j1", bound=1.0)
    assert 1.0 <= time.monotonic() - started < 5 and endless.rounds > 3
    assert swept.unsettled == {"a": "77:sh"} and swept.killed == {"a": endless.rounds - 1}   # (the last: the mark)
    assert launch.UNSETTLED in endless.commands[-1] and "'j1 77:sh'" in endless.commands[-1]
