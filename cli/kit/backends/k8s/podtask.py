"""A kit job's pod under Kubernetes (kit.backends.k8s.manifests): the pod's command runs this file, from the job's ConfigMap as
.kit/kit_pod.py, beside kit's task (kit.backends.slurm.task, .kit/kit_task.py) and rank launcher (.kit/kit_rank.py). No kit is
installed in the image's pods, so it uses the standard library alone:

    kit_pod.py pod LAUNCHER SCRIPT ARGS        an Indexed Job's or a JobSet's pod: one node of the job, whose tasks
                                               it starts as srun would start a node's (kit_task.py does the rest)
    kit_pod.py exec ARGV                       an operator's pod (PyTorchJob, TFJob, TrainJob): ARGV
    kit_pod.py mpi-worker                      an MPIJob's worker: sshd with the operator's keys
    kit_pod.py mpi-launcher NP NAME SCRIPT ARGS    an MPIJob's launcher: horovodrun to the operator's hostfile

Each first goes to the workspace (KIT_WORKSPACE) and copies the job's files there from the ConfigMap (KIT_STAGE).

With KIT_HANG_TIMEOUT (seconds), a node's pod watches its own ranks as kit's supervisor watches a cluster's: each
rank's launcher keeps a heartbeat in a folder of the pod's (KIT_PROGRESS_DIR), read with the parser and Watch of
kit.backends.cluster.supervisor.heartbeats (shipped beside this file as .kit/kit_beats.py). When none of the pod's
ranks has moved for the timeout, it asks each for its stack (SIGUSR2: the rank launcher's faulthandler writes every
thread's stack beside its heartbeat), prints where each rank is and its stack (HANG_LINES), and then ends its ranks
and exits HUNG_EXIT; kit, following the job, names the rank that is somewhere else from every pod's lines
(kit.backends.k8s.jobs.Hangs). A pod sees its own ranks alone: in a hang no rank of any pod moves, so each pod comes
to it by itself, within a few seconds of the others. A hung pod leaves its ranks as they are for SETTLE_S before it
ends them: ended at once, they would break the other pods' ranks' collectives (a peer's connection reset), which
would then fail before their pod has said where they were.
"""

import os  # (os and sys were loaded as the interpreter started: no folder can give other ones)
import sys

# kit's own imports with neither the job's folder nor PYTHONPATH on the path (a json.py of the job's replaces none).
_GIVEN, sys.path[:] = list(sys.path), [p for p in sys.path if p not in ("", os.getcwd(), *os.environ.get(
    "PYTHONPATH", "").split(os.pathsep))]
import importlib.util  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
sys.path[:] = _GIVEN

HERE = os.path.dirname(os.path.abspath(__file__))
TASK, RANK = os.path.join(HERE, "kit_task.py"), os.path.join(HERE, "kit_rank.py")
WAIT_S = 600      # for the job's other pods: an image pull or a busy scheduler may hold one back for minutes
MPI_SSH = "/root/.ssh"  # the MPI operator's keys (mode 0600 only at this path)
MPI_KEYS = "/etc/kit/mpi-ssh"  # the worker's sshd's copies of them
# The hang watch's lines in the pod's output, each on a line of its own, never a rank's (a rank's lines carry its
# prefix, [RANK]<stdout>:); text as a JSON string (one line whatever it holds):
#   @@kit-hang-at RANK "WHERE"      where each of the pod's ranks is, from its last heartbeat
#   @@kit-hang-stack RANK "LINE"    each line of the rank's stack
#   @@kit-hung SECONDS              last: none of the pod's ranks has moved for SECONDS
HANG_LINES = ("@@kit-hang-at", "@@kit-hang-stack", "@@kit-hung")
HUNG_EXIT = 124      # a pod that hung (as timeout(1) ends)
READ_EVERY_S = 2.0   # the heartbeats are read this often at most (the rank launcher writes one every 2 s)
STACK_WAIT_S = 10    # for the ranks' stacks, after SIGUSR2
STACK_BYTES = 64 << 10
END_WAIT_S = 10      # for a rank to end at SIGTERM, before SIGKILL
SETTLE_S = 15        # a hung pod's wait, its ranks left hung, for the job's other pods to say where theirs are


def stage(source, into="."):
    """Copy the job's files from the ConfigMap's mount (kit's own, read-only) into the workspace. The kubelet keeps
    them behind links into a ..data folder, which are followed; its own ..* entries are not copied."""
    if not source:
        return
    for top, folders, files in os.walk(source, followlinks=True):
        folders[:] = [f for f in folders if not f.startswith("..")]
        rel = os.path.relpath(top, source)
        os.makedirs(os.path.join(into, rel), exist_ok=True)
        for name in files:
            if not name.startswith(".."):
                shutil.copy(os.path.join(top, name), os.path.join(into, rel, name))


