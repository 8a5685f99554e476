"""The launch commands of a job, and the shell scripts that the supervisor and kit both build (kit imports them for
the first launch, the supervisor for each restart); the job's plan; and the small steps every part of the supervisor
takes (a file in the job's folder, SSH to a host's container, a step on every host at once). Standard library only:
shipped in the supervisor's script (kit.backends.cluster.supervisor.shipped)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
from dataclasses import dataclass, field


# The job's own variables (`kit run -e`), one JSON object a job, written by kit into every host's container before
# the job starts and removed when it ends: a rank reads them from there, so their values are on no command line.
ENV_DIR = "/run/kit/env"
# Each rank's heartbeat, in its host's container: /run/kit/progress/<job>/<rank>, one JSON line (the rank launcher's,
# kit.jobs.commands.horovod); KIT_PROGRESS_DIR moves it (the unit tests give each stand-in host its own).
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
# The supervisor's own SSH to a host goes over one connection (its first command opens it, the others ride on it):
# its calls at the job's end and every heartbeat read cost no handshake. The connection outlives its command, adopted
# by the container's init: the job's end stops it with whatever else init adopted (ORPHANS), and the next job opens
# one anew. A launch's own SSH (the fanout script's) rides it where it is there, and never opens one:
# a connection opened by a job's process would carry the job's mark, and be stopped with what is left of the job.
CONNECTION = ("-o", "ControlPath=/tmp/kit-ssh-%C")
SHARED = (*CONNECTION, "-o", "ControlMaster=auto", "-o", "ControlPersist=600")
RIDE = (*CONNECTION, "-o", "ControlMaster=no")
STOP_WAIT_S = 20        # SIGINT to the launcher, then this long before what is left is killed
REMOTE_TIMEOUT_S = 60   # one remote step of the supervisor (a heartbeat read, a reap, a stack dump)
# A job's end (and `kit stop`) sweeps every host of the cluster again while a round stopped something (an SSH chain
# ends a hop a round), a short pause before each, for at most REAP_FOR_S (time, not a count a longer chain outlasts);
# a host still stopping something then is marked (UNSETTLED/<job>): no job starts there until a sweep stops nothing.
REAP_FOR_S, REAP_SETTLE_S = 30.0, 0.3
UNSETTLED = "/run/kit/unsettled"
# What the supervisor records of a job's end, which kit's follower prints after its END_MARK (each file after a line
# `@@NAME`): env_kept: the addresses of the hosts whose container may still hold the job's variables
# (supervise.tidy_env); restarts: how often it was started again; left_out: the hosts a restart went on without;
# hang: what the hang watch found; reaped: "host count" of the processes of the job it had to stop at the end;
# unsettled: "host what" of each host whose sweep did not settle (REAP_FOR_S).
ENDING = ("env_kept", "restarts", "left_out", "hang", "straggler", "reaped", "unsettled")
AFTER = "after.json"  # copy storage: each host's workspace at the end, host -> manifest (Supervisor.finish)


# ------------------------------------------------------------------------------------------------ launch commands

@dataclass(frozen=True)
class Slot:
    host: str      # the name in hosts.txt
    address: str   # where the containers reach it (over SSH)
    slots: int
    train: str = ""  # its address on the training network (kit.network), where its ranks talk ("": address)

    @property
    def talks_at(self) -> str:
        return self.train or self.address


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
    """Kill every process of the job; print how many, then `killed:` and `PID:NAME` of each. The job's processes
    carry KIT_JOB=<id>; their descendants belong to it too, whatever their environment (a rank may start children with
    `env -i`). Where it kills nothing, the host is no longer unsettled by the job (UNSETTLED's mark goes)."""
    return (
        f"job=KIT_JOB={job_id}; n=0; killed=' '; names=''; for round in 1 2 3; do was=$n; pids=' '; "
        "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx \"$job\" && pids=\"$pids${p#/proc/} \"; done; "
        f"{ORPHANS.format(job=shlex.quote(job_id))}"
        # descendants, generation by generation (bounded: each round adds a process, or ends)
        "while :; do more=''; for p in /proc/[0-9]*; do pid=${p#/proc/}; case \"$pids\" in *\" $pid \"*) continue;; esac; "
        "ppid=$(sed -n 's/^PPid:[[:space:]]*//p' $p/status 2>/dev/null); "
        "case \"$pids\" in *\" $ppid \"*) more=\"$more$pid \";; esac; done; "
        "[ -z \"$more\" ] && break; pids=\"$pids$more\"; done; "
        # again while a round killed something: a process that forked as it was found leaves an orphan
        "for pid in $pids; do case \"$killed\" in *\" $pid \"*) continue;; esac; "
        "name=$(head -n 1 /proc/$pid/comm 2>/dev/null | tr -cd 'A-Za-z0-9._+-' | head -c 15); "
        "kill -9 $pid 2>/dev/null && n=$((n+1)) && killed=\"$killed$pid \" && names=\"$names $pid:${name:-?}\"; done; "
        "[ $n -gt $was ] || break; sleep 0.2; "
        f"done; rm -rf \"{PROGRESS}/{job_id}\"; [ $n -gt 0 ] || rm -f {UNSETTLED}/{shlex.quote(job_id)}; "
        "echo $n; echo \"killed:$names\" | head -c 2000; echo")


def parse_killed(text: str) -> str:
    """What reap_script killed, `PID:NAME ...` (its second line), as a line kit may print (a rank names its processes:
    only what the script's own filter lets through, bounded). Pure."""
    for line in text.splitlines()[1:3]:
        if line.startswith("killed:"):
            return " ".join(w for w in line[len("killed:"):].split() if re.fullmatch(r"[0-9]+:[A-Za-z0-9._+?-]{1,15}", w))
    return ""


def unsettled_mark(job_id: str, killed: str) -> str:
    """sh, in a host's container whose sweep did not settle: the mark that keeps the next job from starting there."""
    return f"mkdir -p -m 700 {UNSETTLED} && echo {shlex.quote(f'{job_id} {killed}')} > {UNSETTLED}/{shlex.quote(job_id)}"


# sh (in reap_script's rounds): the processes re-parented to the container's init, added to `pids` (then their
# descendants are). A process that leaves its job's environment (`env -i`) and its parent (setsid, a double fork) is
# adopted by pid 1, which in kit's containers is the cluster's sshd (images/entrypoint.sh). Of the processes whose
# parent is pid 1, kept: the sshd's own connection processes (its program, or SSHD_SESSIONS, holding a connection
# that pid 1's listening socket accepted: the cluster address and port, which no other process can bind), the orphans
# of another job whose supervisor is there (KIT_JOB=<that id>), and this script's own shell and its parents. A job's
# supervisor is kit's `docker exec -d` (KIT_SUPERVISOR=<id>, its command line ending with <id>/plan.json, and its
# parent outside the container: ppid 0, which no process in it can make its own); none is an adopted one. Whatever program anything
# else runs (the image's ssh or sshd, a copy of sh named sshd), it is stopped: kit's own SSH connections that
# outlive their command (ControlPersist) are adopted ones too, and are opened again by the next job that needs them.
# A `docker exec` session's processes have ppid 0 and are not adopted ones.
# Only in kit's containers, whose pid 1 is the image's sshd (its name, /proc/1/comm, which no other process can change:
# not its environment, which sshd's process title overwrites, nor a file such as /.dockerenv, which a job could
# remove): elsewhere (a unit test's machine) pid 1 adopts what is not kit's.
# OpenSSH 9.8 and later (trixie, the gpu flavor's base) runs each connection as a program of its own, a child of pid 1.
SSHD_SESSIONS = ("/usr/lib/openssh/sshd-session", "/usr/lib/openssh/sshd-auth")
ORPHANS = (
    "init=$(readlink /proc/1/exe 2>/dev/null); "
    "if [ \"$(cat /proc/1/comm 2>/dev/null)\" = sshd ]; then "
    "sockets() {{ for f in /proc/$1/fd/*; do l=$(readlink $f 2>/dev/null); case \"$l\" in 'socket:['*) l=${{l#socket:?}}; "
    "echo \"${{l%?}}\";; esac; done; }}; "
    "tcp() {{ cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v i=\"$1\" -v st=\"$2\" '$10 == i && $4 == st {{print $2}}'; }}; "
    "listen=' '; for i in $(sockets 1); do listen=\"$listen$(tcp $i 0A) \"; done; "
    "accepted() {{ for i in $(sockets $1); do a=$(tcp $i 01); [ -n \"$a\" ] || continue; "
    "case \"$listen\" in *\" $a \"*) return 0;; esac; done; return 1; }}; "
    "sups=' '; live=' '; q=$$; "
    "while [ \"$q\" -gt 1 ] 2>/dev/null; do sups=\"$sups$q \"; q=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$q/status); done; "
    "for p in /proc/[0-9]*; do sed -n 's/^PPid:[[:space:]]*//p' $p/status 2>/dev/null | grep -qx 0 || continue; "
    "id=$(tr '\\0' '\\n' < $p/environ 2>/dev/null | sed -n 's/^KIT_SUPERVISOR=//p' | head -n 1); "
    "[ -n \"$id\" ] || continue; last=$(tr '\\0' '\\n' < $p/cmdline 2>/dev/null | tail -n 1); "
    "case \"$last\" in */\"$id\"/plan.json) sups=\"$sups${{p#/proc/}} \"; live=\"$live$id \";; esac; done; "
    "for p in /proc/[0-9]*; do pid=${{p#/proc/}}; [ \"$pid\" = 1 ] && continue; "
    "case \"$pids$sups\" in *\" $pid \"*) continue;; esac; "
    "sed -n 's/^PPid:[[:space:]]*//p' $p/status 2>/dev/null | grep -qx 1 || continue; "
    "grep -q '^State:[[:space:]]*Z' $p/status 2>/dev/null && continue; "
    "exe=$(readlink $p/exe 2>/dev/null); case \"$exe\" in \"$init\"|{sessions}) accepted $pid && continue;; esac; "
    "other=$(tr '\\0' '\\n' < $p/environ 2>/dev/null | sed -n 's/^KIT_JOB=//p' | head -n 1); "
    "if [ -n \"$other\" ] && [ \"$other\" != {job} ]; then case \"$live\" in *\" $other \"*) continue;; esac; fi; "
    "pids=\"$pids$pid \"; done; fi; ").replace("{sessions}", "|".join(SSHD_SESSIONS))


# Python, for kit's scripts that find a job's supervisor in a container's process table (jobcontrol's FOLLOW_SCRIPT,
# jobrecords' RECORDS_SCRIPT; os imported): in kit's containers (pid 1 named sshd) a supervisor is kit's
# `docker exec -d`, its parent outside the container (PPid 0), which no process of a job can make its own.
# The most of a process's command line the scripts that look for a supervisor read: its `python -I -c SOURCE PLAN`
# holds the whole shipped source (kit.backends.cluster.supervisor.shipped), one argument, which the kernel takes up to
# MAX_ARG_STRLEN (128 KiB); the plan's path comes last.
SUPERVISOR_APART = """CMDLINE_MAX = 1 << 20
def kits_container():  # pid 1 is sshd by its name, which no other process can change
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() == "sshd"
    except OSError:
        return False
OUTSIDE = kits_container()
def apart(pid):
    with open("/proc/%s/status" % pid) as f:
        return any(line.split() == ["PPid:", "0"] for line in f)
"""


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
    pace_window: float = 120.0       # seconds a host must be slow at every look to be named a straggler (kit.jobs.pace;
                                     # 0: never)
    env: bool = False                # the job has variables in every container (ENV_DIR), removed at its end
    here: str = ""                   # the address of the host whose container runs the supervisor ("": hosts[0])
    primary: str = ""                # that host's name, when it is none of the job's hosts
    spread: bool = False             # copy storage: each host's workspace is read at the end (what the job wrote)
    cluster: list[Slot] = field(default_factory=list)  # every host of the cluster: the job's end sweeps them all

    @classmethod
    def load(cls, text: str) -> "Plan":
        raw = json.loads(text)
        raw["hosts"] = [Slot(**h) for h in raw["hosts"]]
        raw["cluster"] = [Slot(**h) for h in raw.get("cluster", [])]
        raw["nodes"] = [NodeCommand(n["host"], n["address"], tuple(n["argv"]), n["rank"]) for n in raw["nodes"]]
        return cls(**raw)

    def dump(self) -> str:
        return json.dumps({**self.__dict__, "hosts": [h.__dict__ for h in self.hosts],
                           "cluster": [h.__dict__ for h in self.cluster], "nodes": [n.__dict__ for n in self.nodes]})

    def swept(self, hosts: list[Slot]) -> list[Slot]:
        """The hosts a job's end sweeps: these (the last launch's), the primary, and every other host of the cluster
        (a job's SSH from one of its hosts reaches the others: what it started there is the job's too)."""
        primary = [] if any(self.is_here(h) for h in hosts) else [Slot(self.primary, self.here, 0)]
        return list({h.address: h for h in [*hosts, *primary, *self.cluster]}.values())

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
            nodes = [fill(by_host[h.host], {NNODES: str(len(hosts)), NODE_RANK: str(i), MASTER_ADDR: hosts[0].talks_at,
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


# ----------------------------------------------------------------------------- steps every part of the supervisor takes

def _write(folder: str, name: str, text: str) -> None:
    """A file of kit's in the job's folder, which the job can write too: made anew under a name of its own and renamed
    over the name, so that a FIFO or a link the job put there neither blocks this nor is written through."""
    path = os.path.join(folder, name)
    temporary = f"{path}.kit-{os.urandom(6).hex()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(temporary, path)


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


def _text(output: bytes) -> str:
    """A command's output as text: a job's file names and what its ranks write need not be UTF-8, and a carriage
    return in one is no line break."""
    return output.decode(errors="replace")
