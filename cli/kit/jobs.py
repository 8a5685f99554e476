"""`kit run`: a job across the cluster, launched from the primary's container: by horovodrun, or (torchrun,
tf) by a script that starts each host's command over the cluster SSH.

Every process of a job carries KIT_JOB=<id> in its environment (horovodrun
passes its environment to the ranks it starts), so when the job ends, fails or
is interrupted, kit finds and stops whatever is left of it on every host.
Output is kept on the primary, in the job's folder, as horovodrun prints it.
With copy storage, what the ranks wrote in the workspace is then copied to every host.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from kit import jobenv, state as st
from kit.commands.docker import command, exec_argv
from kit.commands.horovod import (ENV_DIR, Failures, HorovodOptions, Slot, common_interfaces, exit_report,
                                  horovodrun_argv, placement, split_rank)
from kit.commands.launchers import (FREE_PORT, TORCHRUN_PREFIX, NodeCommand, fanout_script, tf_config, torch_ranks,
                                    torchrun_argv)
from kit.errors import BadInput, KitError
from kit.fanout import fan_out
from kit.steps import workspace
from kit.steps.node import Node

STOP_WAIT_S = 20


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass(frozen=True)
class Job:
    id: str
    state: st.ClusterState
    np: int
    slots: tuple[Slot, ...]
    nics: tuple[str, ...]
    command: tuple[str, ...]          # what each rank runs, e.g. python -u train.py --epochs 2
    options: HorovodOptions = HorovodOptions()
    env: tuple[tuple[str, str], ...] = ()
    launcher: str = "horovod"
    fanout: tuple[NodeCommand, ...] = ()   # torchrun, tf: each host's command, started from the primary
    placed: tuple[Slot, ...] = ()          # torchrun, tf: the host of each rank

    @property
    def folder(self) -> str:
        return self.state.primary.place.job_dir(self.id)

    @property
    def ranks(self) -> list[Slot]:
        return list(self.placed) if self.fanout else placement(list(self.slots), self.np)

    def argv(self) -> list[str]:
        return horovodrun_argv(self.np, list(self.slots), self.state.ssh_port, list(self.nics), list(self.command),
                               self.options)

    def launch(self) -> str:
        """Start the job in the primary's container, detached from kit's session (`docker exec -d`): a closed
        laptop or a dropped VPN does not end it. A shell there (the supervisor) keeps the launcher's pid, the
        output and the job's record (start, end, exit); kit follows the output with follow()."""
        d = shlex.quote(self.folder)
        ranks = shlex.quote(" ".join(s.host for s in self.ranks))
        run = shlex.join(["bash", "-c", fanout_script(self.state.workspace, list(self.fanout))] if self.fanout
                         else self.argv())
        # The supervisor carries KIT_SUPERVISOR=<id>, the launcher and all below it KIT_JOB=<id>: stopping what is
        # left of the job (reap) never takes the supervisor, which records the end.
        inner = (f"mkdir -p {d}; echo {ranks} > {d}/ranks; echo {self.launcher} > {d}/launcher; "
                 f"date +%s > {d}/started; echo $$ > {d}/supervisor; cd {shlex.quote(self.state.workspace)} && "
                 f"(export KIT_JOB={self.id}; echo $BASHPID > {d}/pid; exec {run}) > {d}/output.log 2>&1; "
                 f"code=$?; date +%s > {d}/ended; echo $code > {d}/exit{self._tidy_env()}")
        # Gloo's rendezvous waits 30 s for every rank by default: give slow-starting ranks (a loaded host
        # importing torch) the same time as horovodrun's --start-timeout.
        variables = [("KIT_SUPERVISOR", self.id), ("HOROVOD_GLOO_TIMEOUT_SECONDS", str(self.options.start_timeout))]
        if self.env:
            variables.append(("KIT_ENV", "1"))  # each rank must find the job's variables
        env = [arg for k, v in variables for arg in ("-e", f"{k}={v}")]
        return command(["docker", "exec", "-d", *env, self.state.primary.place.container, "bash", "-c", inner])

    def _tidy_env(self) -> str:
        """The supervisor's last step: the job's variables removed from every host's container (over the cluster
        SSH, bounded), also when no kit waits for the job any more; a host where that failed goes in env_kept."""
        if not self.env:
            return ""
        d = shlex.quote(self.folder)
        rm = shlex.quote(shlex.join(["rm", "-f", self.env_path()]))
        others = [h.address for h in self.state.hosts if not h.primary]
        return ("; " + "".join(f"(ssh -n -o BatchMode=yes -o ConnectTimeout=10 {shlex.quote(a)} {rm} "
                               f"|| echo {shlex.quote(a)} >> {d}/env_kept) & " for a in others)
                + f"rm -f {self.env_path()}; wait")

    def follow(self) -> str:
        return follow_command(self.state.primary.place.container, self.folder, self.id)

    def env_path(self) -> str:
        return f"{ENV_DIR}/{self.id}"

    def write_env(self, container: str) -> tuple[str, bytes]:
        """(command, its stdin): the job's variables into a host's container, for its ranks alone to read."""
        return (command(["docker", "exec", "-i", container, "sh", "-c",
                         f"umask 077 && mkdir -p {ENV_DIR} && cat > {self.env_path()}"]), jobenv.env_file(self.env))

    def record_env(self) -> tuple[str, bytes]:
        """(command, its stdin): what kit showed of the variables (secret-looking values hidden), kept in the job's
        record; on stdin, as no value belongs on a command line."""
        d = shlex.quote(self.folder)
        return (command(["docker", "exec", "-i", self.state.primary.place.container, "sh", "-c",
                         f"mkdir -p {d} && cat > {d}/environment"]), (jobenv.shown(self.env) + "\n").encode())

    def env_kept(self) -> str:
        """The addresses of the hosts whose container may still hold the job's variables (see _tidy_env)."""
        return command(exec_argv(self.state.primary.place.container,
                                 ["sh", "-c", f"cat {shlex.quote(self.folder)}/env_kept 2>/dev/null; true"]))



