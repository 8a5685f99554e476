"""One task of a kit job under Slurm: srun starts it on the nodes, in the job's folder, with the job's Python.

The sbatch script (kit.backends.slurm.sbatch) writes this file's source into the job's folder as .kit/job-ID/kit_task.py and the
rank launcher (kit.jobs.commands.horovod) beside it as kit_rank.py; no kit is installed on the nodes, so this file uses
the standard library alone (and Horovod's runner, in the task that serves Horovod's rendezvous). No SSH between
nodes: Slurm starts every task, and each derives its part from what Slurm says about the job:

    kit_task.py rendezvous             Horovod's Gloo rendezvous, as horovodrun would serve it: started by the first
                                       task (rank 0), on its node's training address and the job's port, for as long
                                       as that task runs
    kit_task.py horovod SCRIPT ARGS    one rank a task: HOROVOD_RANK... from SLURM_PROCID...
    kit_task.py torchrun SCRIPT ARGS   one task a node: torchrun, its static rendezvous's store on the first node
    kit_task.py tf SCRIPT ARGS         one worker a task: TF_CONFIG from the job's nodes

The batch script gives every task KIT_NODES (`name=address` of each node of the job, in Slurm's order), KIT_PORT
and KIT_PORT_BLOCK (the job's ports, from the job id: two jobs on one node never share them) and KIT_NET_KEY (the file of the job's key for its network
survey, mode 0600); KIT_SUBNET, where kit.yaml names one, picks the ranks' network.
"""

import os  # (os and sys were loaded as the interpreter started: no folder can give other ones)
import sys

# kit's own imports with neither the job's folder nor PYTHONPATH on the path (a json.py of the job's replaces none of
# them), then the path as Python gave it: the nodes' torch or Horovod may come from PYTHONPATH (`module load`).
def _kits_own(path):
    return [p for p in path if p not in ("", os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep))]


_GIVEN, sys.path[:] = list(sys.path), _kits_own(sys.path)
import fcntl  # noqa: E402
import importlib.util  # noqa: E402
import ipaddress  # noqa: E402
import json  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
sys.path[:] = _GIVEN

RANK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kit_rank.py")
RENDEZVOUS_WAIT_S = 300  # for rank 0's rendezvous: its node's survey and Python start may take a while
SIOCGIFADDR, SIOCGIFNETMASK = 0x8915, 0x891B


def job_nodes(text):
    """KIT_NODES, "n1=10.0.0.1 n2=node2" -> [("n1", "10.0.0.1"), ("n2", <node2's IPv4 address>)]: a node whose
    NodeAddr is not set in slurm.conf has its name there, which is then looked up."""
    return [(name, ipv4(address)) for name, address in (pair.split("=", 1) for pair in text.split())]


def ipv4(address):
    try:
        return str(ipaddress.IPv4Address(address))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(address)
    except OSError:
        raise SystemExit("kit: node address %s does not resolve on %s (set NodeAddr in slurm.conf, or put the "
                         "nodes' names in DNS or /etc/hosts)" % (address, socket.gethostname())) from None