def resolve(name, deadline, every=1.0):
    """A pod's address, once its DNS record exists (a pod not yet scheduled has none)."""
    while True:
        try:
            return socket.gethostbyname(name)
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("kit: %s does not resolve after %d s: is its pod scheduled, and the job's Service "
                                 "there?" % (name, WAIT_S)) from None
            time.sleep(every)


def node_env(env, deadline):
    """What srun would tell this node's tasks (SLURM_*, and kit's KIT_NODES), from the pods: the job's pods by DNS
    name, this one by its index; the ranks talk over the interface of this pod's address (a pod has one network, the
    cluster's: no survey)."""
    index, names = int(env["JOB_COMPLETION_INDEX"]), env["KIT_POD_NAMES"].split()
    nodes = [(name.split(".")[0], resolve(name, deadline)) for name in names]
    ntasks = str(len(nodes) * int(env["KIT_TASKS_PER_NODE"]))
    return dict(env, KIT_NODES=" ".join("%s=%s" % n for n in nodes), KIT_SUBNET=nodes[index][1] + "/32", KIT_SURVEY="0",
                SLURM_NODEID=str(index), SLURM_JOB_ID=env["KIT_JOB_ID"], SLURM_NTASKS=ntasks, KIT_NTASKS=ntasks)


def pod(env, launcher, command):
    """This pod is node JOB_COMPLETION_INDEX of the job: torchrun (one task a node), or its ranks or workers, one
    task each; for Horovod, the first pod serves the rendezvous at the job's port, and the others wait for it."""
    # PID 1 of its container, which no signal without a handler reaches: deleted while it waits, it would hang.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    stage(env.get("KIT_STAGE"))
    deadline = time.monotonic() + WAIT_S
    run = node_env(env, deadline)
    index, per_node = int(run["SLURM_NODEID"]), int(run["KIT_TASKS_PER_NODE"])
    watch = None
    if float(env.get("KIT_HANG_TIMEOUT") or 0) > 0:
        each = int(run.get("KIT_NPROC_PER_NODE", "1")) if launcher == "torchrun" else per_node
        watch = PodWatch(load_beats(), run, range(index * each, (index + 1) * each), float(env["KIT_HANG_TIMEOUT"]))
        run = watch.env
    if launcher == "torchrun":
        argv = [sys.executable, "-I", TASK, "torchrun", *command]
        if watch is None:
            os.execve(argv[0], argv, dict(run, SLURM_PROCID=str(index)))
        # (torchrun's lines and its workers' carry their own prefixes: passed on as they are)
        sys.exit(run_tasks([argv], [dict(run, SLURM_PROCID=str(index))], [index], watch, relayed=False))
    rendezvous = None
    if launcher == "horovod":
        if index == 0:
            # (on this pod's address and the job's port alone)
            rendezvous = subprocess.Popen([sys.executable, "-I", TASK, "rendezvous"], env=run,
                                          stdout=subprocess.DEVNULL)
        # (each task waits for it, kit_task.py's wait_listening, as long as the job's other pods may take)
        run["KIT_RENDEZVOUS_WAIT_S"] = str(max(1, int(deadline - time.monotonic())))
    ranks = [index * per_node + i for i in range(per_node)]
    try:
        code = run_tasks([[sys.executable, "-I", TASK, launcher, *command] for _ in ranks],
                         [dict(run, SLURM_PROCID=str(rank)) for rank in ranks], ranks, watch)
    finally:
        if rendezvous is not None:
            rendezvous.terminate()
            rendezvous.wait(10)
    sys.exit(code)


def run_tasks(argvs, envs, ranks, watch=None, relayed=True):
    """Start the node's tasks, their lines prefixed as horovodrun prefixes a rank's ([RANK]<stdout>:) unless not
    relayed (then their output is the pod's as it is); the first to fail stops the others (as srun
    --kill-on-bad-exit does), and its code is the pod's. With a watch (PodWatch), ranks that hung are reported and
    ended, and the pod's code is HUNG_EXIT."""
    lock, procs, relays = threading.Lock(), [], []

    def relay(stream, rank, name, out):
        for line in iter(stream.readline, b""):
            with lock:
                out.write(b"[%d]<%s>:" % (rank, name) + line)
                out.flush()

    def say(line):
        with lock:
            sys.stdout.buffer.write(line.encode() + b"\n")
            sys.stdout.buffer.flush()

    for argv, env, rank in zip(argvs, envs, ranks):
        pipe = subprocess.PIPE if relayed else None
        p = subprocess.Popen(argv, env=env, stdout=pipe, stderr=pipe)
        procs.append(p)
        for stream, name, out in ((p.stdout, b"stdout", sys.stdout.buffer), (p.stderr, b"stderr", sys.stderr.buffer)):
            if relayed:
                relays.append(threading.Thread(target=relay, args=(stream, rank, name, out), daemon=True))
                relays[-1].start()
    deleted = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: [deleted.set(), *(p.terminate() for p in procs)])  # the pod is deleted
    first, hung = None, False
    while [p.poll() for p in procs].count(None):  # every task polled (any() stops at the first that runs)
        if first is None and (failed := [p for p in procs if p.returncode not in (None, 0)]):
            first = failed[0]
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        elif first is None and watch is not None and (last := watch()) is not None:
            watch.report(last, say)
            settle(deleted)
            end(procs)
            hung = True
            break
        time.sleep(0.2)
    for t in relays:
        t.join(5)
    if hung:
        return HUNG_EXIT
    first = first or next((p for p in procs if p.returncode), None)
    code = first.returncode if first else 0
    return code if code >= 0 else 128 - code


