"""`kit jobs` and `kit stop`: what a job's folder records, the state kit reads from it, and the reader that runs
in the primary's container (run here on a folder of the same files)."""

import os
import shlex
import subprocess
import sys
import time

import pytest

from kit.backends.cluster import control as jobcontrol
from kit.backends.cluster import records as jobrecords
from kit.jobs import model
from kit.backends.cluster import run as jobs
from kit.backends.cluster.records import RECORDS_SCRIPT, Record


def record(**kw) -> Record:
    base = dict(id="20261123-194512-ab12", launcher="horovod", hosts=("a", "b"), started=100, ended=None,
                exit_code=None, stopped=False, alive=True)
    return Record(**{**base, **kw})


@pytest.mark.parametrize("kw, state", [
    (dict(), "running"),
    (dict(stopped=True), "stopping"),
    (dict(alive=False, ended=160, exit_code=0), "succeeded"),
    (dict(alive=False, ended=160, exit_code=3), "failed"),
    (dict(alive=False, ended=160, exit_code=130, stopped=True), "stopped"),
    (dict(alive=False, ended=160, exit_code=0, stopped=True), "stopped"),  # asked to stop as it ended
    (dict(alive=False), "lost"),                                            # no launcher, no end: container gone
    (dict(alive=False, stopped=True), "stopped"),                           # stopped before it recorded its end
    (dict(alive=False, started=None, planned=True), "pending"),            # planned, its supervisor not up yet
    (dict(restarting=True, restarts=1), "restarting"),                      # between two launches
    (dict(restarts=1, left_out=("c",)), "running"),                         # launched again, on fewer hosts
    (dict(alive=False, ended=160, exit_code=0, restarts=1), "succeeded"),  # after a restart
    (dict(alive=False, ended=160, exit_code=130, hang="no rank has made progress"), "failed"),  # hung, stopped
    (dict(restarting=True, stopped=True), "stopping"),                      # kit stop between two launches
])
def test_the_state_of_a_job(kw, state):
    assert record(**kw).state == state and state in jobrecords.STATES


def test_duration_runs_until_the_end():
    assert record().seconds(now=190.5) == 90
    assert record(ended=130, exit_code=0, alive=False).seconds(now=999) == 30
    assert record(started=None).seconds(now=999) is None