def interfaces():
    """(name, address, prefix length) of every interface with an IPv4 address."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                address = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, request)[20:24])
                mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFNETMASK, request)[20:24])
            except OSError:
                continue
            found.append((name, address, ipaddress.ip_network("0.0.0.0/" + mask).prefixlen))
    return found


def pick_interface(found, addresses, subnet=None):
    """The interface the ranks talk over: the one on `subnet`, else the one whose subnet holds every node's
    address (kit picks by subnet, never by name). Raises SystemExit with what it saw when none is."""
    for name, address, prefix in found:
        network = ipaddress.ip_network("%s/%d" % (address, prefix), strict=False)
        if subnet and ipaddress.ip_address(address) in ipaddress.ip_network(subnet):
            return name, address
        if not subnet and not network.is_loopback and \
                all(ipaddress.ip_address(a) in network for a in addresses):
            return name, address
    wanted = "on %s" % subnet if subnet else "whose subnet holds %s" % ", ".join(addresses)
    seen = ", ".join("%s %s/%d" % f for f in found) or "none"
    raise SystemExit("kit: no interface on %s is %s (it has: %s); set slurm.subnet in kit.yaml"
                     % (socket.gethostname(), wanted, seen))


def check_hostname():
    """Horovod 0.28's Gloo finds this node's address by its hostname where it makes a process set's device (it reads
    HOROVOD_GLOO_IFACE only for the first): a hostname that does not resolve crashes every rank in hvd.init()."""
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None, socket.AF_INET)
    except OSError:
        raise SystemExit("kit: this node's hostname, %s, does not resolve here; Horovod's Gloo needs it to (put the "
                         "nodes' names in DNS or in /etc/hosts on every node)" % name) from None


def horovod_env(env, nodes):
    """What horovodrun gives each rank it starts (its Gloo launch), from Slurm's numbering: block distribution,
    the same number of tasks on every node."""
    size, nnodes = int(env["SLURM_NTASKS"]), len(nodes)
    local_size = size // nnodes
    rank, node = int(env["SLURM_PROCID"]), int(env["SLURM_NODEID"])
    return {"HOROVOD_HOSTNAME": nodes[node][0], "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
            "HOROVOD_LOCAL_RANK": str(rank % local_size), "HOROVOD_LOCAL_SIZE": str(local_size),
            "HOROVOD_CROSS_RANK": str(node), "HOROVOD_CROSS_SIZE": str(nnodes),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": nodes[0][1], "HOROVOD_GLOO_RENDEZVOUS_PORT": rendezvous_port(env)}


def rendezvous_port(env):
    """The job's port (KIT_PORT, from the job id, in the range kit's firewall keeps to the cluster), or a pod's."""
    return env.get("KIT_RENDEZVOUS_PORT") or env["KIT_PORT"]