def free_port(node: Node) -> int:
    r = node.runner.run(command(exec_argv(node.place.container, ["python", "-c", FREE_PORT])))
    return int(r.check("cannot find a free TCP port in the container").stdout.strip())


def fanout(launcher: str, state: st.ClusterState, nodes: list[Node], slots: list[Slot], rank_cmd: list[str],
           nproc: int | None) -> tuple[tuple[NodeCommand, ...], tuple[Slot, ...]]:
    """torchrun or tf: each host's command, and the host of each rank. Ports are picked free on the hosts
    now (torchrun: the c10d store's on the primary; tf: one per worker). nodes[0] and slots[0] are the
    primary's; slots are in the state's host order."""
    hosts = state.hosts
    if launcher == "torchrun":
        port, addresses = free_port(nodes[0]), {h.name: h.address for h in hosts}
        commands = []
        for i, (h, slot) in enumerate(zip(hosts, slots)):
            nic = common_interfaces({h.name: [tuple(x) for x in h.interfaces]}, addresses)[0]
            commands.append(NodeCommand(h.name, h.address, (
                "env", f"GLOO_SOCKET_IFNAME={nic}", f"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE={TORCHRUN_PREFIX}",
                *torchrun_argv(len(hosts), nproc or slot.slots, i, hosts[0].address, port, rank_cmd)), None))
        return tuple(commands), tuple(torch_ranks(slots, nproc))
    ports = fan_out("finding free ports", nodes, free_port, lambda n: n.name)
    workers = [f"{h.address}:{p}" for h, p in zip(hosts, ports)]
    commands = [NodeCommand(h.name, h.address, ("env", f"TF_CONFIG={tf_config(workers, i)}", *rank_cmd), i)
                for i, h in enumerate(hosts)]
    return tuple(commands), tuple(replace(s, slots=1) for s in slots)


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
        "n=0; for pid in $pids; do kill -9 $pid 2>/dev/null && n=$((n+1)); done; echo $n")


