"""A job's folder as a hostile job leaves it (FIFOs, links to /dev/zero, huge files, thousands of folders), read by
kit's own readers, run here for real by this machine's python: they return within a bound and cap what they print.
And kit's python helpers, run with a workspace full of modules named as the standard library's, use the library's."""

import os
import shlex
import subprocess
import sys
import time
from types import SimpleNamespace

from kit.backends.cluster import control as jobcontrol
from kit.backends.cluster import records as jobrecords
from kit.backends.cluster import run as jobs
from kit.backends.cluster.supervisor import heartbeats


def here(cmd: str | list[str]) -> list[str]:
    """What `docker exec [-i] CONTAINER ARGV...` runs in the container, run here instead (its python: this one)."""
    argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    if argv[:2] == ["docker", "exec"]:
        argv = argv[3:] if argv[2] != "-i" else argv[4:]
    return [sys.executable if a == "python" else a for a in argv]


def hostile_folder(folder) -> None:
    folder.mkdir(parents=True)
    os.mkfifo(folder / "exit")
    os.mkfifo(folder / "environment")
    os.symlink("/dev/zero", folder / "output.log")
    os.symlink("/dev/zero", folder / "started")
    with open(folder / "ranks", "wb") as f:  # 10 MB, no line break
        f.truncate(10 << 20)


def test_the_records_script_reads_hostile_job_folders_within_bounds(tmp_path):
    root = tmp_path / "jobs"
    hostile_folder(root / "20261126-235959-ffff")  # the newest
    for i in range(300):
        folder = root / f"20261126-{i:06d}-abcd"
        folder.mkdir()
        for name in ("ranks", "hang", "left_out"):
            (folder / name).write_text("x" * 5000)
    began = time.monotonic()
    r = subprocess.run(here(jobrecords.records_command("kit-lab", str(root))), capture_output=True, timeout=60)
    assert r.returncode == 0 and time.monotonic() - began < 30, r.stderr
    lines = r.stdout.decode().splitlines()
    assert len(r.stdout) <= jobrecords.RECORDS_BYTES and 0 < len(lines) <= jobrecords.RECORDS_MAX, \
        (len(r.stdout), len(lines))
    newest = jobrecords.Record.parse(lines[0])
    assert (newest.id, newest.exit_code, newest.started, newest.environment, newest.alive) == \
           ("20261126-235959-ffff", None, None, "", False)


def test_no_flood_of_made_up_folders_hides_a_running_job_or_the_one_named(tmp_path):
    """A job is root where its folders are: it can make any number of folders with later ids, each of the most a
    record may hold, but the running job (kit stop's) and the one the user names are read first."""
    root = tmp_path / "jobs"
    for i in range(jobrecords.RECORDS_MAX + 50):
        folder = root / f"99991231-{i:06d}-ffff"
        folder.mkdir(parents=True)
        for name in ("ranks", "hang", "left_out", "environment", "launcher"):
            (folder / name).write_bytes(b"\xff" * 4096)  # 6 characters a byte in JSON
    running, old = root / "20261126-100000-aaaa", root / "20261101-090000-bbbb"
    for folder in (running, old):
        folder.mkdir()
        (folder / "plan.json").write_text("{}")
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(running / "plan.json")],
                                  env={"KIT_SUPERVISOR": running.name})
    try:
        def ids(ref: str) -> list[str]:
            r = subprocess.run(here(jobrecords.records_command("kit-lab", str(root), ref)), capture_output=True,
                               timeout=60)
            assert r.returncode == 0 and len(r.stdout) <= jobrecords.RECORDS_BYTES, r.stderr
            return [jobrecords.Record.parse(line).id for line in r.stdout.decode().splitlines()]
        assert ids("last")[0] == running.name
        assert ids(old.name)[0] == old.name and ids("bbbb")[:2] == [old.name, running.name]
    finally:
        supervisor.kill()
        supervisor.wait()


def test_a_supervisor_with_the_whole_shipped_source_on_its_command_line_is_seen_alive(tmp_path):
    """kit jobs and the follower tell a live supervisor by its command line, whose first argument is the shipped
    source, larger than 64 KiB: the plan's path after it is read all the same."""
    from kit.backends.cluster.supervisor import shipped
    root = tmp_path / "jobs"
    running = root / "20261129-100000-cccc"
    running.mkdir(parents=True)
    (running / "plan.json").write_text("{}")
    (running / "output.log").write_text("a line of the job\n")
    code = "import time; time.sleep(60)\n#" + "x" * len(shipped.source())
    supervisor = subprocess.Popen([sys.executable, "-c", code, str(running / "plan.json")],
                                  env={"KIT_SUPERVISOR": running.name})
    try:
        r = subprocess.run(here(jobrecords.records_command("kit-lab", str(root))), capture_output=True, timeout=60)
        assert [jobrecords.Record.parse(line).state for line in r.stdout.decode().splitlines()] == ["running"]
        follower = subprocess.Popen(here(jobcontrol.follow_command("kit-lab", str(running), running.name)),
                                    stdout=subprocess.PIPE)
        time.sleep(12)  # (a follower that does not see the supervisor ends after 10 s)
        assert follower.poll() is None
        supervisor.kill()
        out, _ = follower.communicate(timeout=30)
        assert out.startswith(b"a line of the job\n") and jobcontrol.END_MARK.encode() in out, out
    finally:
        supervisor.kill()
        supervisor.wait()