def end(procs, wait=END_WAIT_S):
    """SIGTERM to each process that runs, SIGKILL to those that still do after `wait` seconds."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + wait
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def settle(deleted, seconds=SETTLE_S):
    """A hung pod's wait before it ends its ranks: the job's other pods, which hung too, say where theirs are
    meanwhile (then this one ends, the Job fails and they are deleted). Deleted (SIGTERM: `deleted` set), it stops
    waiting at once."""
    deadline = time.monotonic() + seconds
    while not deleted.is_set() and time.monotonic() < deadline:
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------------- the hang watch

def load_beats():
    """kit's heartbeat parser and Watch (kit.backends.cluster.supervisor.heartbeats, with the module it is shipped
    with), from .kit/kit_beats.py beside this file; its imports the standard library's, as this file's."""
    spec = importlib.util.spec_from_file_location("kit_beats", os.path.join(HERE, "kit_beats.py"))
    beats = sys.modules["kit_beats"] = importlib.util.module_from_spec(spec)  # (its dataclasses look it up there)
    given, sys.path[:] = list(sys.path), [p for p in sys.path if p not in ("", os.getcwd(), *os.environ.get(
        "PYTHONPATH", "").split(os.pathsep))]
    try:
        spec.loader.exec_module(beats)
    finally:
        sys.path[:] = given
    return beats


def read_file(path, limit):
    """Up to `limit` bytes of a regular file as text, "" for anything else: a rank writes these files, and may leave
    a link or a FIFO at their names."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        return os.read(fd, limit).decode(errors="replace") if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    except OSError:
        return ""
    finally:
        os.close(fd)


class PodWatch:
    """Whether any of this pod's ranks has moved lately: their heartbeats (in a folder of the pod's, made here: the
    ranks get it as KIT_PROGRESS_DIR, and KIT_JOB, in `env`) read every READ_EVERY_S at most, on the pod's clock.
    Until a first rank has written one, WAIT_S more than the timeout: the job's other pods, Horovod's rendezvous,
    Python's imports may take that long."""

    def __init__(self, beats, env, ranks, timeout, clock=time.monotonic, folder=None):
        self.beats, self.ranks, self.clock = beats, list(ranks), clock
        folder = folder or tempfile.mkdtemp(prefix="kit-progress-")
        self.env = dict(env, KIT_JOB=env["KIT_JOB_ID"], KIT_PROGRESS_DIR=folder)
        self.folder = os.path.join(folder, os.path.basename(env["KIT_JOB_ID"]))  # (as the rank launcher joins them)
        self.watch = beats.Watch(timeout, clock)
        self.every, self.next, self.beaten = min(self.watch.every, READ_EVERY_S), 0.0, False

    def __call__(self):
        """The ranks' last heartbeats once none has moved for the timeout, else None."""
        if self.clock() < self.next:
            return None
        self.next = self.clock() + self.every
        found = self.read()
        self.beaten = self.beaten or bool(found)
        if not self.watch.stalled(found) or \
                not self.beaten and self.watch.quiet() < self.watch.timeout + WAIT_S:
            return None
        return self.watch.last

    def read(self):
        """Each rank's heartbeat; a file that is not one, or names another rank, is none."""
        found = []
        for rank in self.ranks:
            text = read_file(os.path.join(self.folder, str(rank)), 2000)
            found += [b for b in self.beats.parse_beats("", text)[:1] if b.rank == rank]
        return found

    def stacks(self, wait=STACK_WAIT_S, sleep=time.sleep):
        """rank -> its stack: SIGUSR2 to each rank that has a heartbeat, by the pid it gives there, where that
        process carries this job's KIT_JOB (a rank's pid is not taken on trust); read once every one has written
        its stack and it did not change in the last look, STACK_WAIT_S at most."""
        mark = ("KIT_JOB=" + self.env["KIT_JOB"]).encode()
        for rank in self.ranks:
            try:
                pid = int(json.loads(read_file(os.path.join(self.folder, str(rank)), 2000))["pid"])
                with open("/proc/%d/environ" % pid, "rb") as f:
                    if mark in f.read().split(b"\0"):
                        os.kill(pid, signal.SIGUSR2)
            except (OSError, ValueError, KeyError, TypeError):
                continue
        deadline, before = self.clock() + wait, None
        while True:
            found = {rank: read_file(os.path.join(self.folder, "%d.stack" % rank), STACK_BYTES).strip("\n")
                     for rank in self.ranks}
            if all(found.values()) and found == before or self.clock() >= deadline:
                return found
            before = found
            sleep(0.5)

    def report(self, last, say):
        """Where each rank is and its stack, then the pod's verdict (HANG_LINES), each line through say()."""
        stacks = self.stacks()
        at = {b.rank: b.where for b in last}
        for rank in self.ranks:
            say("@@kit-hang-at %d %s" % (rank, json.dumps(at.get(rank, "(no heartbeat)"))))
            text = stacks.get(rank) or "(no stack: the rank did not answer SIGUSR2 within %d s)" % STACK_WAIT_S
            for line in text.split("\n"):
                say("@@kit-hang-stack %d %s" % (rank, json.dumps(line)))
        say("@@kit-hung %d" % self.watch.quiet())


