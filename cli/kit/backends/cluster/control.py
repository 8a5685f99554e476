"""Following, interrupting and stopping a job of the cluster (kit run, kit logs -f, kit stop, kit stacks): the
follower's script and what it prints at the end (END_MARK, then what the supervisor recorded), SIGINT to a job's
launcher, and what is left of a job stopped on every host."""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field

from kit.jobs.commands.docker import command, exec_argv
from kit.errors import KitError
from kit.cluster.fanout import fan_out
from kit.cluster.steps import workspace
from kit.cluster.steps.node import Node
from kit.backends.cluster.supervisor import heartbeats
from kit.backends.cluster.supervisor.launch import (AFTER, ENDING, RANKS_MARK, REAP_FOR_S, REAP_SETTLE_S, STOP_WAIT_S,
                                                    SUPERVISOR_APART)
from kit.backends.cluster.supervisor.launch import parse_end, parse_killed, reap_script, unsettled_mark


END_MARK = "@@kit-job-end"

AFTER_MAX = 64 << 20
# The most of what follows END_MARK that kit keeps: FOLLOW_SCRIPT's ending (each small file up to 4000 bytes)
ENDING_MAX = AFTER_MAX + len(ENDING) * 4200


def parse_ending(lines: list[str]) -> dict[str, str]:
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith("@@") and line[2:] in (*ENDING, AFTER):
            current = found.setdefault(line[2:], [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip() for name, lines in found.items()}


def parse_reaped(text: str) -> dict[str, int]:
    """host -> processes the supervisor stopped, from its `reaped` file (which a rank could write: read strictly)."""
    found = {}
    for line in text.splitlines():
        host, _, count = line.rpartition(" ")
        if host and count.isascii() and count.isdigit():
            found[host[:200]] = int(count)
    return found


def parse_unsettled(text: str, hosts: set[str]) -> dict[str, str]:
    """host -> what its sweep was still stopping, from the supervisor's `unsettled` file (a rank could write it: only
    the cluster's hosts, and what parse_killed lets through)."""
    found = {}
    for line in text.splitlines():
        host, _, killed = line.partition(" ")
        if host in hosts:
            found[host] = parse_killed("0\nkilled:" + killed)
    return found


def parse_after(text: str) -> dict[str, dict[str, str]] | None:
    """host -> its workspace's manifest at the end, from AFTER; None when it is not whole (kit reads them then)."""
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        return None
    return {host: workspace.parse_manifest(text) for host, text in raw.items()}


@dataclass
class End:
    """The follower's END_MARK line (the job's exit code, or none when its supervisor never came or left none) and
    what follows it (the ending, FOLLOW_SCRIPT's), up to ENDING_MAX. A job can write END_MARK into its own log: the
    follower's own comes last, so each mark starts the ending anew, and what follows one is never kept unbounded."""

    code: int | None = None
    seen: bool = False
    rest: list[str] = field(default_factory=list)
    kept: int = 0  # the characters in rest

    def feed(self, line: str) -> bool:
        if line.startswith(END_MARK):
            value = line[len(END_MARK):].strip()
            self.code, self.seen = int(value) if re.fullmatch(r"-?\d{1,9}", value) else None, True
            self.rest, self.kept = [], 0
            return True
        if self.seen and self.kept + len(line) < ENDING_MAX:
            self.rest.append(line)
            self.kept += len(line) + 1
        return self.seen


def launch_ranks(line: str) -> list[str] | None:
    """The supervisor's line at each launch: the host of each rank."""
    return line.split()[1:] if line.startswith(RANKS_MARK + " ") or line == RANKS_MARK else None


# A job's supervisor and launcher, from the process table (never from a file of the job's folder, which the job can
# write): sup_of ID: the process carrying KIT_SUPERVISOR=ID whose command line ends with the job's plan and, in kit's
# containers (pid 1 named sshd, a name no other process can change), whose parent is outside the container
# (kit's `docker exec -d`: ppid 0, which no process of a job can make its own); launcher_of ID: its child carrying
# KIT_JOB=ID.
_PID = ("sup_of() {{ kc=0; [ \"$(cat /proc/1/comm 2>/dev/null)\" = sshd ] && kc=1; "
        "for p in /proc/[0-9]*; do [ \"$(tr '\\0' '\\n' < $p/cmdline 2>/dev/null | tail -n 1)\" = {folder}/plan.json ] "
        "&& {{ [ $kc = 0 ] || sed -n 's/^PPid:[[:space:]]*//p' $p/status 2>/dev/null | grep -qx 0; }} "
        "&& tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx \"KIT_SUPERVISOR=$1\" && echo ${{p#/proc/}} && return 0; done; "
        "return 1; }}; launcher_of() {{ s=$(sup_of $1) || return 1; for p in /proc/[0-9]*; do "
        "sed -n 's/^PPid:[[:space:]]*//p' $p/status 2>/dev/null | grep -qx \"$s\" && "
        "tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx \"KIT_JOB=$1\" && echo ${{p#/proc/}} && return 0; done; return 1; }}; ")


def follow_script(folder: str, job_id: str, first: int = 1, ending: bool = False) -> str:
    """sh for the primary's container: the job's output from its line `first` (1: its start) while it runs, then
    END_MARK and its exit code (none when it left none), and with `ending` what the supervisor recorded at the end
    (FOLLOW_SCRIPT). Ctrl-C or a dropped session ends the following, never the job."""
    mode = "ending" if ending else "follow"
    return "exec " + shlex.join(["python", "-I", "-c", FOLLOW_SCRIPT, folder, job_id, str(int(first)), mode])


def log_command(container: str, folder: str) -> str:
    """`kit logs` without -f: the job's output as it is now (FOLLOW_SCRIPT's mode log)."""
    return command(exec_argv(container, ["python", "-I", "-c", FOLLOW_SCRIPT, folder, "", "1", "log"]))


# Runs in the primary's container (python -I: the workspace is no module's folder): a job's output.log from line
# `first`, read as a regular file only, never through a link (a FIFO or /dev/zero there is said, not read); mode
# log: what is there now; follow: while the job's supervisor runs (from the process table), then END_MARK and the
# first line of `exit`; ending: then each ENDING file and AFTER that is a regular file, after a line `@@NAME`.
FOLLOW_SCRIPT = r"""
import os, stat, sys, time
folder, job, first, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
plan, out = os.path.join(folder, "plan.json").encode(), sys.stdout.buffer
@APART@
def alive():
    for pid in os.listdir("/proc"):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if not pid.isdigit() or f.read(CMDLINE_MAX).rstrip(b"\0").split(b"\0")[-1] != plan:
                    continue
            if OUTSIDE and not apart(pid):
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                if ("KIT_SUPERVISOR=" + job).encode() in f.read(1 << 20).split(b"\0"):
                    return True
        except OSError:
            pass
    return False
def opened(name):
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return os.fdopen(fd, "rb")
    os.close(fd)
    return None
def lines(log, running):
    skip, last, checked = first - 1, b"\n", time.monotonic()
    left = None if running else os.fstat(log.fileno()).st_size  # (as it is now: not what a job adds while read)
    while True:
        block = log.read(1 << 16 if left is None else min(1 << 16, left))
        if not block:
            if left is not None or not running:
                break
            if time.monotonic() - checked > 1:
                running, checked = alive(), time.monotonic()
            time.sleep(0.05)
            continue
        left = None if left is None else left - len(block)
        while skip and block:
            cut = block.find(b"\n")
            block, skip = (b"", skip) if cut < 0 else (block[cut + 1:], skip - 1)
        if block:
            out.write(block)
            out.flush()
            last = block[-1:]
    if last != b"\n":
        out.write(b"\n")
for i in range(200):  # its supervisor, coming
    if mode == "log" or alive() or opened("exit"):
        break
    time.sleep(0.05)
log = opened("output.log")
if log is None:
    if os.path.lexists(os.path.join(folder, "output.log")):
        out.write(b"kit: the job's output.log is not a regular file (a link, a FIFO): not read\n")
    while mode != "log" and alive():  # (its end is still what the follower waits for)
        time.sleep(1)
else:
    lines(log, mode != "log" and alive())
if mode != "log":
    code = opened("exit")
    out.write(b"@END_MARK@ " + (code.read(100).split(b"\n")[0].strip() if code else b"") + b"\n")
if mode == "ending":
    for name, size in [(n, 4000) for n in @ENDING@] + [("@AFTER@", @AFTER_MAX@)]:
        f = opened(name)
        if f:
            out.write(b"@@" + name.encode() + b"\n" + f.read(size) + b"\n")
out.flush()
""".replace("@APART@\n", SUPERVISOR_APART).replace("@END_MARK@", END_MARK).replace("@ENDING@", repr(ENDING)).replace("@AFTER@", AFTER).replace(
    "@AFTER_MAX@", str(AFTER_MAX))


def follow_command(container: str, folder: str, job_id: str, first: int = 1, ending: bool = False) -> str:
    return command(exec_argv(container, ["sh", "-c", follow_script(folder, job_id, first, ending)]))


def interrupt_command(container: str, folder: str, job_id: str) -> str:
    """The job marked as stopped by its user, and SIGINT to its launcher (horovodrun, or the fanout script),
    which stops its ranks as for Ctrl-C; to that process only if it is still the job's."""
    d = shlex.quote(folder)
    return command(exec_argv(container, ["timeout", "-s", "KILL", "50", "sh", "-c", _PID.format(folder=d) +
        # (written to a file of its own, then renamed: never through a FIFO or a link the job put there)
        f"t=$(mktemp {d}/.stopped.XXXXXX) && date +%s > \"$t\" && rm -rf {d}/stopped && mv -Tf \"$t\" {d}/stopped; "
        f"p=$(launcher_of {job_id}) && kill -INT $p; true"]))


def reap_command(container: str, job_id: str) -> str:
    """Kill every process in the container that belongs to the job; print how many."""
    return command(["docker", "exec", container, "sh", "-c", reap_script(job_id)])


@dataclass
class Swept:
    killed: dict[str, int] = field(default_factory=dict)     # host -> processes of the job stopped
    unsettled: dict[str, str] = field(default_factory=dict)  # host -> what its last round still stopped (PID:NAME ...)


def sweep(nodes: list[Node], job_id: str, strict: bool = False, bound: float = REAP_FOR_S) -> Swept:
    """Kill what is left of the job on every host at once, again while a round killed something, for at most
    `bound` seconds (a process the job started on one host through an SSH connection from another's is adopted, so
    stopped, once that client is gone: a hop of a chain a round). A host whose last round still killed something did
    not settle: named with what it killed, and marked so that no job starts there (launch.UNSETTLED; a later sweep that
    kills nothing there takes the mark away). A host whose container no longer runs (or is gone) has nothing left;
    with strict, a host where the reap itself failed is an error naming it (HostsFailed), never a count of none."""
    def one(n: Node) -> tuple[int, str]:
        r = n.runner.run(reap_command(n.place.container, job_id), timeout=60)
        if r.ok:
            return parse_end(r.stdout)[0] or 0, parse_killed(r.stdout)
        if strict and not any(gone in r.stderr for gone in ("is not running", "No such container")):
            r.check(f"cannot end what is left of job {job_id} in {n.place.container}")
        return 0, ""
    done = Swept(dict.fromkeys((n.name for n in nodes), 0))
    deadline, last = time.monotonic() + bound, []
    while True:
        last = fan_out("stopping what is left of the job", nodes, one, lambda n: n.name)
        for node, (c, _) in zip(nodes, last):
            done.killed[node.name] += c
        if not any(c for c, _ in last) or time.monotonic() >= deadline:
            break
        time.sleep(REAP_SETTLE_S)  # (a connection whose client is gone: its sshd's process sees the end)
    for node, (c, killed) in zip(nodes, last):
        if c:
            done.unsettled[node.name] = killed or "?"
            node.runner.run(command(exec_argv(node.place.container, ["sh", "-c", unsettled_mark(job_id, killed)])),
                            timeout=60)
    done.killed = {name: c for name, c in done.killed.items() if c}
    return done


def stacks(nodes: list[Node], job_id: str) -> dict[tuple[str, int], str]:
    """(host, rank) -> the rank's Python stack now, on every host at once."""
    def one(n: Node) -> dict[int, str]:
        r = n.runner.run(command(exec_argv(n.place.container, heartbeats.stacks_argv(job_id))), timeout=120)
        return heartbeats.parse_stacks(r.check(f"cannot read the stacks of job {job_id}").stdout)
    found = fan_out("reading every rank's stack", nodes, one, lambda n: n.name)
    return {(n.name, rank): text for n, by_rank in zip(nodes, found) for rank, text in by_rank.items()}


def beats(nodes: list[Node], job_id: str, ranks: tuple[str, ...]) -> list[heartbeats.Beat]:
    """Every rank's heartbeat now, read in each host's container at once (as the supervisor reads them); ranks: the
    host of each (the record's), whose beats alone count."""
    def one(n: Node) -> list[heartbeats.Beat]:
        r = n.runner.run(command(exec_argv(n.place.container, ["sh", "-c", heartbeats.progress_script(job_id)])),
                         timeout=60)
        return heartbeats.parse_beats(n.name, r.check(f"cannot read the heartbeats of job {job_id}").stdout)
    return heartbeats.placed([b for found in fan_out("reading every rank's heartbeat", nodes, one, lambda n: n.name)
                              for b in found], ranks)


@dataclass
class Stopped:
    ended_by_itself: bool                 # the launcher ended on SIGINT within the bound
    killed: dict[str, int]                # host -> processes kit had to kill
    unsettled: dict[str, str] = field(default_factory=dict)  # host -> what its sweep was still stopping at its bound


def stop(nodes: list[Node], job_id: str, wait: float = STOP_WAIT_S) -> Stopped:
    """Stop a job everywhere within a bound: SIGINT to its launcher (which stops its ranks), then whatever is left
    of it on any host, killed; its supervisor, untouched, records the end. nodes[0] is the primary."""
    primary = nodes[0]
    folder, container = primary.place.job_dir(job_id), primary.place.container
    primary.runner.run(interrupt_command(container, folder, job_id), timeout=60).check(f"cannot stop job {job_id}")
    ended = primary.runner.run(_gone(container, folder, f"launcher_of {job_id}", wait), timeout=wait + 60).ok
    swept = sweep(nodes, job_id, strict=True)
    # The supervisor records the end after its own sweep (up to REAP_FOR_S): `kit jobs` right after `kit stop` says
    # stopped, not stopping. A supervisor already gone (killed with its container) is not waited for.
    primary.runner.run(_gone(container, folder, f"sup_of {job_id}", REAP_FOR_S + 5), timeout=REAP_FOR_S + 65)
    return Stopped(ended, swept.killed, swept.unsettled)


def _gone(container: str, folder: str, finds: str, wait: float) -> str:
    """sh for the primary's container: exit 0 once `finds` (a function of _PID) finds nothing, 1 after wait s."""
    return command(exec_argv(container, ["timeout", "-s", "KILL", str(int(wait) + 30), "sh", "-c",
                                         _PID.format(folder=shlex.quote(folder)) +
                                         f"end=$(($(date +%s) + {int(wait)})); while [ $(date +%s) -lt $end ]; do "
                                         f"{finds} >/dev/null || exit 0; sleep 0.25; done; exit 1"]))


class Interrupted(KitError):
    exit_code = 130

    def __init__(self, job_id: str, leftovers: dict[str, int]) -> None:
        stopped = ", ".join(f"{n} on {h}" for h, n in leftovers.items()) or "none left"
        super().__init__(f"interrupted: job {job_id} was stopped on every host (processes kit stopped: {stopped})",
                         hint=f"`kit logs {job_id}` shows its output")