def bounded(argv: list[str], most: int = 1 << 20, seconds: float = 30) -> bytes:
    """What argv prints, read up to `most` bytes or `seconds` (then it is killed): a flood or a block fails, and is
    not kept."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out, deadline = b"", time.monotonic() + seconds
    try:
        os.set_blocking(proc.stdout.fileno(), False)
        while time.monotonic() < deadline and len(out) < most:
            block = proc.stdout.read(1 << 16)
            if block == b"":
                break
            out += block or b""
            time.sleep(0 if block else 0.05)
        else:
            raise AssertionError(f"no end within {seconds} s and {most} bytes: {out[:200]!r}...")
    finally:
        proc.kill()
        proc.wait()
    return out


def test_the_follower_reads_no_fifo_and_no_link(tmp_path):
    folder = tmp_path / "jobs" / "20261126-235959-ffff"
    hostile_folder(folder)
    (folder / "reaped").symlink_to("/dev/zero")
    out = bounded(here(jobcontrol.follow_command("kit-lab", str(folder), folder.name, ending=True)))
    assert b"output.log is not a regular file" in out and len(out) < 1000, out[:1000]
    out = bounded(here(jobcontrol.log_command("kit-lab", str(folder))))
    assert out.decode().splitlines() == ["kit: the job's output.log is not a regular file (a link, a FIFO): not read"]


SHADOWS = ("json", "signal", "socket", "subprocess", "stat")


def test_kits_python_helpers_ignore_modules_in_the_workspace(tmp_path):
    """A job leaves json.py, signal.py ... in the workspace, the folder kit's helpers run in (`docker exec`'s -w)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    for name in SHADOWS:
        (workspace / f"{name}.py").write_text("raise RuntimeError('a module of the workspace was imported')\n")
    folder = tmp_path / "jobs" / "20261126-235959-ffff"
    folder.mkdir(parents=True)
    (folder / "output.log").write_text("line 1\n")

    def run(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess:
        r = subprocess.run(here(argv), cwd=workspace, input=stdin, capture_output=True, timeout=60)
        assert b"a module of the workspace was imported" not in r.stderr, (argv[:4], r.stderr.decode()[-2000:])
        return r

    assert run(jobrecords.records_command("kit-lab", str(folder.parent))).stdout.startswith(b'{"launcher"')
    assert run(jobcontrol.log_command("kit-lab", str(folder))).stdout == b"line 1\n"
    assert run(jobcontrol.follow_command("kit-lab", str(folder), folder.name)).stdout == b"line 1\n@@kit-job-end \n"
    run(heartbeats.stacks_argv(folder.name))
    ran = []

    def runner(cmd, **kw):
        ran.append(r := run(cmd))
        return SimpleNamespace(check=lambda *a, **k: SimpleNamespace(stdout=r.stdout.decode()))
    assert 0 < jobs.free_port(SimpleNamespace(runner=SimpleNamespace(run=runner),
                                              place=SimpleNamespace(container="kit-lab"))) < 65536
    from test_jobenv import job
    starter = run(job(()).start_command(), b"")  # the job starter: no request on its stdin, json says so
    assert b"JSONDecodeError" in starter.stderr, starter.stderr.decode()[-2000:]


def test_a_link_an_earlier_job_left_for_the_variables_folder_sends_no_variables_through_it(tmp_path, monkeypatch):
    """A job is root in its container: it can put a link to the workspace where the next job's variables go. They
    are written into a folder made anew there (on the tmpfs), never through the link, here and on the other hosts."""
    from kit.backends.cluster.supervisor import starter
    workspace, env_dir = tmp_path / "workspace", tmp_path / "run" / "env"
    workspace.mkdir()
    env_dir.parent.mkdir()
    env_dir.symlink_to(workspace)
    monkeypatch.setattr(starter, "ENV_DIR", str(env_dir))
    starter._write_env("20261126-100000-aaaa", "TOKEN=s3cr3t")
    assert not env_dir.is_symlink() and list(workspace.iterdir()) == []
    assert (env_dir / "20261126-100000-aaaa").stat().st_mode & 0o777 == 0o600

    other = tmp_path / "other" / "env"  # the same on another host, by the shell kit runs there
    other.parent.mkdir()
    other.symlink_to(workspace)
    (workspace / "20261126-100000-bbbb").symlink_to(tmp_path / "stolen")
    give = starter.ENV_GIVE.format(dir=shlex.quote(str(other)), job="20261126-100000-bbbb")
    subprocess.run(["sh", "-c", give], input=b"TOKEN=s3cr3t", check=True, timeout=30)
    assert not other.is_symlink() and (other / "20261126-100000-bbbb").read_bytes() == b"TOKEN=s3cr3t"
    assert not (tmp_path / "stolen").exists()
