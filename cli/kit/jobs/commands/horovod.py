"""horovodrun from the inventory, and reading its output back. Pure."""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, replace

from kit.errors import BadInput
from kit.backends.cluster.supervisor.launch import ENV_DIR, PROGRESS_DIR, Slot, horovodrun

_RANK_LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")
_FAILED = re.compile(r"Process (\d+) exit with status code (-?\d+)")
EXIT_MARK = "@@kit-exit"
_EXIT = re.compile(rf"^{EXIT_MARK} (-?\d+) ([\d.]+)$")
# What the other ranks die of once one has failed: Horovod's shutdown, or Gloo losing a peer.
VICTIM_MARKS = ("Horovod has been shut down", "HorovodInternalError", "Connection closed by peer",
                "Connection reset by peer")


# Runs the script as `python script.py` would, with the job's variables, and says when and how it ended: at the
# moment it raises or exits, before atexit handlers such as Horovod's shutdown (which lets the other ranks fail
# first). horovodrun learns of exits over SSH, late and out of order, so its own account cannot say which rank
# failed first. A thread beside the script keeps the rank's heartbeat (PROGRESS_DIR/<job>/<rank>; a relative one from
# where the rank started, whatever folder the script goes to): how often its main thread was seen somewhere new, and
# where it is, for the hang watch; on SIGUSR2 every thread's stack goes to <rank>.stack beside it (faulthandler: a
# rank stuck in C code answers too).
# Its own modules are the standard library's whatever the workspace holds (a json.py or signal.py there, or in a
# PYTHONPATH folder, would stand in for them): they are imported with the workspace and PYTHONPATH out of sys.path,
# which is then the one `python` gave, for the script.
def rank_launcher(env_dir: str = ENV_DIR, progress_dir: str = PROGRESS_DIR, every: float = 2.0,
                  look: float = 0.2) -> str:
    return f"""\
import os, sys  # loaded as Python started, before the workspace was on sys.path
USERS_PATH, OWN = sys.path[:], [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + ["", os.curdir]
OWN = {{os.path.abspath(p) for p in OWN}} | set(OWN)
sys.path[:] = [p for p in USERS_PATH if p not in OWN]
import contextlib, faulthandler, json, pkgutil, runpy, signal, threading, time, types
sys.path[:] = USERS_PATH
def rank_of(env):
    if env.get("HOROVOD_RANK", env.get("RANK", "")).isdigit():
        return int(env.get("HOROVOD_RANK", env.get("RANK")))
    try:
        return int(json.loads(env["TF_CONFIG"])["task"]["index"])
    except (KeyError, ValueError, TypeError):
        return None
RANK, JOB = rank_of(os.environ), os.path.basename(os.environ.get("KIT_JOB", ""))
BEAT = os.path.abspath(os.path.join(os.environ.get("KIT_PROGRESS_DIR", {progress_dir!r}), JOB, str(RANK))) if JOB and RANK is not None else None
def place(frame):  # where the main thread is: its innermost frame, and the innermost of the job's own code
    inner = "%s:%s in %s" % (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    while frame is not None and ("/lib/python" in frame.f_code.co_filename or frame.f_code.co_filename.startswith("<")):
        frame = frame.f_back
    own = frame and "%s:%s in %s" % (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    return inner if own in (None, inner) else inner + " (from " + own + ")"
ENDED, LOCK, STACK = threading.Event(), threading.Lock(), None
PACE = dict(steps=0, data_s=0.0, comm_s=0.0)  # the script's steps, and its seconds waiting for data and in collectives
OPEN = dict(data_s=None, comm_s=None)  # when the wait going on now began: a heartbeat counts it so far
def waited(kind, began):
    OPEN[kind] = None  # (first: a heartbeat meanwhile counts this wait once at most, never twice)
    PACE[kind] += time.monotonic() - began
def paced():  # the counters now, the waits going on counted so far (read PACE first: see waited)
    now, counts = time.monotonic(), dict(PACE)
    for kind, began in list(OPEN.items()):
        if began is not None:
            counts[kind] += max(0.0, now - began)
    return now, counts
def hook_horovod():  # Horovod's waits for its collectives count as time in collectives (its synchronize, by any name)
    ops = sys.modules.get("horovod.torch.mpi_ops")
    given = getattr(ops, "synchronize", None)
    if given is None or getattr(given, "kit_pace", False):
        return
    def synchronize(*args, **kwargs):
        began = OPEN["comm_s"] = time.monotonic()
        try:
            return given(*args, **kwargs)
        finally:
            waited("comm_s", began)
    synchronize.kit_pace = True
    for name, module in list(sys.modules.items()):
        if name.partition(".torch")[0] == "horovod" and getattr(module, "synchronize", None) is given:
            module.synchronize = synchronize
def pace_module():  # `import kit_pace` in the script: its marks for the training loop (docs/jobs.md, Slow ranks)
    module = types.ModuleType("kit_pace", "kit's marks for a training loop: step() after each step; data(loader) "
                              "around the loader; with comm(): around a wait for a collective kit cannot see")
    def step(count=1):
        hook_horovod()
        PACE["steps"] += count
    def data(iterable):
        items = iter(iterable)
        while True:
            began = OPEN["data_s"] = time.monotonic()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                waited("data_s", began)
            yield item
    @contextlib.contextmanager
    def comm():
        began = OPEN["comm_s"] = time.monotonic()
        try:
            yield
        finally:
            waited("comm_s", began)
    module.step, module.data, module.comm = step, data, comm
    return module
sys.modules["kit_pace"] = pace_module()
def heartbeat():
    # The main thread moves when it is seen somewhere new; it is looked at {1 / look:g} times a second, so that a loop that
    # waits at one place most of the time is still seen elsewhere now and then. (Its CPU time says nothing: a rank
    # that waits in a collective may spin.)
    main, last, moves, where = threading.main_thread().ident, None, 0, "?"
    while True:
        try:
            for _ in range({int(every / look)}):
                frame = sys._current_frames().get(main)
                if frame is None:
                    return  # the main thread has ended
                here = (place(frame), frame.f_lasti)
                frame = None
                if here != last:
                    moves, last, where = moves + 1, here, here[0]
                time.sleep({look!r})
            with LOCK:  # once the script has ended, its heartbeat is gone for good
                if ENDED.is_set():
                    return
                os.makedirs(os.path.dirname(BEAT), exist_ok=True)
                now, counts = paced()
                with open(BEAT + ".new", "w") as f:
                    json.dump(dict(rank=RANK, pid=os.getpid(), moves=moves, where=where, t=now, **counts), f)
                os.replace(BEAT + ".new", BEAT)
                if STACK and os.fstat(STACK.fileno()).st_size:  # a stack written (SIGUSR2): on the shared
                    os.fsync(STACK.fileno())                    # filesystem, where the login host reads it
        except Exception:  # the job's output is the job's: the heartbeat never writes there
            time.sleep({every!r})
def report(code):
    print("{EXIT_MARK} %d %.6f" % (code, time.time()), flush=True)
    with LOCK:
        ENDED.set()
        try:
            os.remove(BEAT)
        except (OSError, TypeError):
            pass
if BEAT:
    threading.Thread(target=heartbeat, daemon=True, name="kit-heartbeat").start()
    try:  # every thread's stack into BEAT.stack on SIGUSR2: how kit's hang watch under Slurm takes a rank's stack
        os.makedirs(os.path.dirname(BEAT), exist_ok=True)
        STACK = open(BEAT + ".stack", "w")
        faulthandler.register(signal.SIGUSR2, file=STACK, all_threads=True)
        # a process the rank forks (a DataLoader's worker) ignores it: the stack asked for is the rank's
        os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN))
    except Exception:
        pass
def own(name):  # this host's part of a KIT_RANK_* map (`address=value ...`, by horovodrun's HOROVOD_HOSTNAME)
    return dict(p.split("=", 1) for p in os.environ.pop(name, "").split() if "=" in p).get(os.environ.get("HOROVOD_HOSTNAME", ""))
NIC, HCAS = own("KIT_RANK_NICS"), own("KIT_RANK_HCAS")
if NIC:  # this host's own interface on the training network (horovodrun gives every rank the first host's name)
    os.environ.update(HOROVOD_GLOO_IFACE=NIC, GLOO_SOCKET_IFNAME=NIC, NCCL_SOCKET_IFNAME="=" + NIC)
if HCAS:  # its RDMA ports, exact names
    os.environ["NCCL_IB_HCA"] = "=" + HCAS
VARIABLES = os.environ.pop("KIT_ENV", None)  # 1, or (Slurm) the name of the start's file: the job has variables
if VARIABLES:  # this rank must have them too
    try:
        with open(os.path.join({env_dir!r}, os.path.basename(os.environ.get("KIT_JOB", "") if VARIABLES == "1" else VARIABLES))) as f:
            os.environ.update(json.load(f))
    except (OSError, ValueError) as e:
        print("kit: this rank cannot read the job's variables (%s)" % e, file=sys.stderr, flush=True)
        report(1)
        sys.exit(1)
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    report(e.code if isinstance(e.code, int) else int(e.code is not None))
    raise
except BaseException:
    report(1)
    raise
report(0)
"""