def run_reader(root) -> list[Record]:
    r = subprocess.run([sys.executable, "-c", RECORDS_SCRIPT, str(root), "last"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    return sorted((Record.parse(line) for line in r.stdout.splitlines()), key=lambda rec: rec.id)


def write(folder, **files):
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_the_reader_gives_each_folders_record(tmp_path):
    # (a supervisor, as the process table shows one: the job's mark, and its plan last on its command line)
    supervisor = subprocess.Popen(["sh", "-c", "sleep 60", "sh", f"{tmp_path}/20261123-110000-bbbb/plan.json"],
                                  env={"KIT_SUPERVISOR": "20261123-110000-bbbb"})
    write(tmp_path / "20261123-100000-aaaa", launcher="torchrun\n", ranks="a a b\n", started="100\n", ended="160\n",
          exit="0\n", pid="999999999\n", environment="NCCL_DEBUG=INFO, HF_TOKEN=(hidden)\n")
    write(tmp_path / "20261123-110000-bbbb", launcher="horovod\n", ranks="a b\n", started="200\n",
          pid="999999999\n", supervisor=f"{supervisor.pid}\n", restarts="1\n", left_out="c\n", phase="restarting\n")
    write(tmp_path / "20261123-120000-cccc", ranks="a\n", started="300\n", supervisor=f"{os.getpid()}\n")
    write(tmp_path / "20261123-130000-dddd", **{"plan.json": "{}"})  # kit planned it; no supervisor yet
    try:  # the third one's supervisor pid is a process, but not the job's (a pid used again after a restart)
        done, restarting, lost, pending = run_reader(tmp_path)
    finally:
        supervisor.kill()
    assert (restarting.state, restarting.restarts, restarting.left_out) == ("restarting", 1, ("c",))
    assert pending.state == "pending" and pending.started is None
    assert (done.id, done.launcher, done.hosts, done.state, done.seconds(0), done.environment) == \
           ("20261123-100000-aaaa", "torchrun", ("a", "a", "b"), "succeeded", 60, "NCCL_DEBUG=INFO, HF_TOKEN=(hidden)")
    assert restarting.hosts == ("a", "b")
    assert (lost.state, lost.launcher) == ("lost", "horovod")  # no launcher file: an older kit's job, horovodrun


def test_the_reader_follows_no_link_and_survives_what_a_rank_wrote(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("0\n")
    write(tmp_path / "jobs" / "20261123-100000-aaaa", started="not a number", exit="1e9", ranks="x" * 10000)
    os.symlink(secret, tmp_path / "jobs" / "20261123-100000-aaaa" / "ended")
    os.symlink(tmp_path, tmp_path / "jobs" / "20261123-110000-link")
    os.mkfifo(tmp_path / "jobs" / "20261123-100000-aaaa" / "launcher")  # would block a reader that waits on it
    (one,) = run_reader(tmp_path / "jobs")
    assert (one.started, one.ended, one.exit_code, len(one.hosts[0]), one.launcher) == (None, None, None, 4096, "horovod")
    assert run_reader(tmp_path / "none") == []


def test_a_new_job_id_is_of_the_form_the_reader_keeps():
    assert model.JOB_ID.fullmatch(jobs.new_job_id())


def inner(cmd: str, folder, workspace) -> str:
    """The shell command that a `docker exec ... sh|bash -c X` runs, with the job's folder and workspace here."""
    script = shlex.split(cmd)[-1]
    return script.replace("/var/lib/kit/lab/jobs/j1", str(folder)).replace("cd /w", f"cd {workspace}")


def run_follow(j, folder, workspace) -> list[str]:
    r = subprocess.run(["sh", "-c", inner(jobcontrol.follow_command("kit-lab", j.folder, j.id), folder, workspace)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_following_a_job_that_never_started_or_left_no_code_says_so(tmp_path):
    from test_jobenv import job
    lines = run_follow(job(()), tmp_path / "jobs", tmp_path)
    end = jobcontrol.End()
    assert lines == [f"{jobcontrol.END_MARK} "] and end.feed(lines[0]) and end.code is None
    for junk in ("1 /etc/shadow", "-1", "x"):  # what a rank could write there is never used as a pid or a code
        (tmp_path / "jobs").mkdir(exist_ok=True)
        (tmp_path / "jobs" / "supervisor").write_text(junk + "\n")
        (tmp_path / "jobs" / "exit").write_text(junk + "\n")
        assert run_follow(job(()), tmp_path / "jobs", tmp_path) == [f"{jobcontrol.END_MARK} {junk}"]
        assert jobcontrol.End().feed(f"{jobcontrol.END_MARK} {junk}")


def test_stop_signals_the_launcher_only_while_it_is_the_jobs(tmp_path):
    """interrupt_command's shell, run here: SIGINT goes to the job's launcher as the process table shows it (the child,
    carrying KIT_JOB, of the process carrying KIT_SUPERVISOR whose command line ends with the job's plan); the job's
    pid file, which the job can write or make a FIFO, is not read, and another process of the job is left."""
    folder = tmp_path / "j1"
    folder.mkdir()
    cmd = jobcontrol.interrupt_command("kit-lab", str(folder), "j1")
    assert cmd.startswith("docker exec kit-lab timeout -s KILL 50 sh -c ")
    script = shlex.split(cmd)[-1]
    os.mkfifo(folder / "pid")
    launcher = "import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); time.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", launcher], env={"KIT_JOB": "j1"})
    supervisor = subprocess.Popen(["sh", "-c", f"env KIT_JOB=j1 {sys.executable} -c '{launcher}' & wait", "sh",
                                   f"{folder}/plan.json"], env={"KIT_SUPERVISOR": "j1", "PATH": os.environ["PATH"]})
    try:
        time.sleep(1)
        subprocess.run(["sh", "-c", script], timeout=30, check=True)
        assert supervisor.wait(timeout=10) == 0 and other.poll() is None  # (its launcher ended: the wait did)
        assert (folder / "stopped").read_text().strip().isdigit()
    finally:
        other.kill()
        supervisor.kill()


class FollowHere:
    """The primary's runner for follow_to_end: its follow script run here by sh, on a job folder of this machine."""

    def __init__(self, folder, workspace) -> None:
        self.folder, self.workspace = folder, workspace

    def stream_out(self, cmd: str, on_line, *, stdin=None) -> int:
        proc = subprocess.Popen(["sh", "-c", inner(cmd, self.folder, self.workspace)], stdout=subprocess.PIPE)
        for raw in proc.stdout:
            on_line(raw.decode(errors="replace").rstrip("\n"))
        return proc.wait()

    def run(self, cmd: str, **kw):
        raise AssertionError(f"kit ran {cmd}: the supervisor's end was there, nothing was left for kit to stop")


def followed(tmp_path, **files):
    """follow_to_end on a job of the hosts a (primary) and b whose folder holds these files, its output as shown."""
    from kit.config.hosts import Host
    from kit.cluster.place import Place
    from kit.cluster.steps.node import Node
    folder = tmp_path / "jobs"
    write(folder, **files)
    runner = FollowHere(folder, tmp_path)
    nodes = [Node(Host(h, primary=h == "a"), runner, Place("kit-lab", "/var/lib/kit/lab"), address=address)
             for h, address in (("a", "10.0.0.1"), ("b", "10.0.0.2"))]
    shown = []
    outcome = jobs.follow_to_end(nodes, "j1", ["a", "b"], lambda rank, host, text: shown.append(text))
    return outcome, shown


def test_an_end_mark_that_the_job_wrote_into_its_log_neither_ends_it_nor_forges_its_ending(tmp_path):
    """A rank (root in the primary's container) appends kit's END_MARK and a made-up ending to the job's output.log:
    kit still takes the job's exit code from the follower's own last mark, and of what the job's files name, only
    the job's hosts (a name with rich markup would have stopped kit before it said how the job ended)."""
    forged = f"{jobcontrol.END_MARK} 0\n@@reaped\nb 99\n@@left_out\nb\n"
    outcome, shown = followed(tmp_path, **{
        "output.log": "[0]<stdout>:step 1\n" + forged + "[1]<stdout>:step 2\n",
        "exit": "3", "reaped": "a 2\n[/bold] 5\nzz 7", "env_kept": "[red]10.9.9.9 10.0.0.2", "left_out": "[/] zz"})
    assert outcome.exit_code == 3 and shown[0] == "step 1"
    assert (outcome.leftovers, outcome.env_kept, outcome.left_out) == ({"a": 2}, ["10.0.0.2"], [])


def test_what_follows_an_end_mark_is_kept_only_up_to_the_endings_size():
    end = jobcontrol.End()
    assert end.feed(f"{jobcontrol.END_MARK} 0") and end.code == 0
    block, most = "x" * (1 << 16), (64 << 20) + (1 << 20)  # after.json's 64 MiB, and the small files
    for _ in range(most // len(block) + 200):  # a job that writes on after a mark it wrote itself
        assert end.feed(block)
    assert sum(len(line) + 1 for line in end.rest) <= most
    assert end.feed(f"{jobcontrol.END_MARK} 4") and (end.code, end.rest) == (4, [])
    assert end.feed("@@hang") and end.rest == ["@@hang"]


def test_kits_own_line_of_every_hosts_manifest_after_the_end_is_read_whole(tmp_path):
    """kit run follows the job on the starter's conversation, whose lines are cut at LINE_KEPT (a rank's may never
    end); the follower's after.json line, after its END_MARK, holds every host's manifest and is read whole."""
    import json as _json
    from types import SimpleNamespace

    from kit.runners.base import LINE_KEPT
    from kit.runners.local import LocalRunner
    manifest = "".join(f"{i:064x}  ./data/file-{i}.bin\n" for i in range(2000))  # 150 KB a host
    after = _json.dumps({"a": manifest, "b": manifest})
    assert len(after) > 2 * LINE_KEPT
    (tmp_path / "said").write_text(f"[0]<stdout>:step 1\n{jobcontrol.END_MARK} 0\n@@reaped\n\n@@after.json\n{after}\n")
    talk = LocalRunner("a").converse(f"cat {tmp_path / 'said'}", silence=30)
    from kit.config.hosts import Host
    from kit.cluster.place import Place
    from kit.cluster.steps.node import Node
    nodes = [Node(Host(h, primary=h == "a"), None, Place("kit-lab", "/var/lib/kit/lab"), address=address)
             for h, address in (("a", "10.0.0.1"), ("b", "10.0.0.2"))]
    starting = SimpleNamespace(said=talk.lines(), talk=talk)
    outcome = jobs.follow_to_end(nodes, "j1", ["a", "b"], lambda rank, host, text: None, starting)
    from kit.cluster.steps.workspace import parse_manifest
    assert outcome.exit_code == 0 and outcome.after == {h: parse_manifest(manifest) for h in ("a", "b")}
