"""Connect to every host and check it can take the cluster, before anything changes."""

from __future__ import annotations

from typing import Callable

from kit.image import gpus
from kit.cluster import state as st
from kit.config.settings import ClusterConfig
from kit.errors import HostsFailed, KitError
from kit.cluster.fanout import fan_out
from kit.cluster.identity import Owner
from kit.config.hosts import Host
from kit.runners import Runner
from kit.cluster.steps import storage
from kit.cluster.steps.facts import (CONTAINERD_HINT, CONTAINERD_STORE, FACTS_TIMEOUT_S, complete, facts_command,
                                     parse_facts)
from kit.cluster.steps.storage import Storage
from kit.cluster.steps.node import Node

GIB = 1 << 30


def become_root(node: Node) -> int:
    """Connect and learn who we are; run everything as root from here on (sudo when needed)."""
    runner = node.runner
    uid = int(runner.run("id -u").check("cannot run commands").stdout.strip() or 0)
    if uid != 0:
        runner.run("sudo -n true").check(
            "the login user is not root and cannot sudo without a password",
            hint="log in as root (root@host in hosts.txt) or allow passwordless sudo for this user")
        runner.sudo = True
    return uid


def gather(node: Node, cfg: ClusterConfig, image: str) -> None:
    """Connect, then read every fact with one command (as root)."""
    uid = become_root(node)
    node.address = node.place.address or node.runner.peer_address()
    sources = tuple(m.host for m in cfg.bind_mounts)
    r = node.runner.run(facts_command(image, node.place, cfg.workspace_path, cfg.name, sources),
                        timeout=FACTS_TIMEOUT_S)
    if not complete(r.stdout):  # cut short (a timeout, a broken shell): deciding from half the facts is guessing
        raise KitError(f"cannot read the host's facts (exit {r.exit_code})", host=node.name,
                       command="kit's facts script", output_tail=r.tail(),
                       hint="check that the host is healthy (`ssh` to it, its disk, its load), then run kit again")
    node.facts = parse_facts(uid, r.stdout)


def problems(node: Node, cfg: ClusterConfig, image_id: str, image_bytes: int, gpu: bool,
             primary_address: str, owner: Owner) -> list[str]:
    """Everything that would stop this host, in plain words (empty: ready)."""
    f = node.facts
    if other := f.foreign(cfg.name, owner):  # before anything else: kit must not even read it as its own
        return [f"a cluster named {cfg.name} of {other} is here (its container, network or kit's folder "
                f"{node.place.kit_dir}); kit leaves another's cluster alone"]
    found = storage.problems(Storage.of(cfg), f.tools, f.mount, node.host.primary, primary_address)
    found += mount_problems(cfg, f.sources)
    if f.docker_version is None:
        found.append(f"docker does not answer ({f.docker_error})")
    elif f.containerd_store:
        found.append(CONTAINERD_STORE)
    ours = f.container is not None and f.container.cluster == cfg.name and f.container.status == "running"  # (owner checked)
    if cfg.ssh_port in f.listening and not ours:  # (on a private network only ours can listen)
        found.append(f"port {cfg.ssh_port} is taken by another program")
    if f.docker_version and f.image_id != image_id and f.free_bytes < image_bytes * 1.2 + GIB:
        found.append(f"only {f.free_bytes / GIB:.1f} GiB free in {f.docker_root}; the image needs "
                     f"{image_bytes * 1.2 / GIB + 1:.1f} GiB")
    if gpu and f.gpus == 0:
        found.append(f"{f.pci_gpus} NVIDIA GPUs on the PCI bus, but nvidia-smi does not answer: no working driver"
                     if f.pci_gpus else "no GPU: nvidia-smi lists none")
    elif gpu and isinstance(cfg.gpus, int) and cfg.gpus > f.gpus:
        found.append(f"cluster.gpus asks for {cfg.gpus} GPUs but nvidia-smi lists {f.gpus}")
    if gpu and "nvidia" not in f.runtimes:
        found.append("the NVIDIA container runtime is not configured in Docker")
    if f.slurm_job_ports and not node.place.private and not cfg.share_hosts_with_slurm:
        found.append(SHARED_WITH_SLURM)
    if f.network is not None and f.network.cluster != cfg.name:
        found.append(f"a Docker network named {node.place.network} exists that kit did not make for cluster "
                     f"{cfg.name}")
    return found