def reap_command(container: str, job_id: str) -> str:
    """Kill every process in the container that belongs to the job; print how many."""
    return command(["docker", "exec", container, "sh", "-c", reap_script(job_id)])


@dataclass
class Outcome:
    exit_code: int | None                    # None: the job left none (it never started, or its container went)
    failure: tuple[int, int] | None          # (rank, exit code) that failed first
    leftovers: dict[str, int] = field(default_factory=dict)  # host -> processes kit had to stop
    env_kept: list[str] = field(default_factory=list)        # addresses whose container may still hold the variables


@dataclass
class Synced:
    sent: dict[str, int]                 # host -> files sent
    manifests: dict[str, dict[str, str]]  # host -> its workspace before the job


def sync_workspace(nodes: list[Node], folder: Path, state: st.ClusterState) -> Synced:
    """Copy what changed to every host's workspace (to the primary's alone where all share it)."""
    local = workspace.manifest(folder)
    nodes = [n for n in nodes if n.host.primary] if state.workspace_shared else nodes
    done = fan_out("copying the job's files", nodes, lambda n: workspace.sync(n, folder, state.workspace, local),
                   lambda n: n.name)
    return Synced({n.name: sent for n, (sent, _) in zip(nodes, done)}, {n.name: m for n, (_, m) in zip(nodes, done)})


def spread_outputs(nodes: list[Node], state: st.ClusterState, before: dict[str, dict[str, str]]) -> int:
    """Copy storage: what the job wrote on each host goes to every other host, at the same path. Returns how
    many files were copied."""
    if state.workspace_shared or len(nodes) < 2:
        return 0
    after = fan_out("reading what the job wrote", nodes, lambda n: workspace.read_manifest(n, state.workspace),
                    lambda n: n.name)
    plan = workspace.spread_plan(before, {n.name: m for n, m in zip(nodes, after)})
    by_name = {n.name: n for n in nodes}

    def one(source: str) -> int:
        names, targets = plan[source]
        workspace.spread(by_name[source], state.workspace, names, [by_name[t].address for t in targets])
        return len(names)
    return sum(fan_out("copying what the job wrote", list(plan), one))


def reap(nodes: list[Node], job_id: str) -> dict[str, int]:
    def one(n: Node) -> int:
        r = n.runner.run(reap_command(n.place.container, job_id), timeout=60)
        return int(r.stdout.strip() or 0) if r.ok else 0
    counts = fan_out("stopping what is left of the job", nodes, one, lambda n: n.name)
    return {n.name: c for n, c in zip(nodes, counts) if c}


def start(job: Job, nodes: list[Node]) -> None:
    """Give every host's container the job's variables, record them, and start the job under its supervisor.
    nodes[0] is the primary."""
    primary = nodes[0]
    if job.env:
        def give(n: Node) -> None:
            write, values = job.write_env(n.place.container)
            n.runner.run(write, stdin=values, timeout=60).check("cannot give the job's variables to its container")
        try:
            fan_out("giving the job its variables", nodes, give, lambda n: n.name)
        except KitError:  # the job does not start: what reached the other hosts goes again (as far as it can)
            for n in nodes:
                try:
                    n.runner.run(command(exec_argv(n.place.container, ["rm", "-f", job.env_path()])), timeout=60)
                except Exception:  # noqa: BLE001 - the host that failed above; its failure is the one to say
                    pass
            raise
        record, shown = job.record_env()
        primary.runner.run(record, stdin=shown, timeout=60).check("cannot write the job's record")
    primary.runner.run(job.launch(), timeout=60).check(f"cannot start job {job.id} on {primary.name}")