def torchrun_argv(env, nodes, address, command):
    """torchrun on this node: a static rendezvous whose store the first node hosts, at the job's port, node ranks in
    Slurm's order. Static, as on the SSH cluster: torch's c10d rendezvous (--rdzv-backend=c10d) unpickles what its
    store holds, and the store has no authentication."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=%d" % len(nodes),
            "--nproc-per-node=%s" % env["KIT_NPROC_PER_NODE"], "--node-rank=%d" % int(env["SLURM_NODEID"]),
            "--rdzv-backend=static", "--master-addr=%s" % nodes[0][1], "--master-port=%s" % env["KIT_PORT"],
            "--local-addr=%s" % address, "--tee=3", "--no-python", sys.executable, "-u", RANK, *command]


def tf_config(env, nodes):
    """TF_CONFIG of this task: every task a worker at its node's address, the job's port plus its local id."""
    per_node = int(env["SLURM_NTASKS"]) // len(nodes)
    workers = ["%s:%d" % (address, int(env["KIT_PORT"]) + i) for _, address in nodes for i in range(per_node)]
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": int(env["SLURM_PROCID"])}},
                      separators=(",", ":"))


def worker_gpus(env, nodes):
    """A TensorFlow worker's GPUs: its share of the node's (CUDA_VISIBLE_DEVICES, as Slurm gives the job's step), by
    its local id, as the SSH cluster and a TFJob give each worker its own; {} where there is nothing to share (no GPU,
    or one worker a node). Each worker would otherwise take every GPU of its node, and the workers would collide."""
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    per_node = int(env["SLURM_NTASKS"]) // len(nodes)
    if per_node < 2 or not visible:
        return {}
    share = max(len(visible) // per_node, 1)
    local = int(env.get("SLURM_LOCALID", "0")) % per_node
    return {"CUDA_VISIBLE_DEVICES": ",".join(visible[local * share % len(visible):][:share])}


def rendezvous(env, nodes, every=0.2):
    """Serve Horovod's Gloo rendezvous for the job's ranks, on the first node's address on the training network
    (KIT_RENDEZVOUS_ADDR, else KIT_NODES' first) and the job's port, and on no other: it takes unauthenticated GET,
    PUT and DELETE. It ends when stopped, or when the task that started it (rank 0's, or the first pod's) ends."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer, RendezvousServer
    from horovod.runner.util.threads import in_thread

    size, parent = int(env["KIT_NTASKS"]), os.getppid()
    server = RendezvousServer(False)  # started as its start() would, but at the job's address and port
    server._httpd = RendezvousHTTPServer((env.get("KIT_RENDEZVOUS_ADDR") or nodes[0][1], int(rendezvous_port(env))),
                                         RendezvousHandler, False)
    server._listen_thread = in_thread(target=server._httpd.serve_forever)
    server.init(get_host_assignments(parse_hosts(",".join("%s:%d" % (n, size // len(nodes)) for n, _ in nodes)),
                                     size))
    print("bound", flush=True)  # to the task that started it, which then lets the ranks come
    while os.getppid() == parent and not signal.sigtimedwait({signal.SIGTERM, signal.SIGINT}, every):
        pass
    server.stop()


def serve_rendezvous(env, address):
    """Rank 0's task: the job's rendezvous started as its child, and seen to listen itself, not another program that
    took the job's port first on this node (the port is known from the job id): else the job stops here."""
    port = rendezvous_port(env)
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "rendezvous"], stdout=subprocess.PIPE,
                             env=dict(env, KIT_RENDEZVOUS_ADDR=address, KIT_NTASKS=env["SLURM_NTASKS"]))
    ready, _, _ = select.select([child.stdout], [], [], RENDEZVOUS_WAIT_S)
    said = child.stdout.readline() if ready else b""  # its first line once it listens; none if it failed (stderr)
    child.stdout.close()
    if said.strip() != b"bound":
        child.kill()
        raise SystemExit("kit: Horovod's rendezvous could not listen at %s:%s on %s: is another program holding the "
                         "job's port there? (its error is above)" % (address, port, socket.gethostname()))


def wait_listening(address, port, seconds=RENDEZVOUS_WAIT_S, every=0.2):
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((address, port), timeout=5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("kit: nothing listens on %s:%d after %d s: Horovod's rendezvous (the job's first "
                                 "task's) did not start; does the job's Python import horovod? (its error is in the "
                                 "first task's output)" % (address, port, seconds)) from None
            time.sleep(every)


def training_network(env, nodes):
    """This node's interface and address, and every node's address, on the network the ranks train over: what the
    job's survey measured (.kit/kit_net.py, kit.network.survey: every task takes part), or, in a pod (KIT_SURVEY=0),
    this pod's own interface on KIT_SUBNET. The job's first task says which in one line."""
    if env.get("KIT_SURVEY") == "0":
        nic, address = pick_interface(interfaces(), [a for _, a in nodes], env.get("KIT_SUBNET"))
        return nic, address, [a for _, a in nodes], "", ""
    spec = importlib.util.spec_from_file_location("kit_net", os.path.join(os.path.dirname(RANK), "kit_net.py"))
    survey = sys.modules["kit_net"] = importlib.util.module_from_spec(spec)  # (its dataclasses look it up there)
    given, sys.path[:] = list(sys.path), _kits_own(sys.path)  # its imports too are the standard library's
    try:
        spec.loader.exec_module(survey)
    finally:
        sys.path[:] = given
    try:
        decision = survey.task(env, nodes)
    except (survey.SurveyError, OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit("kit: the job's network survey failed on %s: %s: %s"
                         % (socket.gethostname(), type(e).__name__, e)) from None
    mine = decision.members[nodes[int(env["SLURM_NODEID"])][0]]  # (the decision names every node: survey.checked)
    said = ""
    if env["SLURM_PROCID"] == "0" and len(nodes) > 1:
        said = "\n".join([decision.summary(len(nodes), "nodes", "NodeAddr", "Slurm"), *decision.warnings])
    return mine.iface, mine.address, [decision.members[name].address for name, _ in nodes], said, ",".join(mine.rdma)


def squatted(first, count, me, tables=("/proc/net/tcp", "/proc/net/tcp6")):
    """[(port, uid)] of the job's ports (first, count of them) that a socket of another user than `me` listens on,
    on this node (kit's Prolog keeps the job's connections from them: the job cannot use that port)."""
    found = set()
    for table in tables:
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cells = row.split()
            if len(cells) < 8 or cells[3] != "0A":  # LISTEN
                continue
            port, uid = int(cells[1].rpartition(":")[2], 16), int(cells[7])
            if first <= port < first + count and uid != me:
                found.add((port, uid))
    return sorted(found)


def say_squatted(env, node):
    """A line for each port of the job's that another user's program holds here, before the ranks try it."""
    if not env.get("KIT_PORT", "").isdigit():
        return
    for port, uid in squatted(int(env["KIT_PORT"]), int(env.get("KIT_PORT_BLOCK") or 1), os.getuid()):
        print("kit: port %d of this job on %s is held by uid %d, another user's program: kit's Prolog keeps the "
              "job's connections from it, so what the job serves there cannot start; end that program, or submit "
              "the job again (it gets other ports)" % (port, node, uid), file=sys.stderr, flush=True)


def ignore_job_signals():
    """Slurm's warning before the time limit (sbatch --signal=USR1@120) reaches every process of the job, and comes as
    the job starts where the limit is short: ignored from the task's start (an ignored signal stays so across fork and
    exec), in the rendezvous it serves, torchrun's agent and each rank, unless the script handles it itself; its
    default would end them. So is kit's SIGUSR2, which asks each rank for its stack (the rank launcher's faulthandler
    answers it; nothing else of the job ends on it)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def main(argv, env):
    ignore_job_signals()
    mode, command = argv[1], argv[2:]
    nodes = job_nodes(env["KIT_NODES"])
    if mode == "rendezvous":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        return rendezvous(env, nodes)
    say_squatted(env, env.get("SLURMD_NODENAME") or socket.gethostname())
    nic, address, addresses, said, hca = training_network(env, nodes)
    for line in said.splitlines():
        print("kit: " + line, flush=True)
    nodes = [(name, a) for (name, _), a in zip(nodes, addresses)]  # from here on: where each node's ranks talk
    run = dict(env, GLOO_SOCKET_IFNAME=nic, NCCL_SOCKET_IFNAME="=" + nic, PYTHONUNBUFFERED="1")  # (NCCL's: exact)
    if hca and "NCCL_IB_HCA" not in env:
        run["NCCL_IB_HCA"] = "=" + hca
    if mode == "horovod":
        check_hostname()
        if env.get("KIT_SURVEY") != "0" and env["SLURM_PROCID"] == "0":  # under Slurm: rank 0 serves the rendezvous
            serve_rendezvous(env, nodes[0][1])  # (a child of this process, which the rank launcher becomes; in pods,
        wait_listening(nodes[0][1], int(rendezvous_port(env)),  # the first pod's task serves it)
                       int(env.get("KIT_RENDEZVOUS_WAIT_S", RENDEZVOUS_WAIT_S)))
        run.update(horovod_env(env, nodes), HOROVOD_GLOO_IFACE=nic)
    elif mode == "tf":
        run["TF_CONFIG"] = tf_config(env, nodes)
        run.update(worker_gpus(env, nodes))
    argv = torchrun_argv(env, nodes, address, command) if mode == "torchrun" else [sys.executable, "-u", RANK, *command]
    become(argv, run)


def become(argv, env):
    """This task becomes argv, with what it ignores (ignore_job_signals)."""
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main(sys.argv, os.environ)
