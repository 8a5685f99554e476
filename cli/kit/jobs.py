"""`kit run`: a job across the cluster, started in the primary's container under its supervisor (kit.supervisor),
apart from kit's session: horovodrun, or (torchrun, tf) a script that starts each host's command over the cluster
SSH. kit follows its output, lists the cluster's jobs from their folders and stops them.

Every process of a job carries KIT_JOB=<id> in its environment (horovodrun passes its environment to the ranks it
starts), so when the job ends, fails or is interrupted, kit finds and stops whatever is left of it on every host.
Output is kept on the primary, in the job's folder. With copy storage, what the ranks wrote in the workspace is then
copied to every host.
"""

from __future__ import annotations

import inspect
import json
import re
import secrets
import shlex
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from kit import jobenv, state as st, supervisor
from kit.commands.docker import command, exec_argv
from kit.commands.horovod import Failures, HorovodOptions, common_interfaces, exit_report, split_rank
from kit.commands.launchers import tf_config
from kit.errors import BadInput, HostsFailed, KitError
from kit.fanout import fan_out
from kit.runners.base import STDOUT_KEPT
from kit.steps import workspace
from kit.steps.image import chunks
from kit.steps.node import Node
from kit.supervisor import (FREE_PORT, MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, RANKS_MARK,
                            TORCHRUN_PREFIX, NodeCommand, Plan, Slot, placement, reap_script, torch_ranks,
                            torchrun_argv)

STOP_WAIT_S = 20


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass(frozen=True)
class Policy:
    """What the supervisor does when a job fails or hangs."""

    restarts: int = 0              # start it again after a failure, on the hosts that answer, this many times
    min_np: int | None = None      # ... with at least this many processes (None: all of them)
    hang_timeout: float = 600      # seconds without progress of any rank before it counts as hung (0: never)


