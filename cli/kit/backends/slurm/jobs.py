"""`kit run --on slurm` and what follows it: the job's folder copied to the login host's shared storage
(kit.backends.slurm.folder), its sbatch script (kit.backends.slurm.sbatch) submitted, its output read back as kit shows a job's, its state, and scancel.

kit talks to Slurm only through its commands on the login host (over the user's SSH, host keys checked), or on this
machine where `slurm.login` is not set: sbatch, squeue, sacct, scancel. What kit keeps of a job is a small
record in kit's home (its Slurm id, the login host, its folder there), so `kit jobs`, `kit logs` and `kit stop` find
it again.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from kit.config.settings import SlurmConfig
from kit.jobs import schedrecords
from kit.errors import KitError
from kit.config.hosts import Host
from kit.runners.base import Runner
from kit.backends.slurm.output import Failure, Reader
from kit.backends.slurm.folder import variables_name
from kit.backends.slurm.sbatch import ENV_DIR, SCRIPT_NAME

POLL_S = 1.0                 # how often kit reads a followed job's state and output
REMOTE_TIMEOUT_S = 60        # one Slurm command on the login host
# What each launcher needs to import in the job's Python (runtime none), checked before a job is submitted.
IMPORTS = {"horovod": "import torch, horovod.torch", "torchrun": "import torch.distributed.run",
           "tf": "import tensorflow"}
# Slurm's job states (squeue %T, scontrol JobState, sacct State) as kit's. A job Slurm itself ended keeps the cause:
# its time limit (or deadline), a node that failed (or did not boot), memory, or another job that preempted it.
STATES = {"PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "RESV_DEL_HOLD": "pending",
          "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending", "SUSPENDED": "running", "RUNNING": "running",
          "COMPLETING": "running", "STAGE_OUT": "running", "SIGNALING": "running", "RESIZING": "running",
          "COMPLETED": "succeeded", "FAILED": "failed", "NODE_FAIL": "node_fail", "BOOT_FAIL": "node_fail",
          "OUT_OF_MEMORY": "oom", "TIMEOUT": "timeout", "DEADLINE": "timeout", "CANCELLED": "stopped",
          "PREEMPTED": "preempted", "REVOKED": "stopped", "SPECIAL_EXIT": "failed"}
SLURM_ENDED = ("timeout", "node_fail", "oom", "preempted")  # ended by Slurm, for the cause its state names
ENDED = ("succeeded", "failed", "stopped", *SLURM_ENDED)


def login_runner(slurm: SlurmConfig, connect_timeout: int) -> Runner:
    """The login host's runner (over SSH), or this machine's where slurm.login is not set."""
    if slurm.login is None:
        from kit.runners.local import LocalRunner
        return LocalRunner("localhost")
    from kit.runners.ssh import SshRunner
    user, _, host = slurm.login.rpartition("@")
    return SshRunner(Host(host, user=user or None), connect_timeout, source="kit.yaml's slurm.login")


def _run(runner: Runner, command: str, what: str, hint: str | None = None, **kw) -> str:
    return runner.run(command, timeout=REMOTE_TIMEOUT_S, **kw).check(what, hint).stdout


# ------------------------------------------------------------------------------------------------ records

@dataclass(frozen=True)
class SlurmRecord:
    """kit's note of a job it submitted: in kit's home, slurm/<id>.json."""

    id: str
    slurm_id: str
    login: str | None       # slurm.login as it was (None: this machine)
    folder: str             # the job's folder on the login host (absolute)
    launcher: str
    script: str
    ranks: int
    submitted: float
    ended: dict = field(default_factory=dict)  # once seen ended: {"state": ..., "exit": ...} (and "hang")
    hang_timeout: float = 0  # kit's hang watch while kit follows the job (kit run, kit logs -f); 0: none
    per_node: int = 0        # the job's ranks a node (0: a record of an older kit: `ranks` alone)
    restarts: int = 0        # how often kit run --restarts submitted it again (slurm_id is the last start's)
    left_out: tuple[str, ...] = ()  # the nodes those restarts left out
    earlier: tuple[str, ...] = ()   # the Slurm ids of its earlier starts, first first
    straggler: tuple[str, ...] = ()  # what kit's watch said of the nodes that held the others back (kit.jobs.pace)
    straggler_window: float = 120    # how long a node must be slow before it is named (0: never)

    @property
    def output(self) -> str:
        return f"{self.folder}/kit-{self.slurm_id}.out"


def save(record: SlurmRecord) -> None:
    schedrecords.save("slurm", record)


def _record(data: dict) -> SlurmRecord:
    record = SlurmRecord(**data)
    record = replace(record, left_out=tuple(record.left_out), earlier=tuple(record.earlier),
                     straggler=tuple(str(line) for line in record.straggler))
    for slurm_id in (record.slurm_id, *record.earlier):
        if not re.fullmatch(r"\d{1,12}", slurm_id):  # it reaches the login host's shell
            raise ValueError(slurm_id)
    return record


def records() -> list[SlurmRecord]:
    return schedrecords.load("slurm", _record)


# ------------------------------------------------------------------------------------------------ submitting

def check_environment(runner: Runner, slurm: SlurmConfig, launcher: str) -> None:
    """Before submitting: the image file is there (pyxis, apptainer), or the nodes' Python imports what the
    launcher needs (runtime none; read on the login host, which shares the nodes' software on a Slurm site)."""
    if slurm.runtime != "none":
        image = shlex.quote(slurm.container_image)
        _run(runner, f"cd && test -r {image}", f"{slurm.container_image} is not there to read",
             hint=f"make it with `kit export --to {'enroot' if slurm.runtime == 'pyxis' else 'docker-archive'}` and "
                  "put it on storage every node sees, at the path slurm.container_image names")
        return
    python = shlex.quote(slurm.python_path)
    _run(runner, f"cd / && {python} -I -c {shlex.quote(IMPORTS[launcher])}",
         f"the job's Python ({slurm.python_path}) cannot run {launcher} jobs: `{IMPORTS[launcher]}` fails",
         hint="make the nodes' Python from kit's image, `kit export --to venv -o DIR` (DIR on storage every node "
              "sees; it sets slurm.python_path), or use runtime pyxis or apptainer with kit's image")


def parse_share(text: str, tasks_per_node: int, gpus_per_node: int | None) -> int | None:
    """`sinfo -h -N -o '%c %G'` (each node's CPUs and generic resources) -> the CPUs a task gets by default: each
    node's CPUs (its share for the job's GPUs, where the node has GPUs: 2 of 8 GPUs, a quarter), divided among the
    job's tasks on it; the fewest any node gives. None when sinfo named no node. Pure."""
    shares = []
    for line in text.splitlines():
        words = line.split(None, 1)
        if not words or not words[0].isdigit():
            continue
        cpus = int(words[0])
        gpus = sum(int(m[1]) for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", words[1] if len(words) > 1 else ""))
        if gpus_per_node and gpus:
            cpus = cpus * min(gpus_per_node, gpus) // gpus
        shares.append(max(cpus // max(tasks_per_node, 1), 1))
    return min(shares) if shares else None


def node_share(runner: Runner, slurm: SlurmConfig, shape) -> int | None:
    """The job's --cpus-per-task where neither kit.yaml nor the command line gives one, from Slurm's node facts (the
    partition's nodes); None (Slurm's own default, a CPU a task) when sinfo does not answer."""
    partition = f"-p {shlex.quote(slurm.partition)} " if slurm.partition else ""
    r = runner.run(f"sinfo -h -N {partition}-o '%c %G'", timeout=REMOTE_TIMEOUT_S)
    return parse_share(r.stdout, shape.tasks_per_node, shape.gpus_per_node) if r.ok else None


def submit(runner: Runner, remote: str, unset: list[str], options: tuple[str, ...] = (),
           args: tuple[str, ...] = ()) -> str:
    """sbatch in the job's folder; the Slurm job id. sbatch gives the job the environment it runs in: the job's own
    variables (`unset`, which a user may have in this shell's) are taken out of it, so Slurm never records them.
    options: sbatch's, before the script (they win over its #SBATCH lines); args: the script's."""
    env = "env " + "".join(f"-u {name} " for name in unset) if unset else ""
    given = "".join(f"{shlex.quote(word)} " for word in options)
    after = "".join(f" {shlex.quote(word)}" for word in args)
    out = _run(runner, f"cd {shlex.quote(remote)} && {env}sbatch --parsable {given}{SCRIPT_NAME}{after}",
               "sbatch refused the job",
               hint="the tail above is sbatch's reason (a partition, account or time limit of slurm: in kit.yaml?)",
               changes=True)
    found = re.search(r"^(\d+)(?:;\S+)?$", out.strip(), re.M)
    if not found:
        raise KitError(f"sbatch gave no job id (it said: {out.strip()[:200]!r})", host=runner.host)
    return found[1]


# ------------------------------------------------------------------------------------------------ state

def parse_squeue(text: str) -> str | None:
    """squeue -h -j ID -o %T (and more after it) -> kit's state, None when Slurm no longer lists the job."""
    word = text.split()[0] if text.strip() else ""
    return STATES.get(word.rstrip("+"), "running") if word else None


def parse_sacct(text: str) -> tuple[str, int | None] | None:
    """`sacct -n -P -X -o State,ExitCode` (or sacct -c's jobcomp lines) -> (kit's state, exit code); None unless it
    gave exactly one record. (The job completion file that sacct -c reads has each job's name unescaped on its line,
    and sacct takes a `JobId=` in a name as the record's: another job named `x JobId=42` adds a record of its own to
    job 42's. Two records are no answer.)"""
    found = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and re.fullmatch(r"\d+:\d+", parts[1]) and parts[0].strip():
            state = STATES.get(parts[0].split()[0], "failed")
            code, signal = (int(x) for x in parts[1].split(":"))
            found.append((state, code or (128 + signal if signal else 0)))
    return found[0] if len(found) == 1 else None


GONE = "Invalid job id"  # what squeue says of a job Slurm no longer keeps


def job_state(runner: Runner, slurm_id: str) -> tuple[str, int | None]:
    """(kit's state, exit code): the state squeue gives while Slurm keeps the job (in every state: -t all); once it
    ended, the state and exit code of sacct's one record (its database, or the job completion file with -c) where it
    agrees with squeue's ended state (or squeue no longer lists the job), else squeue's state (COMPLETED: exit code
    0, by Slurm's meaning of it). ("lost", None) when Slurm answers and none knows it; ("unknown", None) when Slurm
    did not answer (a busy controller: ask again later).

    Only fields kit names are read, each alone on its line or between kit's own separators: never a line that also
    holds the job's name, comment or folder, which a job may set to anything (`scontrol update JobId=$SLURM_JOB_ID
    JobName=x-JobState=COMPLETED-ExitCode=0:0`). sacct -c's file is such a line (parse_sacct)."""
    r = runner.run(f"squeue -h -t all -j {slurm_id} -o %T", timeout=REMOTE_TIMEOUT_S)
    if not r.ok and GONE not in r.stdout + r.stderr:
        return "unknown", None
    listed = parse_squeue(r.stdout) if r.ok else None
    if listed is not None and listed not in ENDED:
        return listed, None
    answered = False
    for flags in ("", "-c "):
        r = runner.run(f"sacct {flags}-n -P -X -j {slurm_id} -o State,ExitCode", timeout=REMOTE_TIMEOUT_S)
        if r.ok and (found := parse_sacct(r.stdout)):
            if listed is not None and found[0] != listed:  # the record is not this job's: squeue's state stands
                break
            return found
        answered = answered or r.ok
    if listed is not None:  # ended, and no record of its exit code (yet, or none this user may read)
        return listed, 0 if listed == "succeeded" else None
    return ("lost" if answered else "unknown"), None


# ------------------------------------------------------------------------------------------------ following

@dataclass(frozen=True)
class Poll:
    state: str | None     # squeue's, as kit's; None: Slurm no longer lists it; "unknown": squeue failed (error)
    lines: list[str]      # whole lines of the output file that were not read before
    reason: str = ""      # squeue's reason (a pending job's: Resources, Priority, ...)
    error: str = ""       # what squeue said when it failed
    more: bool = False    # the look read as much as it may: more of the output may follow at once


POLL_MARK = "@@kit-poll"
UNANSWERED_S = 120        # squeue failing this long, in a row, ends kit's following (the job goes on)


POLL_LINES = 20000          # at most this many lines of a job's output a look reads (the next look reads on)
POLL_BYTES = 4 << 20        # and at most this much of them


def poll_command(record: SlurmRecord, read: int) -> str:
    """One look at a job: squeue's state and reason, its exit status, then the output file's lines after the first
    `read`, at most POLL_LINES and POLL_BYTES of them, read only as a regular file (the job writes it, and may make
    it a FIFO or a link to /dev/zero)."""
    out = shlex.quote(record.output)
    return (f"squeue -h -j {record.slurm_id} -o '%T %r' 2>&1; echo {POLL_MARK} $?; "
            f"if [ -f {out} ] && [ ! -h {out} ]; then tail -n +{read + 1} {out} 2>/dev/null | head -n {POLL_LINES} "
            f"| head -c {POLL_BYTES}; fi; true")


def parse_poll(text: str) -> Poll:
    said, _, rest = text.partition(f"{POLL_MARK} ")
    status, _, output = rest.partition("\n")
    lines = output.split("\n")[:-1]  # the last line is cut, or empty: read again next time
    if not lines and len(output) >= POLL_BYTES // 4:  # one line longer than a look reads: taken as it is, cut
        lines = [output]
    more = bool(lines) and (len(lines) >= POLL_LINES or len(output.encode(errors="replace")) >= POLL_BYTES)
    if status.strip() != "0":
        return Poll(None, lines, more=more) if GONE in said else \
            Poll("unknown", lines, error=said.strip()[-300:], more=more)
    reason = said.strip().split(" ", 1)[1] if " " in said.strip() else ""
    return Poll(parse_squeue(said), lines, reason, more=more)


@dataclass(frozen=True)
class Ending:
    state: str
    exit_code: int | None
    failure: Failure | None
    hang: str = ""           # the hang watch's report: the job made no progress (state "hung": kit is to stop it)
    lost: tuple[str, ...] = ()  # state "lost": the job's nodes that went silent while it runs on (kit is to stop it)

    @property
    def code(self) -> int | None:
        """The job's exit code as kit reports it: the first failure's own (Slurm's is then the other tasks' SIGTERM)."""
        return self.failure.exit_code if self.failure else self.exit_code


def ended(record: SlurmRecord, state: str, code: int | None, hang: str = "") -> SlurmRecord:
    """The record, saved with how the job ended (hang: the hang watch's report, of a job kit stopped for it)."""
    done = replace(record, ended={"state": state, "exit": code, **({"hang": hang} if hang else {})})
    save(done)
    return done


def read_rest(runner: Runner, record: SlurmRecord, read: int, feed: Callable[[str], None]) -> tuple[Poll, int]:
    """The job's output from line `read` on, to its end as it is now, look after look, each line to `feed`: the last
    look (its state is squeue's now), and how many lines are read in all."""
    for _ in range(1 << 16):  # (bounded: each look but the last reads POLL_LINES lines or POLL_BYTES)
        poll = parse_poll(runner.run(poll_command(record, read), timeout=REMOTE_TIMEOUT_S)
                          .check(f"cannot read job {record.id} (Slurm job {record.slurm_id})").stdout)
        for line in poll.lines:
            feed(line)
        read += len(poll.lines)
        if not poll.more:
            break
    return poll, read


def follow(runner: Runner, record: SlurmRecord, reader: Reader, *, first: int = 0,
           sleep: Callable[[float], None] = time.sleep, watch: Callable[[], Ending | None] | None = None) -> Ending:
    """Show the job's output as it comes, until Slurm says it ended; then how it ended. watch: kit's watch
    (kit.backends.slurm.watch), asked at each look while the job runs: an Ending it gives ends the follow (a hang,
    a node lost: the job runs on, for kit to stop)."""
    read, queued, answered = first, False, time.monotonic()
    while True:
        poll, read = read_rest(runner, record, read, reader.feed)
        if poll.state != "unknown":
            answered = time.monotonic()
        elif time.monotonic() - answered > UNANSWERED_S:
            raise KitError(f"squeue has not answered for {UNANSWERED_S} s about job {record.id} (Slurm job "
                           f"{record.slurm_id}): it said {poll.error!r}", host=runner.host,
                           hint=f"the job goes on; `kit logs {record.id} -f` follows it again once Slurm answers")
        if poll.state == "pending" and not queued:
            queued = True
            why = f" ({poll.reason})" if poll.reason not in ("", "None") else ""
            reader.show(None, None, f"kit: Slurm job {record.slurm_id} waits in the queue{why}")
        if poll.state is None or poll.state in ENDED:
            break
        if poll.state == "running" and watch is not None and (seen := watch()):
            return seen
        sleep(POLL_S)
    read_rest(runner, record, read, reader.feed)  # what was written as it ended
    forget_variables(runner, record)
    state, code = job_state(runner, record.slurm_id)
    # Which task failed, where, with which code: srun's lines in the output, which the job can write too. They name
    # a failure only of a job Slurm says failed (a task that ran out of memory, or was on the node that failed,
    # included), and never exit code 0: the job's state and whether it failed are Slurm's alone. A job that reached
    # its time limit, or was preempted, failed in no task: Slurm ended them all.
    return Ending(state, code, reader.first_failure() if state in ("failed", "oom", "node_fail") else None)


def cancel(runner: Runner, record: SlurmRecord, signal: str | None = None) -> None:
    """scancel, once Slurm's job of that id is this one (its folder, squeue's field alone on its line): Slurm numbers
    jobs anew after a reset. signal: only send it to the job's tasks (not the batch script), e.g. USR2."""
    r = runner.run(f"squeue -h -j {record.slurm_id} -o %Z", timeout=REMOTE_TIMEOUT_S)
    workdir = r.stdout.rstrip("\n") if r.ok else ""
    if workdir and workdir != record.folder:
        raise KitError(f"Slurm job {record.slurm_id} is no longer kit's job {record.id}: it runs in {workdir}, "
                       f"not {record.folder}", host=runner.host, hint="nothing was cancelled; `squeue --me` on the "
                       "login host lists your jobs")
    _run(runner, f"scancel {f'--signal={signal} ' if signal else ''}{record.slurm_id}",
         f"scancel refused job {record.id} (Slurm job {record.slurm_id})", changes=True)
    if signal is None:
        forget_variables(runner, record)


def seen_ended(runner: Runner, record: SlurmRecord, state: str, code: int | None) -> SlurmRecord:
    """The first time kit sees the job ended (`kit jobs`, `kit logs`, `kit stop`: whichever comes first): its
    variables' file removed (a job cancelled while it waited, or killed with its node, never ran the batch script's
    trap) and its end saved."""
    forget_variables(runner, record)
    return ended(record, state, code)


def forget_variables(runner: Runner, record: SlurmRecord) -> None:
    """The job's variables' file, removed by kit too: the batch script removes it when it ends, but a job refused,
    cancelled while it waits, or killed never runs that."""
    name = variables_name(record.id, record.restarts)
    runner.run(f"rm -f {shlex.quote(f'{record.folder}/{ENV_DIR}/{name}')}", timeout=REMOTE_TIMEOUT_S, changes=True)


def wait_gone(runner: Runner, record: SlurmRecord, seconds: float, sleep: Callable[[float], None] = time.sleep) -> str:
    """After scancel: wait (bounded) until Slurm says the job ended; its state then."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = parse_squeue(runner.run(f"squeue -h -j {record.slurm_id} -o %T", timeout=REMOTE_TIMEOUT_S).stdout)
        if state is None or state in ENDED:
            return job_state(runner, record.slurm_id)[0]
        sleep(0.5)
    return "running"


def resolve(ref: str) -> SlurmRecord | None:
    """The Slurm job `ref` names (kit's forms of a job id: kit.jobs.model.JOB_FORMS), None when it names none; a ref that
    fits several is refused with them."""
    from kit.jobs.model import pick_record
    return pick_record(ref, {r.id: r for r in records()}, "Slurm")