MISSING_SOURCE = "cluster.mounts:"  # how each problem of a mount's host path begins
# A node of the Slurm cluster `kit prepare --slurm` made: its Prolog keeps each Slurm job's ports to the job's user by
# the uid of the connecting socket, and a job of this cluster is root in the host's network (its containers' sshd
# needs SETUID), able to take on any uid.
SHARED_WITH_SLURM = ("this host is a node of the Slurm cluster kit prepared: a job of this cluster runs as root in "
                     "the host's network and could reach Slurm jobs' ports as their users")


def mount_problems(cfg: ClusterConfig, sources: dict[str, str]) -> list[str]:
    """Each host path of cluster.mounts that is not a folder on the host."""
    found = []
    for m in cfg.bind_mounts:
        kind = sources.get(m.host)
        if kind != "folder":
            found.append(f"{MISSING_SOURCE} {m.host} " + ("is not a folder" if kind else "does not exist") +
                         f" (to be mounted at {m.container})")
    return found


def slots(node: Node, cfg: ClusterConfig, gpu: bool) -> int:
    """Ranks this host runs: as hosts.txt says, else one per GPU (cluster.gpus or nvidia-smi), else one."""
    if node.host.slots:
        return node.host.slots
    if gpu:
        return cfg.gpus if isinstance(cfg.gpus, int) and cfg.gpus > 0 else max(node.facts.gpus, 1)
    return 1


def hint_for(found: list[str]) -> str:
    if CONTAINERD_STORE in found:
        return CONTAINERD_HINT
    if SHARED_WITH_SLURM in found:
        return ("give the Docker cluster and Slurm hosts of their own, or set cluster.share_hosts_with_slurm: true in "
                "kit.yaml where every user of both trusts the others")
    if any(p.startswith(MISSING_SOURCE) for p in found):
        return ("make the folder on that host (or mount its share there), or remove the entry from cluster.mounts in "
                "kit.yaml, then run kit up again")
    if any("kit leaves another's cluster alone" in p for p in found):
        return "choose another cluster name (--name or cluster.name), or ask its owner to run kit down"
    if any("storage" in p for p in found):
        return ("install it, or run `kit prepare --hosts hosts.txt` (it installs what cluster.storage needs), "
                "then kit up again")
    if any("already a mount" in p for p in found):
        return "unmount it, or set cluster.workspace in kit.yaml to another folder"
    if any("/dev/fuse" in p for p in found):
        return "load the fuse module (modprobe fuse) or use storage: copy"
    if any("port" in p for p in found):
        return "stop that program or choose another cluster.ssh_port in kit.yaml"
    if any("network" in p for p in found):
        return "remove it (docker network rm) or choose another cluster name (--name)"
    if any("docker" in p for p in found):
        return "install and start Docker on that host (`kit prepare` does it)"
    if any("NVIDIA" in p or "GPU" in p for p in found):
        return "install the NVIDIA driver and container toolkit (`kit prepare`), or use the cpu flavor"
    return "free disk space in Docker's data root (docker system prune) and run kit up again"


def check_drivers(nodes: list[Node], flavor: str, line: str | None) -> None:
    """Every GPU host's NVIDIA driver runs the image's CUDA line (checked before an image is built for it)."""
    failures = {}
    for n in nodes:
        found = gpus.driver_problem(n.facts.drivers, flavor, line)
        if found:
            failures[n.name] = KitError(found[0], host=n.name, hint=found[1])
    if failures:
        raise HostsFailed("preflight", failures)


def check(node: Node, cfg: ClusterConfig, image_id: str, image_bytes: int, gpu: bool, primary_address: str,
          owner: Owner) -> None:
    found = problems(node, cfg, image_id, image_bytes, gpu, primary_address, owner)
    if found:
        raise KitError("; ".join(found), host=node.name, hint=hint_for(found))


def recorded_nodes(hosts: list[st.HostState], connect: Callable[[Host], Runner]) -> list[Node]:
    """Hosts that `up` recorded, running as root (with sudo where their login needed it at up: asked again only where
    that is not recorded), at the addresses it recorded. Each connects at its first command."""
    nodes = [Node(h.host, connect(h.host), h.place, address=h.address) for h in hosts]
    for n, h in zip(nodes, hosts):
        if h.sudo is not None:
            n.runner.sudo = h.sudo
    fan_out("connecting", [n for n, h in zip(nodes, hosts) if h.sudo is None], become_root, lambda n: n.name)
    return nodes
