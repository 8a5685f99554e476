"""A kit job's pod under Kubernetes (kit.backends.k8s.manifests): the pod's command runs this file, from the job's ConfigMap as
.kit/kit_pod.py, beside kit's task (kit.backends.slurm.task, .kit/kit_task.py) and rank launcher (.kit/kit_rank.py). No kit is
installed in the image's pods, so it uses the standard library alone:

    kit_pod.py pod LAUNCHER SCRIPT ARGS        an Indexed Job's or a JobSet's pod: one node of the job, whose tasks
                                               it starts as srun would start a node's (kit_task.py does the rest)
    kit_pod.py exec ARGV                       an operator's pod (PyTorchJob, TFJob, TrainJob): ARGV
    kit_pod.py mpi-worker                      an MPIJob's worker: sshd with the operator's keys
    kit_pod.py mpi-launcher NP NAME SCRIPT ARGS    an MPIJob's launcher: horovodrun to the operator's hostfile

Each first goes to the workspace (KIT_WORKSPACE) and copies the job's files there from the ConfigMap (KIT_STAGE).
"""

import os  # (os and sys were loaded as the interpreter started: no folder can give other ones)
import sys

# kit's own imports with neither the job's folder nor PYTHONPATH on the path (a json.py of the job's replaces none).
_GIVEN, sys.path[:] = list(sys.path), [p for p in sys.path if p not in ("", os.getcwd(), *os.environ.get(
    "PYTHONPATH", "").split(os.pathsep))]
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
sys.path[:] = _GIVEN

HERE = os.path.dirname(os.path.abspath(__file__))
TASK, RANK = os.path.join(HERE, "kit_task.py"), os.path.join(HERE, "kit_rank.py")
WAIT_S = 600      # for the job's other pods: an image pull or a busy scheduler may hold one back for minutes
MPI_SSH = "/root/.ssh"  # the MPI operator's keys (mode 0600 only at this path)
MPI_KEYS = "/etc/kit/mpi-ssh"  # the worker's sshd's copies of them


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
    if launcher == "torchrun":
        argv = [sys.executable, "-I", TASK, "torchrun", *command]
        os.execve(argv[0], argv, dict(run, SLURM_PROCID=str(index)))
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
                         [dict(run, SLURM_PROCID=str(rank)) for rank in ranks], ranks)
    finally:
        if rendezvous is not None:
            rendezvous.terminate()
            rendezvous.wait(10)
    sys.exit(code)


def run_tasks(argvs, envs, ranks):
    """Start the node's tasks, their lines prefixed as horovodrun prefixes a rank's ([RANK]<stdout>:); the first to
    fail stops the others (as srun --kill-on-bad-exit does), and its code is the pod's."""
    lock, procs, relays = threading.Lock(), [], []

    def relay(stream, rank, name, out):
        for line in iter(stream.readline, b""):
            with lock:
                out.write(b"[%d]<%s>:" % (rank, name) + line)
                out.flush()

    for argv, env, rank in zip(argvs, envs, ranks):
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(p)
        for stream, name, out in ((p.stdout, b"stdout", sys.stdout.buffer), (p.stderr, b"stderr", sys.stderr.buffer)):
            relays.append(threading.Thread(target=relay, args=(stream, rank, name, out), daemon=True))
            relays[-1].start()
    signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs])  # the pod is deleted
    first = None
    while [p.poll() for p in procs].count(None):  # every task polled (any() stops at the first that runs)
        if first is None and (failed := [p for p in procs if p.returncode not in (None, 0)]):
            first = failed[0]
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        time.sleep(0.2)
    for t in relays:
        t.join(5)
    first = first or next((p for p in procs if p.returncode), None)
    code = first.returncode if first else 0
    return code if code >= 0 else 128 - code


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