RANK_LAUNCHER = rank_launcher()


def rank_command(script: str, args: list[str]) -> list[str]:
    return ["python", "-u", "-c", RANK_LAUNCHER, script, *args]


@dataclass(frozen=True)
class HorovodOptions:
    """The knobs people tune, passed the way horovodrun expects them."""

    fusion_threshold_mb: int | None = None
    cycle_time_ms: float | None = None
    timeline: str | None = None
    verbose: bool = False
    start_timeout: int = 60

    def argv(self) -> list[str]:
        out = ["--start-timeout", str(self.start_timeout)]
        if self.fusion_threshold_mb is not None:
            out += ["--fusion-threshold-mb", str(self.fusion_threshold_mb)]
        if self.cycle_time_ms is not None:
            out += ["--cycle-time-ms", f"{self.cycle_time_ms:g}"]
        if self.timeline:
            out += ["--timeline-filename", self.timeline]
        return out + (["--verbose"] if self.verbose else [])


def check_knobs(fusion_threshold_mb: float | None, cycle_time_ms: float | None) -> None:
    """Horovod's fusion buffer and cycle time: 0 or more (horovodrun refuses others, after kit copied the job)."""
    knobs = (("--fusion-threshold-mb", fusion_threshold_mb, 128), ("--cycle-time-ms", cycle_time_ms, 1))
    for flag, value, usual in knobs:
        if value is not None and not 0 <= value < math.inf:
            raise BadInput(f"{flag} {value:g}: Horovod takes 0 or more", hint=f"give e.g. {flag} {usual} (its default)")