def mpi_worker(env):
    """An MPIJob's worker: sshd with the operator's key pair as its host key, and the launcher's login alone. It reads
    copies of the keys: the kubelet's volume folder is world-writable (drwxrwxrwt), where sshd's StrictModes refuses
    an authorized_keys."""
    stage(env.get("KIT_STAGE"))
    os.makedirs("/run/sshd", exist_ok=True)
    private_copy(MPI_SSH, ("id_rsa", "authorized_keys"), MPI_KEYS)
    argv = ["/usr/sbin/sshd", "-D", "-e", "-p", "22", "-h", MPI_KEYS + "/id_rsa",
            "-o", "AuthorizedKeysFile=%s/authorized_keys" % MPI_KEYS, "-o", "PermitRootLogin=prohibit-password"]
    os.execve(argv[0], argv, env)


def private_copy(source, names, into):
    """The files `names` of `source` in `into`, a folder of root's alone, each 0600."""
    os.makedirs(into, mode=0o700, exist_ok=True)
    os.chmod(into, 0o700)
    for name in names:
        with open(os.path.join(source, name), "rb") as f:
            data = f.read()
        fd = os.open(os.path.join(into, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def mpi_launcher(env, np, name, command):
    """An MPIJob's launcher: horovodrun (Gloo) to the workers of the operator's hostfile, its SSH pinned to the
    operator's key, which is every worker's host key (mpi_worker): host keys stay checked."""
    stage(env.get("KIT_STAGE"))
    with open(MPI_SSH + "/id_rsa.pub") as f:
        key = " ".join(f.read().split()[:2])
    workers = "%s-worker-*" % name
    os.makedirs("/etc/kit/ssh", exist_ok=True)
    with open("/etc/kit/ssh/known_hosts", "w") as f:
        f.write("%s %s\n" % (workers, key))
    with open("/etc/kit/ssh/config", "w") as f:  # the image's ssh_config includes it
        f.write("Host %s\n    User root\n    Port 22\n    IdentityFile %s/id_rsa\n    IdentitiesOnly yes\n"
                "    UserKnownHostsFile /etc/kit/ssh/known_hosts\n    StrictHostKeyChecking yes\n    BatchMode yes\n"
                "    ConnectTimeout 10\n    ConnectionAttempts 10\n" % (workers, MPI_SSH))
    argv = [os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--gloo", "-np", np, "--hostfile",
            "/etc/mpi/hostfile", "-p", "22", sys.executable, "-u", RANK, *command]
    os.execve(argv[0], argv, env)


def main(argv, env):
    mode, command = argv[1], argv[2:]
    if env.get("KIT_WORKSPACE"):  # (a TrainJob's container has no workingDir of kit's)
        os.chdir(env["KIT_WORKSPACE"])
    if mode == "pod":
        return pod(env, command[0], command[1:])
    if mode == "exec":
        stage(env.get("KIT_STAGE"))
        os.execvpe(command[0], command, env)
    if mode == "mpi-worker":
        return mpi_worker(env)
    if mode == "mpi-launcher":
        return mpi_launcher(env, command[0], command[1], command[2:])
    raise SystemExit("kit: %r is not a mode of kit_pod.py" % mode)


if __name__ == "__main__":
    main(sys.argv, os.environ)
