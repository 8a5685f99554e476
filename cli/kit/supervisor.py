"""A job's supervisor, and the launch commands it starts: Python's standard library only.

kit sends this module's source to the primary's container, where it runs as the job's supervisor
(`python -c SOURCE PLAN`), apart from kit's session: it starts the launcher (horovodrun, or a script that
starts torchrun or a TF worker on every host over the cluster SSH), keeps the job's record in its folder
(pid, output.log, started, ended, exit), watches the ranks' progress (the rank launcher's heartbeat, see
kit.commands.horovod) and, by the job's failure policy, starts it again on the hosts that still answer
(`kit run --restarts N --min-np M`) with KIT_RESTART=<n> in its environment. kit imports the same builders
(horovodrun, torchrun_argv, fanout_script, ...) for the first launch, so a restart is launched as the first.

Every process of a job carries KIT_JOB=<id>; the supervisor carries KIT_SUPERVISOR=<id> alone, so stopping
what is left of a job (reap_script) never stops the supervisor, which records the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass

# The job's own variables (`kit run -e`), one JSON object a job, written by kit into every host's container before
# the job starts and removed when it ends: a rank reads them from there, so their values are on no command line.
ENV_DIR = "/run/kit/env"
# Each rank's heartbeat, in its host's container: /run/kit/progress/<job>/<rank>, one JSON line (the rank launcher's,
# kit.commands.horovod); KIT_PROGRESS_DIR moves it (the unit tests give each stand-in host its own).
PROGRESS_DIR = "/run/kit/progress"
PROGRESS = f"${{KIT_PROGRESS_DIR:-{PROGRESS_DIR}}}"  # the same, in sh
# Variables of the primary's container that the commands on every host need (an SSH session starts with sshd's
# environment, not the image's).
FORWARDED = ("PATH", "VIRTUAL_ENV", "LANG", "LC_ALL", "PYTHONUNBUFFERED", "KIT_JOB", "KIT_ENV", "KIT_RESTART")
# torchrun prefixes every line of a worker with its global rank, as horovodrun does.
TORCHRUN_PREFIX = "[${rank}]<stdout>:"
# Lines the supervisor writes in the job's output for kit: the host of each rank of the launch that starts now.
RANKS_MARK = "@@kit-ranks"
# Placeholders of a torchrun node command that depend on the hosts of the launch (filled by for_hosts()).
NNODES, NODE_RANK, MASTER_PORT = "@KIT_NNODES@", "@KIT_NODE_RANK@", "@KIT_MASTER_PORT@"
MASTER_ADDR = "@KIT_MASTER_ADDR@"  # node 0's address: the store's (it is not the primary's when -H leaves that out)
SSH = ("ssh", "-n", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
# The supervisor's own SSH to a host goes over one connection (its first command opens it, the others ride on it;
# it closes itself ten minutes after the last): its calls at the job's end, every heartbeat read and the next job's
# start cost no handshake. A launch's own SSH (the fanout script's) rides it where it is there, and never opens one:
# a connection opened by a job's process would carry the job's mark, and be stopped with what is left of the job.
CONNECTION = ("-o", "ControlPath=/tmp/kit-ssh-%C")
SHARED = (*CONNECTION, "-o", "ControlMaster=auto", "-o", "ControlPersist=600")
RIDE = (*CONNECTION, "-o", "ControlMaster=no")
STOP_WAIT_S = 20        # SIGINT to the launcher, then this long before what is left is killed
REMOTE_TIMEOUT_S = 60   # one remote step of the supervisor (a heartbeat read, a reap, a stack dump)


# ------------------------------------------------------------------------------------------------ launch commands

@dataclass(frozen=True)
class Slot:
    host: str      # the name in hosts.txt
    address: str   # where the containers reach it
    slots: int


def placement(slots: list[Slot], np: int) -> list[Slot]:
    """The host of each rank: horovodrun fills the hosts in -H order, each up to its slots."""
    ranks = [s for s in slots for _ in range(s.slots)]
    return ranks[:np]


def hosts_arg(slots: list[Slot], np: int) -> str:
    used: dict[str, int] = {}
    for s in placement(slots, np):
        used[s.address] = used.get(s.address, 0) + 1
    return ",".join(f"{address}:{count}" for address, count in used.items())


def horovodrun(np: int, slots: list[Slot], port: int, nics: list[str], args: list[str], here: str = "") -> list[str]:
    """horovodrun over Gloo; args: its options, then what each rank runs; here: the address of the host it runs on
    (default: the first host's)."""
    # A job on horovodrun's own host alone is local to it (it talks over loopback): naming a NIC would contradict it.
    local = {s.address for s in placement(slots, np)} == {here or slots[0].address}
    nic = [] if local else ["--network-interface", ",".join(nics)]
    return ["horovodrun", "--gloo", "-np", str(np), "-H", hosts_arg(slots, np), "-p", str(port), *nic, *args]


@dataclass(frozen=True)
class NodeCommand:
    host: str          # the name in hosts.txt
    address: str       # where the primary's container reaches it
    argv: tuple[str, ...]
    rank: int | None   # every line is this rank's (tf: one worker a host); None: lines carry their rank


def torchrun_argv(nodes: int | str, nproc: int, node_rank: int | str, master: str, port: int | str,
                  command: list[str]) -> list[str]:
    """One node of a static rendezvous: the c10d store on the primary's cluster address, node ranks in the
    inventory's order (hosts.txt), so global ranks are node_rank * nproc + local rank."""
    return ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={nproc}", f"--node-rank={node_rank}",
            f"--master-addr={master}", f"--master-port={port}", "--tee=3", "--no-python", *command]