def run(job: Job, nodes: list[Node], on_line: Callable[[int | None, str | None, str], None]) -> Outcome:
    """Start the job and follow it to its end, handing each line to on_line(rank, host of the rank, text); then
    stop what is left of it on every host. Ctrl-C stops it everywhere. nodes[0] is the primary."""
    ranks = job.ranks
    failures = Failures()
    ended = End()

    def handle(line: str) -> None:
        if ended.feed(line):
            return
        rank, text = split_rank(line)
        failures.feed(rank, text)
        if rank is None or exit_report(text) is None:
            on_line(rank, ranks[rank].host if rank is not None and rank < len(ranks) else None, text)

    primary = nodes[0]
    start(job, nodes)
    try:
        primary.runner.stream_out(job.follow(), handle)
    except KeyboardInterrupt:
        raise Interrupted(job, stop(nodes, job.id).killed) from None
    kept = primary.runner.run(job.env_kept(), timeout=60).stdout.split() if job.env else []
    return Outcome(ended.code, failures.first(), reap(nodes, job.id), kept)


class Interrupted(KitError):
    exit_code = 130

    def __init__(self, job: Job, leftovers: dict[str, int]) -> None:
        stopped = ", ".join(f"{n} on {h}" for h, n in leftovers.items()) or "none left"
        super().__init__(f"interrupted: job {job.id} was stopped on every host (processes kit stopped: {stopped})",
                         hint=f"`kit logs {job.id}` shows its output")


# ---------------------------------------------------------------- the jobs of a cluster, as their folders record them

JOB_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")
STATES = ("running", "stopping", "succeeded", "failed", "stopped", "lost")
END_MARK = "@@kit-job-end"


@dataclass
class End:
    """The follower's last line: the job's exit code, or none when its supervisor never came or left none."""

    code: int | None = None

    def feed(self, line: str) -> bool:
        if not line.startswith(END_MARK):
            return False
        value = line[len(END_MARK):].strip()
        self.code = int(value) if re.fullmatch(r"-?\d{1,9}", value) else None
        return True


# A pid a job's file names, read as digits only; it is the job's while that process carries the mark.
_PID = ("pid_of() {{ read -r p < {folder}/$1 2>/dev/null; case \"$p\" in ''|*[!0-9]*) return 1;; esac; "
        "tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx \"$2\" && echo $p; }}; ")


def follow_command(container: str, folder: str, job_id: str) -> str:
    """The job's output from its start while it runs (in the primary's container), then END_MARK and its exit code
    (none when it left none). Ctrl-C or a dropped session ends the following, never the job."""
    d = shlex.quote(folder)
    return command(exec_argv(container, ["sh", "-c", _PID.format(folder=d) +
        f"i=0; while [ ! -s {d}/supervisor ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; "
        f"if sup=$(pid_of supervisor KIT_SUPERVISOR={job_id}); then tail -n +1 -s 0.2 -F --pid=$sup {d}/output.log; "
        f"else cat {d}/output.log; fi 2>/dev/null; "  # running: to its end; ended (or never started): as it is
        f"read -r code < {d}/exit 2>/dev/null; echo \"{END_MARK} $code\""]))


def interrupt_command(container: str, folder: str, job_id: str) -> str:
    """The job marked as stopped by its user, and SIGINT to its launcher (horovodrun, or the fanout script),
    which stops its ranks as for Ctrl-C; to that process only if it is still the job's."""
    d = shlex.quote(folder)
    return command(exec_argv(container, ["sh", "-c", _PID.format(folder=d) +
        f"date +%s > {d}/stopped; p=$(pid_of pid KIT_JOB={job_id}) && kill -INT $p; true"]))