def check_np(np: int | None, slots: list[Slot], picked: str | None = None) -> int:
    """The job's processes: --np, or every slot; picked: the -H that chose the slots, if one did."""
    total = sum(s.slots for s in slots)
    if np is None:
        return total
    if not 1 <= np <= total:
        raise BadInput(f"--np: {np} processes, but " + (f"-H {picked} gives {total} slots" if picked else
                                                         f"the cluster has {total} slots"),
                       hint=f"use --np from 1 to {total}, or give hosts more slots in " +
                            ("-H (host:slots)" if picked else "hosts.txt (host:slots)"))
    return np


HOSTS_FORM = "host:slots,host:slots (a host alone: its slots in hosts.txt), e.g. -H node-1:2,node-3:2"


def parse_hosts(text: str) -> list[tuple[str, int | None]]:
    """`-H a:2,c,d:1` as horovodrun spells it -> [(host, slots or None)]; checked before any host is asked."""
    found: list[tuple[str, int | None]] = []
    for entry in text.split(","):
        host, colon, slots = entry.strip().partition(":")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,252}", host) or \
                (colon and not re.fullmatch(r"[1-9]\d{0,2}", slots)):
            raise BadInput(f"-H: '{entry}' is not host or host:slots (in {text})", hint=f"give {HOSTS_FORM}")
        if host in (h for h, _ in found):
            raise BadInput(f"-H: {host} is named twice (in {text})", hint="name each host once, with all its slots")
        found.append((host, int(slots) if colon else None))
    return found


