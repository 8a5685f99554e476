"""The starter: kit's one conversation with the primary's container that starts a job (`python -I -c SOURCE --start`),
which copies the job's files into the workspaces, gives every host the job's variables and waits for the supervisor,
which kit starts apart from its session (`docker exec -d`: its parent is outside the container, which no process in
it can make its own). Standard library only: shipped in the supervisor's script (kit.backends.cluster.supervisor.shipped)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time

from kit.backends.cluster.supervisor.launch import ENV_DIR, MANIFEST, REMOTE_TIMEOUT_S, UNSETTLED, at_once, manifest_line  # shipped together
from kit.backends.cluster.supervisor.launch import parse_manifest, ssh_argv, _run_quietly, _text, _write  # shipped together


# The lines the starter answers kit with (start()).
MANIFEST_END, COPIED, HOSTS, STARTED = "@@kit-manifest-end", "@@kit-copied", "@@kit-hosts", "@@kit-started"
LAUNCH = "@@kit-launch"
COPY_TIMEOUT_S = 3600   # one copy of a job's files to a host (a job's folder may hold GBs)
SUPERVISOR_WAIT_S = 60  # for the supervisor kit started to say it runs (its pid file)


def start(inp, out) -> int:
    """kit's one conversation with the primary's container that starts a job (`python -I -c SOURCE --start`), in JSON
    lines on stdin, the starter answering on stdout:
    1. the request: the job's files written into its folder (kit's own names: the plan, what kit showed of the
       variables), the variables' file for this container's ranks, and this container's workspace, listed;
    2. {"tar": N} and N bytes: the job's files that the workspace lacks, unpacked there (in the container: what is
       in the workspace is the job's, and no link of it is followed outside);
    3. {"others": true}: the job's other hosts given, at once over the cluster SSH, what their workspaces lack of the
       job's files (from here, so that kit's own link carries each byte once) and their variables; what each got
       and had, or what failed there, answered after HOSTS;
    4. {"go": [kit's lines]}: the log begun with them, answered LAUNCH;
    5. {"launched": ""} once kit started the supervisor apart from this session (`docker exec -d`: a closed laptop or
       a dropped VPN does not end the job), or what failed: the supervisor waited for (its pid file), and, given a
       follow script, this process becomes the follower of the job's output.
    The end of stdin before 5, or an answer that finds no reader (kit stopped, its link dropped, or a host failed):
    the job's variables and folder are removed, here and where they were given, and nothing started."""
    request = json.loads(inp.readline())
    folder, job = request["folder"], os.path.basename(request["folder"])
    if left := unsettled_said(subprocess.run(["sh", "-c", UNSETTLED_READ], capture_output=True, text=True).stdout):
        print(unsettled_error(left), file=sys.stderr, flush=True)
        return 4
    os.makedirs(folder, exist_ok=True)
    for name, text in request["files"].items():
        _write(folder, name, text.rstrip("\n"))
    env_text, workspace = request.get("env_file"), request["workspace"]
    if env_text is not None:
        _write_env(job, env_text)
    given: list[str] = []  # the addresses of the other hosts that were given the variables

    def abandon() -> int:  # nothing starts, and nothing of the job stays (the folder last: its absence says so)
        if env_text is not None:
            os.remove(os.path.join(ENV_DIR, job))
            at_once(given, lambda a: _run_quietly(ssh_argv(a, shlex.join(["rm", "-f", f"{ENV_DIR}/{job}"]))))
        shutil.rmtree(folder, ignore_errors=True)
        return 3
    try:
        out.write(manifest(workspace) + MANIFEST_END + "\n")
        out.flush()
        while True:
            line = inp.readline()
            if not line:  # kit stopped, or a host failed
                return abandon()
            message = json.loads(line)
            if "tar" in message:
                out.write(unpack(inp, int(message["tar"]), workspace) + "\n")
            elif "others" in message:
                done = at_once(request["hosts"], lambda h: give(h, workspace, request["job_files"] if request["copy"]
                                                                else None, job, env_text))
                given = [h["address"] for h, d in zip(request["hosts"], done) if d.get("env")]
                out.write(HOSTS + " " + json.dumps({h["name"]: d for h, d in zip(request["hosts"], done)}) + "\n")
            elif "go" in message:
                break
            out.flush()
    except BrokenPipeError:  # kit's end of the conversation is gone (its link dropped while this gave the hosts)
        return abandon()
    with open(os.path.join(folder, "output.log"), "a") as f:
        f.write("".join(f"kit: {line}\n" for line in message["go"]))
    try:
        out.write(LAUNCH + "\n")
        out.flush()
        line = inp.readline()
    except BrokenPipeError:
        return abandon()
    if not line:  # kit stopped before it started the supervisor
        return abandon()
    error = json.loads(line).get("launched") or started(folder)
    if error:  # recorded as failed, not left pending
        with open(os.path.join(folder, "output.log"), "a") as f:
            f.write(f"kit: the supervisor did not start: {error}\n")
        _write(folder, "ended", str(int(time.time())))
        _write(folder, "exit", "1")
        print(f"the supervisor did not start: {error}", file=sys.stderr, flush=True)
    if request.get("follow"):
        out.flush()
        os.execvp("sh", ["sh", "-c", request["follow"]])
    out.write(STARTED + "\n")
    out.flush()
    return 1 if error else 0


def _env_folder() -> int:
    """ENV_DIR (on the container's tmpfs), opened without following a link: what an earlier job left in its place (a
    link that would send the variables off the tmpfs, into the workspace; a file) is removed and the folder made anew."""
    for _ in range(3):
        try:
            return os.open(ENV_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            os.makedirs(ENV_DIR, mode=0o700, exist_ok=True)
        except OSError:
            os.remove(ENV_DIR)
    raise OSError(f"{ENV_DIR} is not a folder kit can make")


def _write_env(job: str, text: str) -> None:
    """The job's variables, 0600, in a file made new in ENV_DIR (never written through what is there)."""
    folder = _env_folder()
    try:
        try:  # (what an earlier job left under this name goes, unfollowed)
            os.unlink(job, dir_fd=folder)
        except FileNotFoundError:
            pass
        fd = os.open(job, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    finally:
        os.close(folder)


# sh, on another host's container: the job's variables from stdin into a file made new in ENV_DIR, what an earlier job
# left in the folder's place (a link, a file) removed first (as _env_folder), the file never written through a link.
ENV_GIVE = ('umask 077; d={dir}; if [ -L "$d" ] || {{ [ -e "$d" ] && [ ! -d "$d" ]; }}; then rm -f "$d"; fi; '
            'mkdir -p "$d" && [ ! -L "$d" ] && rm -f "$d/{job}" && set -C && cat > "$d/{job}"')


# sh, in a host's container: what UNSETTLED holds (the jobs whose sweep did not settle there), a line each.
UNSETTLED_READ = f"cat {UNSETTLED}/* 2>/dev/null | head -c 2000; true"


def unsettled_said(stdout: str) -> str:
    """UNSETTLED_READ's lines as one: `JOB PID:NAME ...; ...` ("" where no sweep was left unsettled)."""
    return "; ".join(line.strip() for line in stdout.splitlines() if line.strip())


def unsettled_error(said: str) -> str:
    """Why no job starts on a host whose sweep did not settle: `JOB PID:NAME ...` of each, and the fix."""
    jobs = [part.split()[0] for part in said.split(";") if part.split()]
    return (f"the end of job {', '.join(jobs)} did not settle here (still stopping: {said}): no job starts on this "
            f"host until `kit stop {jobs[0] if jobs else 'JOB'}` finds nothing of it, or `kit down` and `kit up`")


def give(host: dict, workspace: str, files: dict[str, str] | None, job: str, env_text: str | None) -> dict:
    """One other host of the job: what its workspace lacks of the job's files (files: name -> sha256; None where
    the hosts share the workspace), sent from here, and the job's variables. {"sent": N, "manifest": its workspace
    before, "env": given}, or {"error": what failed}."""
    address, ws = host["address"], shlex.quote(workspace)
    done: dict = {"sent": 0, "manifest": ""}
    try:
        r = subprocess.run(ssh_argv(address, UNSETTLED_READ), capture_output=True, timeout=REMOTE_TIMEOUT_S)
        if r.returncode != 0:
            return {"error": f"cannot reach the host's container (exit {r.returncode}): "
                             f"{_text(r.stderr).strip()[-500:]}"}
        if said := unsettled_said(_text(r.stdout)):
            return {"error": unsettled_error(said)}
        if files is not None:
            r = subprocess.run(ssh_argv(address, MANIFEST.format(workspace=ws)), capture_output=True,
                               timeout=COPY_TIMEOUT_S)
            if r.returncode != 0:
                return {"error": f"cannot list the workspace {workspace} in the container (exit {r.returncode}): "
                                 f"{_text(r.stderr).strip()[-500:]}"}
            had = parse_manifest(_text(r.stdout))
            names = [name for name, digest in files.items() if had.get(name) != digest]
            if names:
                untar = shlex.join(ssh_argv(address, f"mkdir -p {ws} && tar -xzf - -C {ws} --no-same-owner", stdin=True))
                r = subprocess.run(["sh", "-c", f"tar -czf - -C {ws} --null -T - | {untar}"],
                                   input="\0".join(names).encode(), capture_output=True, timeout=COPY_TIMEOUT_S)
                if r.returncode != 0:
                    return {"error": f"cannot copy the job's files to {workspace} (exit {r.returncode}): "
                                     f"{_text(r.stderr).strip()[-500:]}"}
            done.update(sent=len(names), manifest="".join(manifest_line(n, d) for n, d in had.items()))
        if env_text is not None:
            r = subprocess.run(ssh_argv(address, ENV_GIVE.format(dir=ENV_DIR, job=job), stdin=True),
                               input=env_text.encode(), capture_output=True,
                               timeout=REMOTE_TIMEOUT_S)
            if r.returncode != 0:
                return {**done, "error": f"cannot give the job's variables to its container (exit {r.returncode}): "
                                         f"{_text(r.stderr).strip()[-500:]}"}
            done["env"] = True
    except subprocess.TimeoutExpired as e:
        return {"error": f"no answer within {e.timeout:.0f} s"}
    return done


def manifest(workspace: str) -> str:
    """MANIFEST's output (sha256sum's lines, `DIGEST  ./NAME`), made here: regular files only, no link followed, each
    name escaped as sha256sum escapes it (a line of this conversation is kit's to read: the job's file names are not;
    and the supervisor reads this workspace with sha256sum at the job's end, which must name each file the same)."""
    lines = []
    for top, folders, names in os.walk(workspace):  # (links to folders are not entered)
        for name in names:
            path = os.path.join(top, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue  # a link, or gone
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                digest = hashlib.sha256()
                while block := f.read(1 << 20):
                    digest.update(block)
            lines.append(manifest_line(os.path.relpath(path, workspace), digest.hexdigest()))
    return "".join(lines)


def unpack(inp, size: int, workspace: str) -> str:
    """size bytes of a gzip'd tar from inp, unpacked into the workspace as UNTAR does; COPIED, or what failed (the
    end of tar's complaints, one for each file it could not write: a full disk)."""
    os.makedirs(workspace, exist_ok=True)
    # tar's stderr goes to a file: a pipe that nobody reads while tar is fed fills, and tar and this wait on each other
    with tempfile.TemporaryFile() as complaints:
        tar = subprocess.Popen(["tar", "-xzf", "-", "-C", workspace, "--no-same-owner"], stdin=subprocess.PIPE,
                               stderr=complaints)
        left = size
        while left:
            block = inp.read(min(left, 1 << 20))
            if not block:
                break
            left -= len(block)
            try:
                tar.stdin.write(block)
            except BrokenPipeError:
                pass  # (tar failed: the rest is read all the same, for the next message)
        tar.stdin.close()
        code = tar.wait()
        complaints.seek(max(0, complaints.seek(0, os.SEEK_END) - 2000))
        err = complaints.read().decode(errors="replace").strip().replace("\n", "; ")
    return COPIED if code == 0 and not left else f"{COPIED} failed: {err or 'the copy was cut short'}"


def started(folder: str, wait: float = SUPERVISOR_WAIT_S, every: float = 0.1) -> str:
    """"" once the supervisor kit started says it runs (it writes its pid file first), else what went wrong."""
    deadline = time.monotonic() + wait
    while not os.path.exists(os.path.join(folder, "supervisor")):
        if time.monotonic() > deadline:
            return f"it did not start within {wait:.0f} s"
        time.sleep(every)
    return ""