def torch_ranks(slots: list[Slot], nproc: int | None) -> list[Slot]:
    """The host of each global rank: torchrun numbers node 0's workers first, then node 1's..."""
    return [s for s in slots for _ in range(nproc or s.slots)]


def _filter(node: NodeCommand) -> str:
    """sed (unbuffered: lines stream) that makes each line of a host's output a rank line, or labels it
    with the host."""
    if node.rank is not None:
        program = f"s/^/[{node.rank}]<stdout>:/"
    else:
        program = f"/^\\[[0-9]*\\]<std\\(out\\|err\\)>:/!s/^/{node.host}: /"
    return "sed -u " + shlex.quote(program)


def fanout_script(workspace: str, nodes: list[NodeCommand]) -> str:
    """bash for the primary's container: every host's command at once over the cluster SSH; lines as they
    come; at the first failure the others' SSH sessions are closed (what is left is then stopped on every
    host by KIT_JOB). Exits 0, or with the first failure's status."""
    lines = [
        "set -m -o pipefail  # job control: each host's pipeline is a process group, stopped as one",
        "stop() { for group in $(jobs -p); do kill -- -$group 2>/dev/null; done; }",
        "trap 'stop; exit 130' INT TERM",
        "fwd=''; for v in " + " ".join(FORWARDED) + "; do [ -n \"${!v}\" ] && fwd+=\"$v=$(printf %q \"${!v}\") \"; done",
        "declare -A running",
    ]
    for n in nodes:
        remote = shlex.quote(shlex.join(n.argv))
        # a group, not a bare pipeline: once job control has reaped a job, `wait PID` gives its last process's
        # status, which for a bare pipeline is sed's (0), not ssh's (pipefail); the group's is the pipeline's
        lines.append(f"{{ ssh {shlex.join(RIDE)} {shlex.quote(n.address)} \"cd {shlex.quote(workspace)} && exec env $fwd\" "
                     f"{remote} < /dev/null 2>&1 | {_filter(n)}; }} &")
        lines.append(f"running[$!]={shlex.quote(n.host)}")
    lines += [
        "code=0",
        "while [ ${#running[@]} -gt 0 ]; do",
        "  ended=''; wait -n -p ended 2>/dev/null; rc=$?  # (without the job-control chatter about stopped jobs)",
        "  if [ -z \"$ended\" ]; then  # job control reaped it first: bash keeps the group's status for `wait PID`",
        "    for ended in \"${!running[@]}\"; do wait \"$ended\" 2>/dev/null; rc=$?; break; done",
        "  fi",
        "  host=${running[$ended]}; unset \"running[$ended]\"",
        "  if [ $rc -ne 0 ] && [ $code -eq 0 ]; then",
        "    code=$rc; echo \"$host: its processes ended with status $rc; stopping the others\"",
        "    stop",
        "  fi",
        "done",
        "exit $code",
    ]
    return "\n".join(lines) + "\n"