def pick_hosts(wanted: list[tuple[str, int | None]], slots: list[Slot], cluster: str) -> list[Slot]:
    """The cluster's hosts that -H names (by their name in hosts.txt or their address), in -H's order (horovodrun's
    ranks follow it), each with the slots -H gives it or else its own."""
    picked = []
    for host, count in wanted:
        found = next((s for s in slots if host in (s.host, s.address)), None)
        if found is None:
            raise BadInput(f"-H: {host} is not a host of cluster {cluster}",
                           hint="use its hosts: " + ", ".join(f"{s.host}:{s.slots}" for s in slots))
        if found.host in (p.host for p in picked):
            raise BadInput(f"-H: {host} and {found.host} are one host of cluster {cluster}",
                           hint="name each host once, with all its slots")
        picked.append(replace(found, slots=count or found.slots))
    return picked


def on_cluster_subnet(interfaces: list[tuple[str, str, int]], addresses: list[str]) -> int | None:
    """Which of the (ifname, address, prefix) has a subnet holding every cluster address (its index), if any."""
    wanted = [ipaddress.ip_address(a) for a in addresses]
    return next((i for i, (_, addr, prefix) in enumerate(interfaces)
                 if all(w in ipaddress.ip_network(f"{addr}/{prefix}", strict=False) for w in wanted)), None)


def horovodrun_argv(np: int, slots: list[Slot], port: int, nics: list[str], command: list[str],
                    options: HorovodOptions) -> list[str]:
    return horovodrun(np, slots, port, nics, [*options.argv(), *command])


def split_rank(line: str) -> tuple[int | None, str]:
    """`[2]<stdout>:text` -> (2, "text"); horovodrun's own lines -> (None, line)."""
    m = _RANK_LINE.match(line)
    return (int(m[1]), m[3]) if m else (None, line)


def exit_report(text: str) -> tuple[int, float] | None:
    """A rank's `@@kit-exit CODE TIME` line -> (code, time)."""
    m = _EXIT.match(text)
    return (int(m[1]), float(m[2])) if m else None


class Failures:
    """Reads a job's lines as they come and says which rank failed first, and how."""

    def __init__(self) -> None:
        self.exits: dict[int, tuple[int, float]] = {}
        self.victims: set[int] = set()
        self.reported: list[tuple[int, int]] = []  # horovodrun's own account, in its order

    def feed(self, rank: int | None, text: str) -> None:
        if rank is None:
            if m := _FAILED.search(text):
                self.reported.append((int(m[1]), int(m[2])))
        elif report := exit_report(text):
            self.exits[rank] = report
        elif any(mark in text for mark in VICTIM_MARKS):
            self.victims.add(rank)

    def first(self) -> tuple[int, int] | None:
        """(rank, exit code): the earliest rank that failed on its own; else one that vanished without
        reporting (its container or host went away); else whatever horovodrun saw first."""
        own = [(t, rank, code) for rank, (code, t) in self.exits.items() if code != 0 and rank not in self.victims]
        if own:
            _, rank, code = min(own)
            return rank, code
        vanished = [(rank, code) for rank, code in self.reported if rank not in self.exits]
        return (vanished or self.reported or [None])[0]