def parse_duration(text: str, flag: str) -> float:
    """30s, 10m, 2h, 90 (seconds), 0 -> seconds."""
    m = re.fullmatch(r"(\d{1,7})([smh]?)", text.strip())
    if not m:
        raise BadInput(f"{flag}: '{text}' is not a duration", hint=f"give e.g. {flag} 30s, 10m or 2h (0: never)")
    return float(int(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[m[2]])


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
    nproc: int | None = None               # torchrun: processes a host (None: its slots)
    policy: Policy = Policy()

    @property
    def folder(self) -> str:
        return self.state.primary.place.job_dir(self.id)

    @property
    def ranks(self) -> list[Slot]:
        return list(self.placed) if self.fanout else placement(list(self.slots), self.np)

    def ranks_hosts(self) -> list[str]:
        return [s.host for s in self.ranks]

    def plan(self) -> Plan:
        addresses = {s.address for s in self.slots}
        return Plan(id=self.id, folder=self.folder, workspace=self.state.workspace, launcher=self.launcher,
                    hosts=list(self.slots), np=self.np, nproc=self.nproc, port=self.state.ssh_port,
                    nics=list(self.nics), args=[*self.options.argv(), *self.command] if self.launcher == "horovod"
                    else list(self.command), nodes=list(self.fanout), restarts=self.policy.restarts,
                    min_np=self.np if self.policy.min_np is None else self.policy.min_np,
                    hang_timeout=self.policy.hang_timeout, env=bool(self.env), here=self.state.primary.address,
                    primary="" if self.state.primary.address in addresses else self.state.primary.name,
                    spread=not self.state.workspace_shared and len(addresses | {self.state.primary.address}) > 1)

    def start_command(self) -> str:
        """supervisor.start in the primary's container: kit's one conversation that starts the job (see there)."""
        return command(["docker", "exec", "-i", self.state.primary.place.container, "python", "-c", SUPERVISOR,
                        "--start"])

    def request(self, follow: str | None, others: list[Node] = (), files: dict[str, str] | None = None) -> bytes:
        """supervisor.start's first line: the job's folder and files, the variables (theirs go on stdin, never on a
        command line), its supervisor's source, what to do once it runs (follow: a follow script), and the job's
        other hosts, to be given its files (name -> sha256; None where the hosts share the workspace) and
        variables."""
        # Gloo's rendezvous waits 30 s for every rank by default: give slow-starting ranks (a loaded host
        # importing torch) the same time as horovodrun's --start-timeout.
        env = {"KIT_SUPERVISOR": self.id, "HOROVOD_GLOO_TIMEOUT_SECONDS": str(self.options.start_timeout)}
        if self.env:
            env["KIT_ENV"] = "1"  # each rank must find the job's variables
        written = {"plan.json": self.plan().dump(), **({"environment": jobenv.shown(self.env)} if self.env else {})}
        return json.dumps({"folder": self.folder, "files": written, "env": env, "source": SUPERVISOR,
                           "follow": follow, "workspace": self.state.workspace,
                           "env_file": jobenv.env_file(self.env).decode() if self.env else None,
                           "hosts": [{"name": n.name, "address": n.address} for n in others],
                           "job_files": files or {}, "copy": files is not None}).encode() + b"\n"


# What the supervisor records at the end, which the follower prints after END_MARK (each existing file after a line
# `@@NAME`): env_kept: the addresses of the hosts whose container may still hold the job's variables
# (supervisor.tidy_env); restarts: how often it was started again; left_out: the hosts a restart went on without;
# hang: what the hang watch found; reaped: "host count" of the processes of the job it had to stop at the end.
ENDING = ("env_kept", "restarts", "left_out", "hang", "reaped")
AFTER = "after.json"  # copy storage: each host's workspace at the end, host -> manifest (supervisor.finish)
AFTER_MAX = 64 << 20
# The most of what follows END_MARK that kit keeps: what ending_script prints (each small file up to 4000 bytes)
ENDING_MAX = AFTER_MAX + len(ENDING) * 4200


def ending_script(d: str) -> str:
    """sh, for the job's folder d (quoted): each file of ENDING and AFTER that is there, after a line `@@NAME`."""
    small = f"for f in {' '.join(ENDING)}; do [ -f {d}/$f ] && {{ echo \"@@$f\"; head -c 4000 {d}/$f; echo; }}; done; "
    return small + f"[ -f {d}/{AFTER} ] && {{ echo '@@{AFTER}'; head -c {AFTER_MAX} {d}/{AFTER}; echo; }}; true"


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


def parse_after(text: str) -> dict[str, dict[str, str]] | None:
    """host -> its workspace's manifest at the end, from AFTER; None when it is not whole (kit reads them then)."""
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        return None
    return {host: workspace.parse_manifest(text) for host, text in raw.items()}


# What the primary's container runs as a job's supervisor: the module's own source (the standard library only).
SUPERVISOR = inspect.getsource(supervisor)


def free_port(node: Node) -> int:
    r = node.runner.run(command(exec_argv(node.place.container, ["python", "-c", FREE_PORT])))
    return int(r.check("cannot find a free TCP port in the container").stdout.strip())


def fanout(launcher: str, state: st.ClusterState, nodes: list[Node], slots: list[Slot], rank_cmd: list[str],
           nproc: int | None) -> tuple[tuple[NodeCommand, ...], tuple[Slot, ...]]:
    """torchrun or tf: each host's command, and the host of each rank. tf: a port for each worker, picked free on
    the hosts now (torchrun's store port is picked by the supervisor at each launch). slots: the job's hosts, in the
    order of their node ranks (the state's, or -H's); nodes: at least theirs."""
    hosts = [state.host(s.host) for s in slots]
    if launcher == "torchrun":
        addresses = {h.name: h.address for h in hosts}
        commands = []
        for h, slot in zip(hosts, slots):  # nodes, rank, store address and port are the launch's: the supervisor's
            nic = common_interfaces({h.name: [tuple(x) for x in h.interfaces]}, addresses)[0]
            commands.append(NodeCommand(h.name, h.address, (
                "env", f"GLOO_SOCKET_IFNAME={nic}", f"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE={TORCHRUN_PREFIX}",
                *torchrun_argv(NNODES, nproc or slot.slots, NODE_RANK, MASTER_ADDR, MASTER_PORT, rank_cmd)), None))
        return tuple(commands), tuple(torch_ranks(slots, nproc))
    by_name = {n.name: n for n in nodes}
    ports = fan_out("finding free ports", [by_name[s.host] for s in slots], free_port, lambda n: n.name)
    workers = [f"{h.address}:{p}" for h, p in zip(hosts, ports)]
    commands = [NodeCommand(h.name, h.address, ("env", f"TF_CONFIG={tf_config(workers, i)}", *rank_cmd), i)
                for i, h in enumerate(hosts)]
    return tuple(commands), tuple(replace(s, slots=1) for s in slots)


def reap_command(container: str, job_id: str) -> str:
    """Kill every process in the container that belongs to the job; print how many."""
    return command(["docker", "exec", container, "sh", "-c", reap_script(job_id)])


@dataclass
class Outcome:
    exit_code: int | None                    # None: the job left none (it never started, or its container went)
    failure: tuple[int, int] | None          # (rank, exit code) that failed first
    leftovers: dict[str, int] = field(default_factory=dict)  # host -> processes kit had to stop
    env_kept: list[str] = field(default_factory=list)        # addresses whose container may still hold the variables
    ranks: list[str] = field(default_factory=list)           # the host of each rank of the last launch
    restarts: int = 0
    hang: str = ""                                           # what the hang watch found, if it stopped the job
    left_out: list[str] = field(default_factory=list)        # hosts a restart went on without
    after: dict[str, dict[str, str]] | None = None           # copy storage: host -> its workspace at the end


@dataclass
class Synced:
    sent: dict[str, int]                 # host -> files sent
    manifests: dict[str, dict[str, str]]  # host -> its workspace before the job
    ignore: workspace.Ignore = field(default_factory=workspace.Ignore)  # what the job's folder leaves out
    left_out: tuple[int, int] = (0, 0)   # (files, folders) of the job's folder that were left out

    def left_out_text(self) -> str:
        """What the job's first line says of what was left out, if anything was."""
        files, folders = self.left_out
        said = [f"{n} {what}{'s' if n > 1 else ''}" for n, what in ((folders, "folder"), (files, "file")) if n]
        return f"; left out {' and '.join(said)} (.kitignore and kit's defaults)" if said else ""


class Starting:
    """kit's side of supervisor.start: the conversation with the primary's container that copies the job there and,
    from there, to the job's other hosts, starts it, and (follow) goes on with its output."""

    def __init__(self, job: Job, primary: Node, follow: bool, others: list[Node], files: dict[str, str] | None):
        self.job, self.primary = job, primary
        self.talk = primary.runner.converse(job.start_command(), silence=workspace.COPY_TIMEOUT_S)
        self.said = self.talk.lines(STDOUT_KEPT)  # its answers: one line holds every other host's manifest
        self.talk.send(job.request(follow_script(job.folder, job.id, ending=True) if follow else None, others, files))

    def answer(self, until: str) -> list[str]:
        """Its lines up to the one that starts with `until`, that one last; a starter that ended first is an error."""
        lines = []
        for line in self.said:
            lines.append(line)
            if line.startswith(until):
                return lines
        r = self.talk.result()
        raise KitError(f"cannot start job {self.job.id} (exit {r.exit_code})", host=self.primary.name,
                       command="kit's job starter in the primary's container", output_tail=r.tail(),
                       hint="`kit status` shows the containers; run the job again")

    def here(self, folder: Path, local: dict[str, str]) -> tuple[int, dict[str, str]]:
        """The primary's workspace given the job's files, in this conversation: its manifest as the starter read it,
        and what it lacks sent on; (files sent, its workspace then)."""
        remote = workspace.parse_manifest("\n".join(self.answer(supervisor.MANIFEST_END)[:-1]))
        names = workspace.changed(local, remote)
        if names:
            with tempfile.TemporaryDirectory(prefix="kit-job-") as tmp:
                path = workspace.tarball(folder, names, Path(tmp) / "job.tar.gz")
                self.send({"tar": path.stat().st_size})
                for block in chunks(path):
                    self.talk.send(block)
            said = self.answer(supervisor.COPIED)[-1]
            if said != supervisor.COPIED:
                raise KitError(f"cannot copy the job's files to {self.job.state.workspace}: "
                               f"{said.removeprefix(supervisor.COPIED + ' failed: ')}", host=self.primary.name,
                               hint="check free disk space on the host")
        return len(names), {**remote, **local}

    def others(self, local: dict[str, str]) -> dict[str, tuple[int, dict[str, str]]]:
        """The job's other hosts given its files and variables from the primary: host -> (files sent, its workspace
        then); HostsFailed naming each host that failed."""
        self.send({"others": True})
        try:
            done = json.loads(self.answer(supervisor.HOSTS)[-1][len(supervisor.HOSTS):])
        except ValueError:
            done = None
        if not isinstance(done, dict):
            raise KitError("the job's starter said what it gave the other hosts in a form kit cannot read",
                           host=self.primary.name, hint="run the job again")
        failures = {host: KitError(str(d.get("error")), host=host, hint="check the host's container (`kit status`)")
                    for host, d in done.items() if "error" in d}
        if failures:
            raise HostsFailed("giving the job's files and variables to its hosts", failures)
        return {host: (int(d.get("sent", 0)), {**workspace.parse_manifest(d.get("manifest", "")), **local})
                for host, d in done.items()}

    def send(self, message: dict) -> None:
        self.talk.send(json.dumps(message).encode() + b"\n")

    def go(self, setup: tuple[str, ...]) -> None:
        """Start the job, its log begun with kit's lines; from here it may say nothing for as long as it runs."""
        self.send({"go": list(setup)})
        self.talk.end_input()
        self.talk.quiet(None)
        self.said = self.talk.lines()  # the job's output: its lines cut at LINE_KEPT


def copy_and_start(job: Job, nodes: list[Node], folder: Path, setup: Callable[["Synced"], tuple[str, ...]],
                   follow: bool) -> tuple["Synced", Starting]:
    """Copy what changed of the job's folder to the primary's workspace, and from there to the other hosts' (unless
    they share it), give every host's container the job's variables, and start the job with setup(what was copied)
    as its log's first lines: all in one conversation with the primary (Starting), so that kit's own link carries
    each byte once. Nothing starts unless every host has its part. nodes[0] is the primary."""
    ignore = workspace.Ignore.of(folder)
    found = workspace.scan(folder, ignore)
    shared = job.state.workspace_shared
    starting = Starting(job, nodes[0], follow, nodes[1:], None if shared else found.files)
    try:
        done = {nodes[0].name: starting.here(folder, found.files)}
        others = starting.others(found.files) if len(nodes) > 1 else {}
        done.update({} if shared else others)
        synced = Synced({h: sent for h, (sent, _) in done.items()}, {h: m for h, (_, m) in done.items()}, ignore,
                        (found.left_out_files, found.left_out_folders))
        starting.go(setup(synced))
    except BaseException:
        starting.talk.close()  # its input ends before the go: the starter removes the job's folder and variables
        raise
    return synced, starting


def spread_outputs(nodes: list[Node], state: st.ClusterState, before: dict[str, dict[str, str]],
                   ignore: workspace.Ignore | None = None, after: dict[str, dict[str, str]] | None = None) -> int:
    """Copy storage: what the job wrote on each host goes to every other host, at the same path, but what the job's
    folder leaves out (ignore). after: each host's workspace at the job's end as its supervisor read it (else, or for
    a host it lacks, read now). Returns how many files were copied."""
    if state.workspace_shared or len(nodes) < 2:
        return 0
    after = after or {}
    unread = [n for n in nodes if n.name not in after]
    read = fan_out("reading what the job wrote", unread, lambda n: workspace.read_manifest(n, state.workspace),
                   lambda n: n.name)
    after = {**after, **{n.name: m for n, m in zip(unread, read)}}
    plan = workspace.spread_plan({n.name: before[n.name] for n in nodes}, {n.name: after[n.name] for n in nodes},
                                 ignore)
    by_name = {n.name: n for n in nodes}

    def one(source: str) -> int:
        names, targets = plan[source]
        workspace.spread(by_name[source], state.workspace, names, [by_name[t].address for t in targets])
        return len(names)
    return sum(fan_out("copying what the job wrote", list(plan), one))


def stacks(nodes: list[Node], job_id: str) -> dict[tuple[str, int], str]:
    """(host, rank) -> the rank's Python stack now, on every host at once."""
    def one(n: Node) -> dict[int, str]:
        r = n.runner.run(command(exec_argv(n.place.container, supervisor.stacks_argv(job_id))), timeout=120)
        return supervisor.parse_stacks(r.check(f"cannot read the stacks of job {job_id}").stdout)
    found = fan_out("reading every rank's stack", nodes, one, lambda n: n.name)
    return {(n.name, rank): text for n, by_rank in zip(nodes, found) for rank, text in by_rank.items()}


def reap(nodes: list[Node], job_id: str) -> dict[str, int]:
    def one(n: Node) -> int:
        r = n.runner.run(reap_command(n.place.container, job_id), timeout=60)
        return int(r.stdout.strip() or 0) if r.ok else 0
    counts = fan_out("stopping what is left of the job", nodes, one, lambda n: n.name)
    return {n.name: c for n, c in zip(nodes, counts) if c}


def start(starting: Starting) -> None:
    """A detached job: started once its supervisor runs (copy_and_start began it)."""
    starting.answer(supervisor.STARTED)
    r = starting.talk.result()
    r.check(f"cannot start job {starting.job.id} on {starting.primary.name}")


def follow_to_end(nodes: list[Node], job_id: str, ranks: list[str],
                  on_line: Callable[[int | None, str | None, str], None],
                  starting: Starting | None = None) -> Outcome:
    """Follow a job's output to its end, handing each line to on_line(rank, host of the rank, text); its supervisor
    stops what is left of it on every host (but the hosts a restart left out), and kit does where it left no end.
    Ctrl-C stops it everywhere. ranks: the host of each rank, as far as known (a launch's own line says it again).
    starting: the conversation that started it with a follow script (copy_and_start), else it is followed as it is.
    nodes[0] is the primary."""
    primary = nodes[0]
    failures, ended = Failures(), End()

    def handle(line: str) -> None:
        nonlocal ranks, failures
        if ended.feed(line):
            return
        if (hosts := launch_ranks(line)) is not None:  # a launch (again, after a restart): its ranks' hosts
            ranks, failures = hosts, Failures()
            return
        rank, text = split_rank(line)
        failures.feed(rank, text)
        if rank is None or exit_report(text) is None:
            on_line(rank, ranks[rank] if rank is not None and rank < len(ranks) else None, text)

    folder, container = primary.place.job_dir(job_id), primary.place.container
    try:
        if starting is None:
            primary.runner.stream_out(follow_command(container, folder, job_id, ending=True), handle)
        else:
            for line in starting.said:
                handle(line)
    except KeyboardInterrupt:
        raise Interrupted(job_id, stop(nodes, job_id).killed) from None
    finally:
        if starting is not None:
            starting.talk.close()
    end = parse_ending(ended.rest)
    # (the job can write these files: only the job's hosts are taken from them)
    names, addresses = {n.name for n in nodes}, {n.address for n in nodes}
    left_out = set(end.get("left_out", "").split()) & names  # a restart went on without them: they did not answer
    if "reaped" in end:
        leftovers = {h: n for h, n in parse_reaped(end["reaped"]).items() if h in names}
    else:  # no supervisor ended it (its container went, or it failed): kit stops what is left
        leftovers = reap([n for n in nodes if n.name not in left_out], job_id)
    return Outcome(ended.code, failures.first(), leftovers,
                   [a for a in end.get("env_kept", "").split() if a in addresses], ranks,
                   _int(end.get("restarts")) or 0, end.get("hang", ""), sorted(left_out),
                   parse_after(end[AFTER]) if AFTER in end else None)


class Interrupted(KitError):
    exit_code = 130

    def __init__(self, job_id: str, leftovers: dict[str, int]) -> None:
        stopped = ", ".join(f"{n} on {h}" for h, n in leftovers.items()) or "none left"
        super().__init__(f"interrupted: job {job_id} was stopped on every host (processes kit stopped: {stopped})",
                         hint=f"`kit logs {job_id}` shows its output")


# ---------------------------------------------------------------- the jobs of a cluster, as their folders record them

JOB_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")
STATES = ("pending", "running", "restarting", "stopping", "succeeded", "failed", "stopped", "lost")
ACTIVE = ("running", "restarting", "stopping")  # a supervisor is there: the job can be stopped, its stacks read
END_MARK = "@@kit-job-end"


@dataclass
class End:
    """The follower's END_MARK line (the job's exit code, or none when its supervisor never came or left none) and
    what follows it (the ending, ending_script), up to ENDING_MAX. A job can write END_MARK into its own log: the
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


# A pid a job's file names, read as digits only; it is the job's while that process carries the mark.
_PID = ("pid_of() {{ read -r p < {folder}/$1 2>/dev/null; case \"$p\" in ''|*[!0-9]*) return 1;; esac; "
        "tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx \"$2\" && echo $p; }}; ")


def follow_script(folder: str, job_id: str, first: int = 1, ending: bool = False) -> str:
    """sh for the primary's container: the job's output from its line `first` (1: its start) while it runs, then
    END_MARK and its exit code (none when it left none), and with `ending` what the supervisor recorded at the end
    (ending_script). Ctrl-C or a dropped session ends the following, never the job."""
    d, first = shlex.quote(folder), int(first)
    return (_PID.format(folder=d) +
            f"i=0; while [ ! -s {d}/supervisor ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
            f"if sup=$(pid_of supervisor KIT_SUPERVISOR={job_id}); then "
            f"tail -n +{first} -s 0.05 -F --pid=$sup {d}/output.log; "  # running: to its end
            f"else tail -n +{first} {d}/output.log; fi 2>/dev/null; "  # ended (or never started): as it is
            f"read -r code < {d}/exit 2>/dev/null; echo \"{END_MARK} $code\"" +
            (f"; {ending_script(d)}" if ending else ""))


def follow_command(container: str, folder: str, job_id: str, first: int = 1, ending: bool = False) -> str:
    return command(exec_argv(container, ["sh", "-c", follow_script(folder, job_id, first, ending)]))


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
    record = {f: read(folder, f) for f in ("launcher", "ranks", "started", "ended", "exit", "environment", "restarts",
                                           "left_out", "hang", "phase")}
    record.update(id=name, stopped=read(folder, "stopped") is not None, planned=read(folder, "plan.json") is not None,
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
    restarts: int = 0        # how often it was started again
    left_out: tuple[str, ...] = ()  # the hosts a restart left out
    hang: str = ""           # what the supervisor found when no rank made progress
    restarting: bool = False  # between two launches
    planned: bool = False    # kit wrote its plan (the supervisor may not have started yet)

    @classmethod
    def parse(cls, line: str) -> "Record":
        raw = json.loads(line)
        return cls(raw["id"], raw.get("launcher") or "horovod", tuple((raw.get("ranks") or "").split()),
                   _int(raw.get("started")), _int(raw.get("ended")), _int(raw.get("exit")), bool(raw.get("stopped")),
                   bool(raw.get("alive")), raw.get("environment") or "", _int(raw.get("restarts")) or 0,
                   tuple((raw.get("left_out") or "").split()), raw.get("hang") or "", raw.get("phase") == "restarting",
                   bool(raw.get("planned")))

    @property
    def state(self) -> str:
        """pending -> running (-> restarting -> running ...) (-> stopping) -> succeeded | failed | stopped; lost when
        neither its supervisor nor its end is there (its container was removed or restarted under it)."""
        if self.exit_code is not None:
            if self.stopped:
                return "stopped"
            return "succeeded" if self.exit_code == 0 else "failed"
        if self.alive:
            return "stopping" if self.stopped else "restarting" if self.restarting else "running"
        if self.stopped:
            return "stopped"
        return "pending" if self.planned and self.started is None else "lost"

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


JOB_FORMS = "a job id, a unique start of one, its last 4 characters (after the last dash), or last (the newest)"


def check_job_ref(text: str) -> str:
    """How a user may name a job (checked before any host is asked): `last`, a whole id, the start of one, or the
    4-hex tail after its last dash, as people read it off the screen."""
    if text != "last" and not re.fullmatch(r"[0-9a-f-]{1,20}", text):
        raise BadInput(f"'{text}' is not a job id", hint=f"give {JOB_FORMS}; `kit jobs` lists them")
    return text


def resolve_job(ref: str, ids: list[str], cluster: str) -> str:
    """The job `ref` names among the cluster's job ids (check_job_ref's forms). Ids start with their time, so the
    newest is the greatest; a start or tail that fits several is refused with them listed."""
    check_job_ref(ref)
    if not ids:
        raise BadInput(f"no jobs on cluster {cluster} yet", hint="`kit run train.py` starts one")
    if ref == "last" or ref in ids:
        return max(ids) if ref == "last" else ref
    found = sorted(i for i in ids if i.startswith(ref) or i.rsplit("-", 1)[-1] == ref)
    if len(found) == 1:
        return found[0]
    if not found:
        raise BadInput(f"no job {ref} on cluster {cluster}", hint=f"give {JOB_FORMS}; `kit jobs` lists them")
    shown = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    tails = all(i.rsplit("-", 1)[-1] == ref for i in found)  # then the last 4 characters are what fits several
    raise BadInput(f"job {ref} is ambiguous on cluster {cluster}: it fits {shown}",
                   hint=f"give more of the id: its start, e.g. {found[-1]}" if tails else
                   "give more of the id, or its last 4 characters")


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