def reap_script(job_id: str) -> str:
    """Kill every process of the job; print how many. The job's processes carry KIT_JOB=<id>; their descendants
    belong to it too, whatever their environment (a rank may start children with `env -i`)."""
    return (
        f"job=KIT_JOB={job_id}; pids=' '; "
        "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx \"$job\" && pids=\"$pids${p#/proc/} \"; done; "
        # descendants, generation by generation (bounded: each round adds a process, or ends)
        "while :; do more=''; for p in /proc/[0-9]*; do pid=${p#/proc/}; case \"$pids\" in *\" $pid \"*) continue;; esac; "
        "ppid=$(sed -n 's/^PPid:[[:space:]]*//p' $p/status 2>/dev/null); "
        "case \"$pids\" in *\" $ppid \"*) more=\"$more$pid \";; esac; done; "
        "[ -z \"$more\" ] && break; pids=\"$pids$more\"; done; "
        f"n=0; for pid in $pids; do kill -9 $pid 2>/dev/null && n=$((n+1)); done; rm -rf \"{PROGRESS}/{job_id}\"; echo $n")


# A host's workspace: each file's sha256 (find follows no link: a link the job made is neither hashed nor copied).
MANIFEST = "cd {workspace} 2>/dev/null && find . -type f -print0 | xargs -0 -r sha256sum"
MANIFEST_MARK = "@@kit-manifest"
# sha256sum's escapes in a name that holds a backslash or a line break (its line then starts with a backslash)
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}


def manifest_line(name: str, digest: str) -> str:
    """A line of MANIFEST's output, as sha256sum writes it: whatever the name holds, it is one line."""
    escaped = "".join(_ESCAPES.get(c, c) for c in name)
    return ("\\" if escaped != name else "") + f"{digest}  ./{escaped}\n"


def parse_manifest(text: str) -> dict[str, str]:
    """name -> sha256 from MANIFEST's lines (sha256sum's, or manifest_line's), each name as it is on disk: lines end
    at a line feed alone (a job's file name may hold any other separator of str.splitlines)."""
    found = {}
    for line in text.split("\n"):
        digest, _, name = line.partition("  ")
        if line.startswith("\\"):
            digest, name = digest[1:], re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m[1], m[1]), name)
        if name:
            found[name.removeprefix("./")] = digest
    return found


def end_script(job_id: str, workspace: str | None) -> str:
    """At a job's end, in a host's container: what is left of it killed (the count), then, given the workspace, the
    workspace's manifest after MANIFEST_MARK (what the job wrote there, for kit to copy to the other hosts)."""
    if workspace is None:
        return reap_script(job_id)
    return f"{reap_script(job_id)}; echo {MANIFEST_MARK}; {MANIFEST.format(workspace=shlex.quote(workspace))}"


def parse_end(text: str) -> tuple[int | None, str | None]:
    """(processes killed, the workspace's manifest or None) from the output of end_script()."""
    count, _, manifest = text.partition(MANIFEST_MARK + "\n")
    first = count.strip().splitlines()[:1]
    killed = int(first[0]) if first and first[0].isascii() and first[0].isdigit() else None
    return killed, manifest if MANIFEST_MARK in text else None


def discovery_script(hosts: list[Slot]) -> str:
    """sh that prints `address:slots` of each host whose container answers over the cluster SSH now, in the
    inventory's order: horovodrun's --host-discovery-script format, and how a restart finds its hosts. Every
    host is tried at once, each within ConnectTimeout."""
    probe = shlex.join([*SSH[:-1], "ConnectTimeout=5"])
    lines = ["#!/bin/sh", "# kit: the hosts of this job that answer now (address:slots)",
             'out=$(mktemp -d) || exit 1', "trap 'rm -rf \"$out\"' EXIT"]
    for i, h in enumerate(hosts):
        lines.append(f"({probe} {shlex.quote(h.address)} true >/dev/null 2>&1 && "
                     f"echo {shlex.quote(f'{h.address}:{h.slots}')} > \"$out/{i}\") &")
    lines += ["wait", f"for i in {' '.join(str(i) for i in range(len(hosts)))}; do "
              "cat \"$out/$i\" 2>/dev/null; done; exit 0"]
    return "\n".join(lines) + "\n"


def parse_discovery(text: str, hosts: list[Slot]) -> list[Slot]:
    """The hosts a discovery script's output names, in the inventory's order."""
    answered = {line.strip().rsplit(":", 1)[0] for line in text.splitlines() if ":" in line}
    return [h for h in hosts if h.address in answered]


# ---------------------------------------------------------------------------------------------- ranks' heartbeats

# In each host's container: every heartbeat of the job, one JSON line each (see heartbeat()).
def progress_script(job_id: str) -> str:
    return (f"for f in \"{PROGRESS}/{job_id}\"/*; do case \"$f\" in *.new) continue;; esac; "  # (one being written)
            "[ -f \"$f\" ] && head -c 2000 \"$f\" && echo; done; true")