# Runs in the primary's container (the job's own realm: what a rank wrote there is read there, as text, with no
# link followed): one JSON line a job folder.
RECORDS_SCRIPT = r"""
import json, os, stat, sys
root = sys.argv[1]
def read(folder, name):
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(4096).decode("utf-8", "replace").strip() if stat.S_ISREG(os.fstat(fd).st_mode) else None
def carries(pid, mark):
    try:
        with open("/proc/%d/environ" % int(pid), "rb") as f:
            return mark.encode() in f.read().split(b"\0")
    except (OSError, ValueError):
        return False
for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    folder = os.path.join(root, name)
    if os.path.islink(folder) or not os.path.isdir(folder):
        continue
    record = {f: read(folder, f) for f in ("launcher", "ranks", "started", "ended", "exit", "environment")}
    record.update(id=name, stopped=read(folder, "stopped") is not None,
                  alive=carries(read(folder, "supervisor") or "", "KIT_SUPERVISOR=" + name))
    print(json.dumps(record))
"""


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

    @classmethod
    def parse(cls, line: str) -> "Record":
        raw = json.loads(line)
        return cls(raw["id"], raw.get("launcher") or "horovod", tuple((raw.get("ranks") or "").split()),
                   _int(raw.get("started")), _int(raw.get("ended")), _int(raw.get("exit")), bool(raw.get("stopped")),
                   bool(raw.get("alive")), raw.get("environment") or "")

    @property
    def state(self) -> str:
        """running -> (stopping ->) succeeded | failed | stopped; lost when neither its supervisor nor its end is
        there (its container was removed or restarted under it)."""
        if self.exit_code is not None:
            if self.stopped:
                return "stopped"
            return "succeeded" if self.exit_code == 0 else "failed"
        if self.alive:
            return "stopping" if self.stopped else "running"
        return "stopped" if self.stopped else "lost"

    def seconds(self, now: float) -> int | None:
        if self.started is None:
            return None
        return int((self.ended if self.ended is not None else now) - self.started)


def records_command(container: str, jobs_dir: str) -> str:
    return command(exec_argv(container, ["python", "-c", RECORDS_SCRIPT, jobs_dir]))


def read_records(primary: Node) -> list[Record]:
    """Every job of the cluster, oldest first."""
    r = primary.runner.run(records_command(primary.place.container, primary.place.jobs_dir), timeout=60)
    r.check(f"cannot read the jobs of {primary.name}")
    found = [rec for line in r.stdout.splitlines() if line.startswith("{")
             if JOB_ID.fullmatch((rec := Record.parse(line)).id)]  # kit's jobs, not what else is in the folder
    return sorted(found, key=lambda rec: (rec.started or 0, rec.id))


def check_job_id(job: str) -> str:
    if not JOB_ID.fullmatch(job):
        raise BadInput(f"'{job}' is not a job id", hint="`kit jobs` lists them, e.g. 20261123-194512-ab12")
    return job


@dataclass
class Stopped:
    ended_by_itself: bool                 # the launcher ended on SIGINT within the bound
    killed: dict[str, int]                # host -> processes kit had to kill


def stop(nodes: list[Node], job_id: str, wait: float = STOP_WAIT_S) -> Stopped:
    """Stop a job everywhere within a bound: SIGINT to its launcher (which stops its ranks), then whatever is left
    of it on any host, killed; its supervisor, untouched, records the end. nodes[0] is the primary."""
    primary = nodes[0]
    folder, container = primary.place.job_dir(job_id), primary.place.container
    primary.runner.run(interrupt_command(container, folder, job_id), timeout=60).check(f"cannot stop job {job_id}")
    d = shlex.quote(folder)
    gone = command(exec_argv(container, ["sh", "-c", _PID.format(folder=d) +
                                         f"for i in $(seq {int(wait * 4)}); do "
                                         f"pid_of pid KIT_JOB={job_id} >/dev/null || exit 0; sleep 0.25; done; exit 1"]))
    ended = primary.runner.run(gone, timeout=wait + 60).ok
    return Stopped(ended, reap(nodes, job_id))
