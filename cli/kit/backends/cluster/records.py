"""The jobs of a cluster, as their folders on the primary record them (kit jobs, kit logs, kit stop): the script that
reads them there, the Record of each, and how a user names a job."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from kit.jobs.commands.docker import command, exec_argv
from kit.jobs.model import JOB_ID, check_job_ref
from kit.cluster.steps.node import Node
from kit.backends.cluster.supervisor.launch import SUPERVISOR_APART


STATES = ("pending", "running", "restarting", "stopping", "succeeded", "failed", "stopped", "lost")
ACTIVE = ("running", "restarting", "stopping")  # a supervisor is there: the job can be stopped, its stacks read


# Runs in the primary's container (the job's own realm: what a rank wrote there is read there, as text, with no
# link followed, regular files only): one JSON line a job folder of kit's job ids, at most RECORDS_MAX of them and
# RECORDS_BYTES in all. First the folders the user's job reference names (a job can make folders of any name, but not
# crowd out the one named), then those of live jobs (so no flood of made-up folders hides a running job from kit stop),
# then the newest. A job is alive while its supervisor is in the process table (in kit's containers: started from
# outside, its parent not in the container, which no process of a job can make its own).
RECORDS_MAX, RECORDS_BYTES = 200, 8 << 20
RECORDS_SCRIPT = r"""
import json, os, re, stat, sys
root, ref, printed = sys.argv[1], sys.argv[2], 0
@APART@
def read(folder, name):
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(4096).decode("utf-8", "replace").strip() if stat.S_ISREG(os.fstat(fd).st_mode) else None
def supervisors():
    live = set()
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                last = f.read(CMDLINE_MAX).rstrip(b"\0").split(b"\0")[-1].decode("utf-8", "replace")
            if not pid.isdigit() or not last.startswith(root + "/") or (OUTSIDE and not apart(pid)):
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                marks = [v[15:].decode("utf-8", "replace") for v in f.read(1 << 20).split(b"\0")
                         if v.startswith(b"KIT_SUPERVISOR=")]
        except OSError:
            continue
        live.update(m for m in marks if last == os.path.join(root, m, "plan.json"))
    return live
live = supervisors()
names = sorted((n for n in os.listdir(root) if re.fullmatch(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{4}", n)), reverse=True) \
    if os.path.isdir(root) else []
named = [n for n in names if ref != "last" and (n.startswith(ref) or n.rsplit("-", 1)[-1] == ref)]
first = sorted(named, key=lambda n: n != ref) + [n for n in names if n in live]
for name in list(dict.fromkeys(first + names))[:@RECORDS_MAX@]:
    folder = os.path.join(root, name)
    if os.path.islink(folder) or not os.path.isdir(folder):
        continue
    record = {f: read(folder, f) for f in ("launcher", "ranks", "started", "ended", "exit", "environment", "restarts",
                                           "left_out", "hang", "straggler", "phase", "unsettled")}
    record.update(id=name, stopped=read(folder, "stopped") is not None, planned=read(folder, "plan.json") is not None,
                  alive=name in live)
    line = json.dumps(record)
    printed += len(line) + 1
    if printed > @RECORDS_BYTES@:
        break
    print(line)
""".replace("@APART@\n", SUPERVISOR_APART).replace("@RECORDS_MAX@", str(RECORDS_MAX)).replace("@RECORDS_BYTES@", str(RECORDS_BYTES))


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and re.fullmatch(r"-?\d{1,12}", text) else None


@dataclass(frozen=True)
class Record:
    """What a job's folder on the primary says of it."""

    id: str
    launcher: str
    hosts: tuple[str, ...]   # the host of each rank
    started: int | None      # epoch seconds
    ended: int | None
    exit_code: int | None
    stopped: bool            # kit stop (or Ctrl-C) asked it to stop
    alive: bool              # its supervisor (the shell that records its end) is there, and still the job's
    environment: str = ""    # what kit showed of its variables
    restarts: int = 0        # how often it was started again
    left_out: tuple[str, ...] = ()  # the hosts a restart left out
    hang: str = ""           # what the supervisor found when no rank made progress
    restarting: bool = False  # between two launches
    planned: bool = False    # kit wrote its plan (the supervisor may not have started yet)
    straggler: str = ""      # the hosts whose ranks held the others back, a line each (kit.jobs.pace)
    unsettled: str = ""      # the hosts whose sweep at its end did not settle, a line each (`host PID:NAME ...`)

    @classmethod
    def parse(cls, line: str) -> "Record":
        raw = json.loads(line)
        return cls(raw["id"], raw.get("launcher") or "horovod", tuple((raw.get("ranks") or "").split()),
                   _int(raw.get("started")), _int(raw.get("ended")), _int(raw.get("exit")), bool(raw.get("stopped")),
                   bool(raw.get("alive")), raw.get("environment") or "", _int(raw.get("restarts")) or 0,
                   tuple((raw.get("left_out") or "").split()), raw.get("hang") or "", raw.get("phase") == "restarting",
                   bool(raw.get("planned")), raw.get("straggler") or "", raw.get("unsettled") or "")

    @property
    def state(self) -> str:
        """pending -> running (-> restarting -> running ...) (-> stopping) -> succeeded | failed | stopped; lost when
        neither its supervisor nor its end is there (its container was removed or restarted under it)."""
        if self.alive:  # (an exit record counts once no supervisor of the job lives: the job can write one)
            return "stopping" if self.stopped else "restarting" if self.restarting else "running"
        if self.exit_code is not None:
            if self.stopped:
                return "stopped"
            return "succeeded" if self.exit_code == 0 else "failed"
        if self.stopped:
            return "stopped"
        return "pending" if self.planned and self.started is None else "lost"

    def seconds(self, now: float) -> int | None:
        if self.started is None:
            return None
        return int((self.ended if self.ended is not None else now) - self.started)


def records_command(container: str, jobs_dir: str, ref: str = "last") -> str:
    return command(exec_argv(container, ["timeout", "-s", "KILL", "50", "python", "-I", "-c", RECORDS_SCRIPT, jobs_dir,
                                         check_job_ref(ref)]))


def read_records(primary: Node, ref: str = "last") -> list[Record]:
    """The jobs of the cluster (RECORDS_SCRIPT's: those `ref` names first), oldest first."""
    r = primary.runner.run(records_command(primary.place.container, primary.place.jobs_dir, ref), timeout=60)
    r.check(f"cannot read the jobs of {primary.name}")
    found = [rec for line in r.stdout.splitlines() if line.startswith("{")
             if JOB_ID.fullmatch((rec := Record.parse(line)).id)]  # kit's jobs, not what else is in the folder
    return sorted(found, key=lambda rec: (rec.started or 0, rec.id))