# In each host's container: every rank's Python stack (py-spy), each after a line `@@kit-stack RANK PID`; only
# for a pid that carries the job's mark (a rank writes its heartbeat: its pid is not taken on trust).
STACKS = r"""
import json, os, subprocess, sys, time
job = sys.argv[1]
folder = os.path.join(os.environ.get("KIT_PROGRESS_DIR", sys.argv[2]), job)
ranks, end = [], time.monotonic() + 30
for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
    if name.endswith(".new"):  # (one being written)
        continue
    try:
        with open(os.path.join(folder, name)) as f:
            beat = json.loads(f.read(2000))
        rank, pid = int(beat["rank"]), int(beat["pid"])
        with open("/proc/%d/environ" % pid, "rb") as f:
            if ("KIT_JOB=" + job).encode() not in f.read().split(b"\0"):
                continue
    except (OSError, ValueError, KeyError, TypeError):
        continue
    try:  # every rank at once: a rank stuck in the kernel can make py-spy wait its whole timeout
        ranks.append((rank, pid, subprocess.Popen(["py-spy", "dump", "--pid", str(pid)], stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True)))
    except OSError as e:
        print("@@kit-stack %d %d\npy-spy could not run: %s" % (rank, pid, e), flush=True)
for rank, pid, proc in ranks:
    try:
        out = proc.communicate(timeout=max(1.0, end - time.monotonic()))[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        out = "py-spy could not read it in 30 s (the process may be stuck in the kernel: D state)"
    print("@@kit-stack %d %d\n%s" % (rank, pid, out.strip()), flush=True)
"""


def stacks_argv(job_id: str) -> list[str]:
    return ["python", "-c", STACKS, job_id, PROGRESS_DIR]


def parse_stacks(text: str) -> dict[int, str]:
    """rank -> its stack, from the output of stacks_argv()."""
    found: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        parts = line.split()
        if line.startswith("@@kit-stack ") and len(parts) == 3 and parts[1].isdigit():
            current = found.setdefault(int(parts[1]), [])
        elif current is not None:
            current.append(line)
    return {rank: "\n".join(lines) for rank, lines in found.items()}


@dataclass(frozen=True)
class Beat:
    host: str
    rank: int
    moves: int     # how often the rank's main thread was seen somewhere else than before
    where: str     # where it is now: file:line in function


def parse_beats(host: str, text: str) -> list[Beat]:
    beats = []
    for line in text.splitlines():
        try:
            raw = json.loads(line)
            beats.append(Beat(host, int(raw["rank"]), int(raw["moves"]), str(raw["where"])[:300]))
        except (ValueError, KeyError, TypeError):
            continue  # a rank writes these: whatever is not a heartbeat is skipped
    return beats


def odd_ones(beats: list[Beat]) -> tuple[list[Beat], str]:
    """The ranks that are somewhere else than most, and where most are: only when more than half the ranks are in
    one place (with no such majority, none is named odd: the report lists where each rank is)."""
    if not beats:
        return [], ""
    common, count = Counter(b.where for b in beats).most_common(1)[0]
    if count * 2 <= len(beats):
        return [], ""
    return [b for b in beats if b.where != common], common


def hang_report(beats: list[Beat], seconds: float) -> str:
    odd, common = odd_ones(beats)
    if not beats:
        return f"no rank has started in {seconds:.0f} s"
    head = f"no rank has made progress for {seconds:.0f} s"

    def where(ranks: list[Beat]) -> str:
        return "; ".join(f"rank {b.rank} on {b.host} is at {b.where}" for b in sorted(ranks, key=lambda b: b.rank))
    if not common:
        return f"{head}: {where(beats)}"
    if not odd:
        return f"{head}: all {len(beats)} ranks wait at {common}"
    named = where(odd)
    rest = len(beats) - len(odd)
    return f"{head}: {named}; the other {rest} {'rank waits' if rest == 1 else 'ranks wait'} at {common}"


# ---------------------------------------------------------------------------------------------------- the job

