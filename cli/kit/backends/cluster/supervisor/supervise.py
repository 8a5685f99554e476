"""The supervisor proper, in the primary's container (`python -I -c SOURCE PLAN`): it writes the job's record, launches
it, watches its ranks and, by the job's failure policy, starts it again on the hosts that still answer; at its end,
what is left of the job is stopped on every host and the job's variables removed. Standard library only: the last
part of the supervisor's script (kit.backends.cluster.supervisor.shipped), whose entry point is here."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from kit.backends.cluster.supervisor.launch import AFTER, ENDING, ENV_DIR, REMOTE_TIMEOUT_S, RANKS_MARK, SHARED, SSH  # shipped together
from kit.backends.cluster.supervisor.launch import REAP_FOR_S, REAP_SETTLE_S, parse_killed, unsettled_mark  # shipped together
from kit.backends.cluster.supervisor.launch import STOP_WAIT_S  # shipped together
from kit.backends.cluster.supervisor.launch import Plan, Slot, at_once, discovery_script, end_script, parse_discovery  # shipped together
from kit.backends.cluster.supervisor.launch import parse_end, reap_script, ssh_argv, _run_quietly, _text, _write  # shipped together
from kit.backends.cluster.supervisor.heartbeats import Beat, Watch, hang_report, parse_beats, parse_stacks, placed  # shipped together
from kit.backends.cluster.supervisor.heartbeats import progress_script, stacks_argv  # shipped together
from kit.backends.cluster.supervisor.starter import start  # shipped together
from kit.jobs.pace import Pace, Sample  # shipped together


class Supervisor:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.hosts = list(plan.hosts)  # those of the last launch
        self.log = open(os.path.join(plan.folder, "output.log"), "a", buffering=1)
        self.ending: dict[str, str] = {}  # what the supervisor recorded of the job's end (ENDING), as it wrote it

    def record(self, name: str, text: str) -> None:
        self.ending[name] = text
        _write(self.plan.folder, name, text)

    def seal(self) -> None:
        """Each ENDING file (and AFTER) written once more, last, as the supervisor recorded it, or removed when it
        recorded none: the job's ranks can write their folder, and what one left under such a name must not be read
        as the supervisor's (a missing `reaped` tells kit to stop what is left itself)."""
        for name in (*ENDING, AFTER):
            if name in self.ending:
                _write(self.plan.folder, name, self.ending[name])
            elif os.path.lexists(path := os.path.join(self.plan.folder, name)):
                os.remove(path)

    def say(self, text: str) -> None:
        self.log.write(f"kit: {text}\n")

    def stopped(self) -> bool:
        return os.path.exists(os.path.join(self.plan.folder, "stopped"))

    def remote(self, host: Slot, argv: list[str], timeout: float = REMOTE_TIMEOUT_S,
               shared: bool = True) -> subprocess.CompletedProcess:
        """A command in a host's container: here for the primary, over the cluster SSH for the others (on the host's
        shared connection, or, not shared, on one of its own that ends with the command)."""
        # An SSH session starts with sshd's environment: the image's PATH (its venv: python, py-spy) goes along.
        full = argv if self.plan.is_here(host) else \
            [*SSH, *(SHARED if shared else ()), host.address, shlex.join(["env", f"PATH={os.environ.get('PATH', '')}", *argv])]
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

    def reap_all(self, hosts: list[Slot], script: str) -> list[tuple[int | None, str | None] | None]:
        """A reap (or end) script on every host: this one's first, which stops what is left of the job here, its SSH
        clients included (so that nothing of it keeps a session open on another host, nor stands in for kit's own
        connection there: what the container's init adopted goes, kit's shared connections too), then the others' at
        once, each over a connection of its own that ends with its command, host key checked. Then the reap again on
        every host while the last round stopped something, for at most REAP_FOR_S: what a job started on a host
        through an SSH connection from a process of its own on another host is that sshd's connection's child while
        the connection lives, and is adopted (so stopped) once the client is gone, which may be after that host's
        round, a hop of a chain a round. (This host's first round, which stops kit's shared connections too, calls
        for another all the same: an SSH client of the job's may look like one of them.) A host whose last round
        still stopped something did not settle: recorded (`unsettled`), said, and marked, so that no job starts there
        (launch.UNSETTLED). Each host's (processes stopped, the end script's manifest), None where its first round
        failed."""
        def round_of(text: str) -> list[tuple[int | None, str | None, str] | None]:
            here = {h.address: self.remote(h, ["sh", "-c", text]) for h in hosts if self.plan.is_here(h)}
            there = [h for h in hosts if not self.plan.is_here(h)]
            found = {**here, **dict(zip([h.address for h in there],
                                        at_once(there, lambda h: self.remote(h, ["sh", "-c", text], shared=False))))}
            return [(*parse_end(found[h.address].stdout), parse_killed(found[h.address].stdout))
                    if found[h.address].returncode == 0 else None for h in hosts]
        ends = round_of(script)
        counts, last, deadline = [end[0] if end else None for end in ends], ends, time.monotonic() + REAP_FOR_S
        while any(end and end[0] for end in last):
            if time.monotonic() >= deadline:
                self.unsettled([(h, end[2]) for h, end in zip(hosts, last) if end and end[0]])
                break
            time.sleep(REAP_SETTLE_S)  # (a connection whose client is gone: its sshd's process sees the end)
            last = round_of(reap_script(self.plan.id))
            counts = [c + (end[0] or 0) if c is not None and end else c for c, end in zip(counts, last)]
        return [(c, end[1]) if end else None for c, end in zip(counts, ends)]

    def unsettled(self, found: list[tuple[Slot, str]]) -> None:
        """Hosts where a sweep of REAP_FOR_S still stopped something in its last round: each named with what it
        stopped, recorded, and marked so that no job starts there until a sweep stops nothing."""
        for h, killed in found:
            self.remote(h, ["sh", "-c", unsettled_mark(self.plan.id, killed)])
        said = "\n".join(f"{h.host} {killed or '?'}" for h, killed in found)
        self.record("unsettled", "\n".join(filter(None, [self.ending.get("unsettled"), said])))
        for h, killed in found:
            self.say(f"what is left of the job on {h.host} did not settle in {REAP_FOR_S:.0f} s (still stopping "
                     f"{killed or 'processes'}): no job starts there until `kit stop {self.plan.id}` finds nothing")

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
            self.reap_all(plan.swept(hosts), reap_script(plan.id))  # what is left of this launch, on every host
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
            self.record("restarts", str(attempt))
            self.record("left_out", " ".join(left_out))
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
        watch, pace = Watch(plan.hang_timeout), Pace(window=plan.pace_window)  # (a restart's pace starts anew)
        while proc.poll() is None:
            try:
                proc.wait(timeout=min(watch.every, pace.every))  # (the pace's reads: kit.jobs.pace)
                break
            except subprocess.TimeoutExpired:
                pass
            beats = placed(self.beats(hosts), ranks)
            self.keep_pace(pace, beats)
            if plan.hang_timeout and watch.stalled(beats):
                self.hung(hosts, watch)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
                self.reap_all(plan.swept(hosts), reap_script(plan.id))
        code = proc.wait()
        return 128 - code if code < 0 else code  # killed by a signal: as a shell says it

    def store_port(self, host: Slot) -> int:
        """A port free now on node 0 of a torchrun launch, for its store: here, or asked there."""
        if self.plan.is_here(host):
            return free_port()
        found = self.remote(host, ["python", "-I", "-c", FREE_PORT]).stdout.strip()
        return int(found) if found.isascii() and found.isdigit() else free_port()  # (a node that does not answer fails the launch)

    def finish(self) -> None:
        """On every host of the cluster (the last launch's, the primary, the others: Plan.swept), at once: what is
        left of the job stopped (each host's count in `reaped`) and, to spread, each host's workspace as it is now
        (`after.json`, host -> manifest)."""
        plan = self.plan
        hosts = plan.swept(self.hosts)
        ends = self.reap_all(hosts, end_script(plan.id, plan.workspace if plan.spread else None))
        found = {h.host: end for h, end in zip(hosts, ends) if end}
        self.record("reaped", "\n".join(f"{host} {n}" for host, (n, _) in found.items() if n))
        if plan.spread:
            self.record(AFTER, json.dumps({host: m for host, (_, m) in found.items() if m is not None}))

    def beats(self, hosts: list[Slot]) -> list[Beat]:
        found = self.on_all(hosts, ["sh", "-c", progress_script(self.plan.id)])
        return [b for h, r in zip(hosts, found) for b in parse_beats(h.host, r.stdout)]

    def keep_pace(self, pace: "Pace", beats: list[Beat]) -> None:
        """The ranks' pace from their heartbeats; a host that holds the others back is named, once, in the job's
        output and its record (straggler)."""
        now = time.monotonic()
        for b in beats:
            if b.t is not None:
                pace.add(b.rank, b.host, Sample(now, b.t, b.steps, b.data_s, b.comm_s))
        for slow in pace.look(now) if pace.window else ():
            self.record("straggler", "\n".join([*filter(None, [self.ending.get("straggler")]), slow.text()]))
            self.say(slow.text())  # (recorded first: whoever reads the line finds it in `kit jobs` too)

    def hung(self, hosts: list[Slot], watch: "Watch") -> None:
        """Every rank's stack into the job's folder, and which rank(s) differ from the others, named."""
        stacks = os.path.join(self.plan.folder, "stacks")
        os.makedirs(stacks, exist_ok=True)
        for h, r in zip(hosts, self.on_all(hosts, stacks_argv(self.plan.id))):
            for rank, text in parse_stacks(r.stdout).items():
                _write(stacks, f"rank-{rank}.txt", f"rank {rank} on {h.host}\n{text}")
        report = hang_report(watch.last, watch.quiet())
        self.record("hang", report)
        self.say(f"{report}. Every rank's stack: {stacks}; stopping the job")


# A port nothing listens on now, from the kernel's ephemeral range (python -c, in a host's container).
FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def free_port() -> int:
    s = socket.socket()
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tidy_env(plan: Plan, env_dir: str = ENV_DIR) -> str:
    """The job's variables removed from every host's container, also when no kit waits for the job any more; the
    hosts where that failed (env_kept), one a line."""
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
    return "\n".join(kept)


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
        if plan.env and (kept := tidy_env(plan)):
            supervisor.ending["env_kept"] = kept
        supervisor.seal()
        _write(folder, "ended", str(int(time.time())))
        _write(folder, "exit", str(code))


if __name__ == "__main__":
    if sys.argv[1:] == ["--start"]:
        sys.exit(start(sys.stdin.buffer, sys.stdout))
    main(sys.argv[1])
