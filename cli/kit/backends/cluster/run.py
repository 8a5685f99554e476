"""`kit run`: a job across the cluster, started in the primary's container under its supervisor (kit.backends.cluster.supervisor),
apart from kit's session: horovodrun, or (torchrun, tf) a script that starts each host's command over the cluster
SSH. kit follows its output (to the job's end here; kit.backends.cluster.control: the follower, stop), lists the cluster's jobs from
their folders (kit.backends.cluster.records) and stops them.

Every process of a job carries KIT_JOB=<id> in its environment (horovodrun passes its environment to the ranks it
starts), so when the job ends, fails or is interrupted, kit finds and stops whatever is left of it on every host.
Output is kept on the primary, in the job's folder. With copy storage, what the ranks wrote in the workspace is then
copied to every host.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from kit.jobs import env as jobenv
from kit.cluster import state as st
from kit.jobs.commands.docker import command, exec_argv
from kit.jobs.commands.horovod import Failures, HorovodOptions, exit_report, split_rank
from kit.jobs.commands.launchers import tf_config
from kit.errors import HostsFailed, KitError
from kit.jobs.model import Policy, new_job_id, parse_duration  # noqa: F401 (used through this module too)
from kit.cluster.fanout import fan_out
from kit.backends.cluster.control import (AFTER_MAX, End, Interrupted, follow_command, follow_script, launch_ranks,
                                          parse_after, parse_ending, parse_reaped, parse_unsettled, stop, sweep)
from kit.backends.cluster.records import _int
from kit.network import measure
from kit.network.choose import Member
from kit.cluster.steps import workspace
from kit.cluster.steps.image import chunks
from kit.cluster.steps.node import Node
from kit.backends.cluster.supervisor import shipped, starter
from kit.backends.cluster.supervisor.launch import (AFTER, MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, TORCHRUN_PREFIX,
                                                    NodeCommand, Plan, Slot, placement, torch_ranks, torchrun_argv)
from kit.backends.cluster.supervisor.supervise import FREE_PORT


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
    network: tuple[tuple[str, str], ...] = ()  # horovod: the training network's variables for horovodrun's ranks

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
                    hang_timeout=self.policy.hang_timeout, pace_window=self.policy.straggler_window,
                    env=bool(self.env), here=self.state.primary.address,
                    primary="" if self.state.primary.address in addresses else self.state.primary.name,
                    spread=not self.state.workspace_shared and len(addresses | {self.state.primary.address}) > 1,
                    cluster=[Slot(h.name, h.address, h.slots or 0) for h in self.state.hosts])

    def start_command(self) -> str:
        """supervisor.start in the primary's container: kit's one conversation that starts the job (see there)."""
        return command(["docker", "exec", "-i", self.state.primary.place.container, "python", "-I", "-c", SUPERVISOR,
                        "--start"])

    def supervisor_command(self) -> str:
        """The job's supervisor in the primary's container, apart from kit's session: `docker exec -d`, whose process
        has its parent outside the container (ppid 0 there), which no process of a job can make its own: kit tells
        a supervisor from a process dressed as one by it. Its variables are kit's own (none of the job's)."""
        # Gloo's rendezvous waits 30 s for every rank by default: give slow-starting ranks (a loaded host
        # importing torch) the same time as horovodrun's --start-timeout.
        env = {"KIT_SUPERVISOR": self.id, "HOROVOD_GLOO_TIMEOUT_SECONDS": str(self.options.start_timeout),
               **dict(self.network)}
        if self.env:
            env["KIT_ENV"] = "1"  # each rank must find the job's variables
        # -I: the workspace (where a job may have left a json.py) is not on the supervisor's path
        return command(["docker", "exec", "-d", "-w", "/", *(a for k, v in env.items() for a in ("-e", f"{k}={v}")),
                        self.state.primary.place.container, "python", "-I", "-c", SUPERVISOR,
                        f"{self.folder}/plan.json"])

    def request(self, follow: str | None, others: list[Node] = (), files: dict[str, str] | None = None) -> bytes:
        """supervisor.start's first line: the job's folder and files, the variables (theirs go on stdin, never on a
        command line), what to do once its supervisor runs (follow: a follow script), and the job's other hosts, to
        be given its files (name -> sha256; None where the hosts share the workspace) and variables."""
        written = {"plan.json": self.plan().dump(), **({"environment": jobenv.names(self.env)} if self.env else {})}
        return json.dumps({"folder": self.folder, "files": written,
                           "follow": follow, "workspace": self.state.workspace,
                           "env_file": jobenv.env_file(self.env).decode() if self.env else None,
                           "hosts": [{"name": n.name, "address": n.address} for n in others],
                           "job_files": files or {}, "copy": files is not None}).encode() + b"\n"


# What the primary's container runs as a job's supervisor: kit.backends.cluster.supervisor's modules as one script (the standard
# library only).
SUPERVISOR = shipped.source()


def free_port(node: Node) -> int:
    r = node.runner.run(command(exec_argv(node.place.container, ["python", "-I", "-c", FREE_PORT])))
    return int(r.check("cannot find a free TCP port in the container").stdout.strip())


def fanout(launcher: str, state: st.ClusterState, nodes: list[Node], slots: list[Slot], rank_cmd: list[str],
           nproc: int | None, members: dict[str, Member]) -> tuple[tuple[NodeCommand, ...], tuple[Slot, ...]]:
    """torchrun or tf: each host's command, and the host of each rank. tf: a port for each worker, picked free on
    the hosts now (torchrun's store port is picked by the supervisor at each launch). slots: the job's hosts, in the
    order of their node ranks (the state's, or -H's); nodes: at least theirs; members: each host's interface and
    address on the training network (kit.network.measure.route)."""
    hosts = [state.host(s.host) for s in slots]
    if launcher == "torchrun":
        commands = []
        for h, slot in zip(hosts, slots):  # nodes, rank, store address and port are the launch's: the supervisor's
            commands.append(NodeCommand(h.name, h.address, (
                "env", *measure.host_env(members[h.name]), f"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE={TORCHRUN_PREFIX}",
                *torchrun_argv(NNODES, nproc or slot.slots, NODE_RANK, MASTER_ADDR, MASTER_PORT, rank_cmd)), None))
        return tuple(commands), tuple(torch_ranks(slots, nproc))
    by_name = {n.name: n for n in nodes}
    ports = fan_out("finding free ports", [by_name[s.host] for s in slots], free_port, lambda n: n.name)
    workers = [f"{s.talks_at}:{p}" for s, p in zip(slots, ports)]
    commands = [NodeCommand(h.name, h.address, ("env", *measure.host_env(members[h.name]),
                                                f"TF_CONFIG={tf_config(workers, i)}", *rank_cmd), i)
                for i, h in enumerate(hosts)]
    return tuple(commands), tuple(replace(s, slots=1) for s in slots)


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
    unsettled: dict[str, str] = field(default_factory=dict)  # host -> what its sweep was still stopping (no job starts
                                                             # there until a sweep stops nothing)


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


# The most of one line of the starter's answers that kit reads: every other host's workspace manifest is one line
# (about 110 bytes a file and host: 2M of them).
ANSWERS_KEPT = 256 << 20


class Starting:
    """kit's side of supervisor.start: the conversation with the primary's container that copies the job there and,
    from there, to the job's other hosts, starts it, and (follow) goes on with its output."""

    def __init__(self, job: Job, primary: Node, follow: bool, others: list[Node], files: dict[str, str] | None):
        self.job, self.primary = job, primary
        self.talk = primary.runner.converse(job.start_command(), silence=workspace.COPY_TIMEOUT_S)
        self.said = self.talk.lines(ANSWERS_KEPT)  # its answers: one line holds every other host's manifest
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
        remote = workspace.parse_manifest("\n".join(self.answer(starter.MANIFEST_END)[:-1]))
        names = workspace.changed(local, remote)
        if names:
            with tempfile.TemporaryDirectory(prefix="kit-job-") as tmp:
                path = workspace.tarball(folder, names, Path(tmp) / "job.tar.gz")
                self.send({"tar": path.stat().st_size})
                for block in chunks(path):
                    self.talk.send(block)
            said = self.answer(starter.COPIED)[-1]
            if said != starter.COPIED:
                raise KitError(f"cannot copy the job's files to {self.job.state.workspace}: "
                               f"{said.removeprefix(starter.COPIED + ' failed: ')}", host=self.primary.name,
                               hint="check free disk space on the host")
        return len(names), {**remote, **local}

    def others(self, local: dict[str, str]) -> dict[str, tuple[int, dict[str, str]]]:
        """The job's other hosts given its files and variables from the primary: host -> (files sent, its workspace
        then); HostsFailed naming each host that failed."""
        self.send({"others": True})
        try:
            done = json.loads(self.answer(starter.HOSTS)[-1][len(starter.HOSTS):])
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
        """Start the job, its log begun with kit's lines: its supervisor started apart from this conversation, which
        waits for it; from here it may say nothing for as long as it runs."""
        self.send({"go": list(setup)})
        self.answer(starter.LAUNCH)
        r = self.primary.runner.run(self.job.supervisor_command(), timeout=60)
        self.send({"launched": "" if r.ok else
                   f"docker exec failed (exit {r.exit_code}): {' '.join(r.tail().split())[-300:]}"})
        self.talk.end_input()
        self.talk.quiet(None)
        self.said = self.talk.lines()  # the job's output: its lines cut at LINE_KEPT


def copy_and_start(job: Job, nodes: list[Node], folder: Path, setup: Callable[["Synced"], tuple[str, ...]],
                   follow: bool, secrets: tuple[Path, ...] = ()) -> tuple["Synced", Starting]:
    """Copy what changed of the job's folder to the primary's workspace, and from there to the other hosts' (unless
    they share it), give every host's container the job's variables, and start the job with setup(what was copied)
    as its log's first lines: all in one conversation with the primary (Starting), so that kit's own link carries
    each byte once. Nothing starts unless every host has its part. nodes[0] is the primary. secrets: the job's
    --env-file files, never copied (workspace.Ignore)."""
    ignore = workspace.Ignore.of(folder, secrets)
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


def start(starting: Starting) -> None:
    """A detached job: started once its supervisor runs (copy_and_start began it)."""
    starting.answer(starter.STARTED)
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
                if ended.seen and line == f"@@{AFTER}":  # then kit's own line of every host's manifest, long
                    for rest in starting.talk.lines(AFTER_MAX):
                        handle(rest)
                    break
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
        unsettled = parse_unsettled(end.get("unsettled", ""), names)
    else:  # no supervisor ended it (its container went, or it failed): kit stops what is left
        swept = sweep([n for n in nodes if n.name not in left_out], job_id)
        leftovers, unsettled = swept.killed, swept.unsettled
    return Outcome(ended.code, failures.first(), leftovers,
                   [a for a in end.get("env_kept", "").split() if a in addresses], ranks,
                   _int(end.get("restarts")) or 0, end.get("hang", ""), sorted(left_out),
                   parse_after(end[AFTER]) if AFTER in end else None, unsettled)