@dataclass
class Plan:
    """What kit hands the supervisor (the job folder's plan.json)."""

    id: str
    folder: str
    workspace: str
    launcher: str                    # horovod, torchrun, tf
    hosts: list[Slot]                # the job's hosts: the cluster's in the inventory's order, or -H's
    np: int                          # horovod: processes
    nproc: int | None                # torchrun: processes a host (None: its slots)
    port: int                        # the cluster's SSH port
    nics: list[str]
    args: list[str]                  # horovod: horovodrun's options, then the rank command; torchrun: the rank command
    nodes: list[NodeCommand]         # tf: each host's command (a launch on every host, never restarted)
    restarts: int = 0
    min_np: int = 1
    hang_timeout: float = 0          # seconds; 0: no watch
    env: bool = False                # the job has variables in every container (ENV_DIR), removed at its end
    here: str = ""                   # the address of the host whose container runs the supervisor ("": hosts[0])
    primary: str = ""                # that host's name, when it is none of the job's hosts
    spread: bool = False             # copy storage: each host's workspace is read at the end (what the job wrote)

    @classmethod
    def load(cls, text: str) -> "Plan":
        raw = json.loads(text)
        raw["hosts"] = [Slot(**h) for h in raw["hosts"]]
        raw["nodes"] = [NodeCommand(n["host"], n["address"], tuple(n["argv"]), n["rank"]) for n in raw["nodes"]]
        return cls(**raw)

    def dump(self) -> str:
        return json.dumps({**self.__dict__, "hosts": [h.__dict__ for h in self.hosts],
                           "nodes": [n.__dict__ for n in self.nodes]})

    def is_here(self, host: Slot) -> bool:
        """Whether the host is the one the supervisor runs on (the primary), which is not always one of the job's."""
        return host.address == (self.here or self.hosts[0].address)

    def np_on(self, hosts: list[Slot]) -> int:
        """Processes of a launch on these hosts."""
        if self.launcher == "horovod":
            return min(self.np, sum(h.slots for h in hosts))
        return len(torch_ranks(hosts, self.nproc)) if self.launcher == "torchrun" else len(hosts)

    def launch(self, hosts: list[Slot], port: int) -> tuple[list[str], list[str]]:
        """(the launcher's argv, the host of each rank) for a launch on these hosts; port: torchrun's store."""
        if self.launcher == "horovod":
            np = self.np_on(hosts)
            return (horovodrun(np, hosts, self.port, self.nics, self.args, self.here),
                    [s.host for s in placement(hosts, np)])
        if self.launcher == "torchrun":
            by_host = {n.host: n for n in self.nodes}
            nodes = [fill(by_host[h.host], {NNODES: str(len(hosts)), NODE_RANK: str(i), MASTER_ADDR: hosts[0].address,
                                            MASTER_PORT: port}) for i, h in enumerate(hosts)]
            ranks = [s.host for s in torch_ranks(hosts, self.nproc)]
        else:
            nodes, ranks = self.nodes, [h.host for h in hosts]
        return ["bash", "-c", fanout_script(self.workspace, nodes)], ranks


def fill(node: NodeCommand, values: dict[str, str]) -> NodeCommand:
    """A torchrun node command with its placeholders filled: in torchrun's own options only (the script's
    arguments, after --no-python, are the user's and stay as they are)."""
    end = node.argv.index("--no-python") if "--no-python" in node.argv else len(node.argv)
    head = []
    for a in node.argv[:end]:
        for mark, value in values.items():
            a = a.replace(mark, value)
        head.append(a)
    return NodeCommand(node.host, node.address, (*head, *node.argv[end:]), node.rank)


def _write(folder: str, name: str, text: str) -> None:
    with open(os.path.join(folder, name), "w") as f:
        f.write(text + "\n")


class Supervisor:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.hosts = list(plan.hosts)  # those of the last launch
        self.log = open(os.path.join(plan.folder, "output.log"), "a", buffering=1)

    def say(self, text: str) -> None:
        self.log.write(f"kit: {text}\n")

    def stopped(self) -> bool:
        return os.path.exists(os.path.join(self.plan.folder, "stopped"))

    def remote(self, host: Slot, argv: list[str], timeout: float = REMOTE_TIMEOUT_S) -> subprocess.CompletedProcess:
        """A command in a host's container: here for the primary, over the cluster SSH for the others."""
        # An SSH session starts with sshd's environment: the image's PATH (its venv: python, py-spy) goes along.
        full = argv if self.plan.is_here(host) else \
            [*SSH, *SHARED, host.address, shlex.join(["env", f"PATH={os.environ.get('PATH', '')}", *argv])]
        try:
            r = subprocess.run(full, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
            return subprocess.CompletedProcess(full, r.returncode, _text(r.stdout), _text(r.stderr))
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(full, 124, "", f"no answer from {host.host} in {timeout:.0f} s")

    def connect(self, hosts: list[Slot]) -> None:
        """Each host's shared connection (SHARED), the primary's own too where a fanout launch reaches it over SSH."""
        launched_here = [h.address for h in hosts if self.plan.is_here(h) and self.plan.nodes]
        # (a host that does not answer: the launch says so)
        at_once([h.address for h in hosts if not self.plan.is_here(h)] + launched_here,
                lambda address: _run_quietly(ssh_argv(address, "true")))

    def on_all(self, hosts: list[Slot], argv: list[str]) -> list[subprocess.CompletedProcess]:
        return at_once(hosts, lambda h: self.remote(h, argv))

    def run(self) -> int:
        plan, folder = self.plan, self.plan.folder
        _write(folder, "discover", discovery_script(plan.hosts))
        os.chmod(os.path.join(folder, "discover"), 0o755)
        hosts, attempt, left_out = list(plan.hosts), 0, []
        while True:
            self.hosts = hosts
            code = self.attempt(hosts, attempt)
            if code == 0 or self.stopped() or attempt >= plan.restarts:
                break
            _write(folder, "phase", "restarting")
            self.on_all(hosts, ["sh", "-c", reap_script(plan.id)])  # what is left of this launch, on every host
            # (the script from here, not its copy in the job's folder, which the job's ranks could change)
            try:  # (each host's ssh in it has its own ConnectTimeout; this bounds the whole)
                found = subprocess.run(["sh", "-c", discovery_script(plan.hosts)], capture_output=True, text=True,
                                       timeout=120).stdout
            except subprocess.TimeoutExpired as e:
                found = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
            alive = parse_discovery(found, hosts)
            alive = [h for h in hosts if h in alive or plan.is_here(h)]  # the supervisor's host answers
            gone = [h for h in hosts if h not in alive]
            if self.stopped():
                break
            if plan.np_on(alive) < plan.min_np:
                self.say(f"cannot start the job again: {plan.np_on(alive)} processes fit on the hosts that answer "
                         f"({', '.join(h.host for h in alive)}), and --min-np is {plan.min_np}")
                break
            attempt += 1
            left_out += [h.host for h in gone]
            _write(folder, "restarts", str(attempt))
            _write(folder, "left_out", " ".join(left_out))
            self.say(f"restart {attempt} of {plan.restarts}: " +
                     (f"left out {', '.join(h.host for h in gone)} (no answer); " if gone else "") +
                     f"{plan.np_on(alive)} processes on {', '.join(h.host for h in alive)}, KIT_RESTART={attempt}")
            hosts = alive
            if self.stopped():  # (kit stop while this launch was being prepared)
                break
        if os.path.exists(os.path.join(folder, "phase")):
            os.remove(os.path.join(folder, "phase"))
        return code

    def attempt(self, hosts: list[Slot], attempt: int) -> int:
        plan = self.plan
        port = self.store_port(hosts[0]) if plan.launcher == "torchrun" else 0
        argv, ranks = plan.launch(hosts, str(port))
        _write(plan.folder, "ranks", " ".join(ranks))
        self.log.write(f"{RANKS_MARK} {' '.join(ranks)}\n")
        env = {k: v for k, v in os.environ.items() if k != "KIT_SUPERVISOR"}
        env.update(KIT_JOB=plan.id, KIT_RESTART=str(attempt))
        proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=plan.workspace, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        _write(plan.folder, "pid", str(proc.pid))
        # Each host's shared connection, opened while the launcher starts (not when the job's end waits for it); the
        # fanout script reaches the primary over SSH too
        threading.Thread(target=self.connect, args=(hosts,), daemon=True).start()
        watch = Watch(plan.hang_timeout)
        while proc.poll() is None:
            try:
                proc.wait(timeout=watch.every)
                break
            except subprocess.TimeoutExpired:
                pass
            if plan.hang_timeout and watch.stalled(self.beats(hosts)):
                self.hung(hosts, watch)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
                self.on_all(hosts, ["sh", "-c", reap_script(plan.id)])
        code = proc.wait()
        return 128 - code if code < 0 else code  # killed by a signal: as a shell says it

    def store_port(self, host: Slot) -> int:
        """A port free now on node 0 of a torchrun launch, for its store: here, or asked there."""
        if self.plan.is_here(host):
            return free_port()
        found = self.remote(host, ["python", "-c", FREE_PORT]).stdout.strip()
        return int(found) if found.isdigit() else free_port()  # (a node that does not answer fails the launch)

    def finish(self) -> None:
        """On the hosts of the last launch and the primary, at once: what is left of the job stopped (each host's
        count in `reaped`) and, to spread, each host's workspace as it is now (`after.json`, host -> manifest)."""
        plan = self.plan
        hosts = self.hosts + ([] if any(plan.is_here(h) for h in self.hosts) else [Slot(plan.primary, plan.here, 0)])
        ends = self.on_all(hosts, ["sh", "-c", end_script(plan.id, plan.workspace if plan.spread else None)])
        found = {h.host: parse_end(r.stdout) for h, r in zip(hosts, ends) if r.returncode == 0}
        _write(plan.folder, "reaped", "\n".join(f"{host} {n}" for host, (n, _) in found.items() if n))
        if plan.spread:
            _write(plan.folder, "after.json", json.dumps({host: m for host, (_, m) in found.items() if m is not None}))

    def beats(self, hosts: list[Slot]) -> list[Beat]:
        found = self.on_all(hosts, ["sh", "-c", progress_script(self.plan.id)])
        return [b for h, r in zip(hosts, found) for b in parse_beats(h.host, r.stdout)]

    def hung(self, hosts: list[Slot], watch: "Watch") -> None:
        """Every rank's stack into the job's folder, and which rank(s) differ from the others, named."""
        stacks = os.path.join(self.plan.folder, "stacks")
        os.makedirs(stacks, exist_ok=True)
        for h, r in zip(hosts, self.on_all(hosts, stacks_argv(self.plan.id))):
            for rank, text in parse_stacks(r.stdout).items():
                _write(stacks, f"rank-{rank}.txt", f"rank {rank} on {h.host}\n{text}")
        report = hang_report(watch.last, watch.quiet())
        _write(self.plan.folder, "hang", report)
        self.say(f"{report}. Every rank's stack: {stacks}; stopping the job")


class Watch:
    """Whether any rank has moved lately: by the heartbeats' counters, on the supervisor's own clock."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.every = max(1.0, min(30.0, timeout / 6)) if timeout else 3600.0
        self.since = time.monotonic()   # the last time any rank moved (or the launch)
        self.seen: dict[tuple[str, int], int] = {}
        self.last: list[Beat] = []

    def stalled(self, beats: list[Beat]) -> bool:
        """A rank moved when its counter changed, or it is new; a rank missing from this reading (its host did not
        answer in time) is not progress."""
        moved = {(b.host, b.rank): b.moves for b in beats}
        if any(self.seen.get(rank) != count for rank, count in moved.items()):
            self.since = time.monotonic()
        self.seen = {**self.seen, **moved}
        self.last = beats
        return self.quiet() >= self.timeout

    def quiet(self) -> float:
        return time.monotonic() - self.since


# A port nothing listens on now, from the kernel's ephemeral range (python -c, in a host's container).
FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def free_port() -> int:
    s = socket.socket()
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def at_once(hosts: list[Slot], step) -> list:
    """step(host) for every host at once, each in its own thread; the results in the hosts' order."""
    results: list = [None] * len(hosts)

    def one(i: int) -> None:
        results[i] = step(hosts[i])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def tidy_env(plan: Plan, env_dir: str = ENV_DIR) -> None:
    """The job's variables removed from every host's container, also when no kit waits for the job any more; a
    host where that failed goes in env_kept."""
    path = os.path.join(env_dir, plan.id)
    kept = []

    def one(h: Slot) -> None:
        try:
            r = subprocess.run([*SSH, *SHARED, h.address, shlex.join(["rm", "-f", path])], capture_output=True,
                               timeout=REMOTE_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                kept.append(h.address)
        except subprocess.TimeoutExpired:
            kept.append(h.address)
    at_once([h for h in plan.hosts if not plan.is_here(h)], one)
    if os.path.exists(path):
        os.remove(path)
    if kept:
        _write(plan.folder, "env_kept", "\n".join(kept))


def main(plan_path: str) -> None:
    with open(plan_path) as f:
        plan = Plan.load(f.read())
    folder = plan.folder
    _write(folder, "launcher", plan.launcher)
    _write(folder, "started", str(int(time.time())))
    _write(folder, "supervisor", str(os.getpid()))
    supervisor = Supervisor(plan)
    code = 1
    try:
        code = supervisor.run()
        supervisor.finish()
    except Exception as e:  # noqa: BLE001 - said in the job's output, and the job still gets its end
        supervisor.say(f"the supervisor failed: {e!r}")
    finally:
        if plan.env:
            tidy_env(plan)
        _write(folder, "ended", str(int(time.time())))
        _write(folder, "exit", str(code))


# The lines the starter answers kit with (start()).
MANIFEST_END, COPIED, HOSTS, STARTED = "@@kit-manifest-end", "@@kit-copied", "@@kit-hosts", "@@kit-started"
COPY_TIMEOUT_S = 3600   # one copy of a job's files to a host (a job's folder may hold GBs)


def start(inp, out) -> int:
    """kit's one conversation with the primary's container that starts a job (`python -c SOURCE --start`), in JSON
    lines on stdin, the starter answering on stdout:
    1. the request: the job's files written into its folder (kit's own names: the plan, what kit showed of the
       variables), the variables' file for this container's ranks, and this container's workspace, listed;
    2. {"tar": N} and N bytes: the job's files that the workspace lacks, unpacked there (in the container: what is
       in the workspace is the job's, and no link of it is followed outside);
    3. {"others": true}: the job's other hosts given, at once over the cluster SSH, what their workspaces lack of the
       job's files (from here, so that kit's own link carries each byte once) and their variables; what each got
       and had, or what failed there, answered after HOSTS;
    4. {"go": [kit's lines]}: the log begun with them, the supervisor started apart from this session (a session of
       its own, stdio on /dev/null: a closed laptop or a dropped VPN does not end the job), and, given a follow
       script, this process becomes the follower of the job's output.
    The end of stdin before 4, or an answer that finds no reader (kit stopped, its link dropped, or a host failed):
    the job's variables and folder are removed, here and where they were given, and nothing started."""
    request = json.loads(inp.readline())
    folder, job = request["folder"], os.path.basename(request["folder"])
    os.makedirs(folder, exist_ok=True)
    for name, text in request["files"].items():
        _write(folder, name, text.rstrip("\n"))
    env_text, workspace = request.get("env_file"), request["workspace"]
    if env_text is not None:
        os.makedirs(ENV_DIR, exist_ok=True)
        fd = os.open(os.path.join(ENV_DIR, job), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(env_text)
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
    argv = [sys.executable, "-c", request["source"], os.path.join(folder, "plan.json")]
    error = spawn_detached(argv, {**os.environ, **request["env"]}, os.path.join(folder, "supervisor"))
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


def _run_quietly(argv: list[str]) -> None:
    """A step whose failure nobody is left to hear, or another step will say (the job's variables removed from a host
    as kit goes; a shared connection opened ahead of the launch)."""
    try:
        subprocess.run(argv, capture_output=True, timeout=REMOTE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass


def ssh_argv(address: str, command: str, stdin: bool = False) -> list[str]:
    """The supervisor's SSH to a host's container (on its shared connection); stdin: the command reads ours."""
    return [*(a for a in SSH if a != "-n" or not stdin), *SHARED, address, command]


def give(host: dict, workspace: str, files: dict[str, str] | None, job: str, env_text: str | None) -> dict:
    """One other host of the job: what its workspace lacks of the job's files (files: name -> sha256; None where
    the hosts share the workspace), sent from here, and the job's variables. {"sent": N, "manifest": its workspace
    before, "env": given}, or {"error": what failed}."""
    address, ws = host["address"], shlex.quote(workspace)
    done: dict = {"sent": 0, "manifest": ""}
    try:
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
            r = subprocess.run(ssh_argv(address, f"umask 077 && mkdir -p {ENV_DIR} && cat > {ENV_DIR}/{job}",
                                        stdin=True), input=env_text.encode(), capture_output=True,
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


def _text(output: bytes) -> str:
    """A command's output as text: a job's file names and what its ranks write need not be UTF-8, and a carriage
    return in one is no line break."""
    return output.decode(errors="replace")


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


def spawn_detached(argv: list[str], env: dict[str, str], pid_file: str) -> str:
    """Run argv in a session of its own, not this process's child, its pid in pid_file; "" once it is running (so a
    follower finds it at once), else what failed (told through a pipe that its exec closes)."""
    read_end, write_end = os.pipe()  # neither is inherited by the exec'd program (close-on-exec)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setsid()
            if os.fork():
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            _write(os.path.dirname(pid_file), os.path.basename(pid_file), str(os.getpid()))
            os.execve(argv[0], argv, env)
        except BaseException as e:  # noqa: BLE001 - told to the parent, which records it
            os.write(write_end, repr(e).encode()[:500])
        finally:
            os._exit(127)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as f:
        return f.read().decode(errors="replace")


if __name__ == "__main__":
    if sys.argv[1:] == ["--start"]:
        sys.exit(start(sys.stdin.buffer, sys.stdout))
    main(sys.argv[1])
