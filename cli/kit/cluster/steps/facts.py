"""What a host looks like, read with one command and parsed by a pure function.

Every step decides from these facts, so a second `kit up` on an unchanged
cluster finds nothing to do. Gathering changes nothing on the host.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from kit.image import gpus as nvidia
from kit.hostoutput import INNER, MARK, PREFIX_INNER, is_number, lines, sections
from kit.cluster.identity import Owner
from kit.network import links as netlinks
from kit.cluster.place import Place
from kit.cluster.steps import storage

END = "end"  # the last section: the script ran to its end
FACTS_TIMEOUT_S = 120


@dataclass(frozen=True)
class ContainerFacts:
    status: str     # running, exited, created, restarting...
    image_id: str
    spec: str       # the io.kit.spec label: the hash of how it was started
    cluster: str    # the io.kit.cluster label
    owner: Owner | None = None  # the io.kit.owner labels: who made it


@dataclass(frozen=True)
class NetworkFacts:
    cluster: str    # its io.kit.cluster label
    subnets: tuple[str, ...]
    owner: Owner | None = None


@dataclass(frozen=True)
class HostFacts:
    uid: int
    docker_version: str | None          # None: docker did not answer
    docker_error: str = ""
    docker_root: str = ""
    free_bytes: int = 0
    listening: frozenset[int] = frozenset()
    links: netlinks.Reading = netlinks.Reading()  # its interfaces and RDMA ports (kit.network.links)
    image_id: str | None = None
    container: ContainerFacts | None = None
    kit_files: dict[str, str] = field(default_factory=dict)  # file in kit's ssh folder -> sha256
    kit_dir_exists: bool = False
    workspace_exists: bool = False
    gpus: int = 0                       # what nvidia-smi lists
    drivers: tuple[str, ...] = ()       # the NVIDIA driver of each GPU
    pci_gpus: int = 0                   # NVIDIA GPUs on the PCI bus, whether or not a driver answers
    tags: dict[str, str] = field(default_factory=dict)  # every image's repository:tag -> its ID
    runtimes: frozenset[str] = frozenset()
    hostname: str = ""
    network: NetworkFacts | None = None   # the private network of the container's place, when it exists
    kit_dir_owner: Owner | None = None    # whose cluster kit's folder on the host is (its owner file)
    memlock_kb: int | None = None     # hard RLIMIT_MEMLOCK; None: unlimited
    can_raise_limits: bool = True     # CAP_SYS_RESOURCE in the bounding set
    mount: tuple[str, str] | None = None  # (fstype, source) mounted at the workspace path
    export: str = ""                  # this cluster's line in /etc/exports
    tools: frozenset[str] = frozenset()   # sshfs, exportfs, mount.nfs, fuse (/dev/fuse): what storage needs
    layer_chains: tuple[tuple[str, ...], ...] = ()  # each image's layers (diff IDs, bottom first)
    python3: bool = False                 # runs kit's image relay
    containerd_store: bool = False        # Docker keeps images in containerd's image store (29's default)
    sources: dict[str, str] = field(default_factory=dict)  # cluster.mounts' host paths: "folder" or "other" (or none)
    slurm_job_ports: bool = False         # a node of the Slurm cluster kit prepared (its job ports' Prolog is here)

    def foreign(self, cluster: str, owner: Owner) -> Owner | None:
        """Another owner of a cluster of this name on this host (its container, network or kit's folder), if any.
        A container or network of the name without an owner is nobody's kit cluster of this version: foreign."""
        for thing in (self.container, self.network):
            if thing is not None and thing.cluster == cluster and (thing.owner is None or thing.owner.id != owner.id):
                return thing.owner or Owner("?", "a kit that did not record its owner")
        if self.kit_dir_owner is not None and self.kit_dir_owner.id != owner.id:
            return self.kit_dir_owner
        return None

    @property
    def ipv4(self) -> tuple[tuple[str, str, int], ...]:
        """(interface, address, prefix length) of each IPv4 address."""
        return tuple((l.name, a.address, a.prefix) for l in self.links.links for a in l.addresses if a.ip.version == 4)

    @property
    def nvidia_gpus(self) -> int:
        """The host's NVIDIA GPUs: what nvidia-smi lists, or, before a driver answers, what the PCI bus has."""
        return max(self.gpus, self.pci_gpus)

    @property
    def memlock(self) -> str:
        """The container's memlock ulimit: unlimited where the host allows it, else its hard limit."""
        if self.can_raise_limits or self.memlock_kb is None:
            return "-1:-1"
        return f"{self.memlock_kb * 1024}:{self.memlock_kb * 1024}"


def facts_command(image: str, place: Place, workspace: str, cluster: str, sources: tuple[str, ...] = ()) -> str:
    """A POSIX sh script that prints each fact under a `@@kit NAME` line. sources: the host paths of cluster.mounts."""
    q = shlex.quote
    container, kit_dir = place.container, place.kit_dir
    # The cluster port is open where the container's sshd listens: the host's network, or the container's own (what
    # the container prints goes with INNER in front: none of its lines can start a section)
    tcp = "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"
    if place.private:
        tcp = f"docker exec {q(container)} {tcp} | {PREFIX_INNER}"
    return "\n".join([
        f"echo '{MARK}docker'; docker version --format '{{{{.Server.Version}}}}' 2>&1",
        # One docker info for all it says (each call costs the engine a full reading); its first line, Docker's data
        # root, is where df looks.
        f"info=$(docker info --format '{{{{.DockerRootDir}}}}{{{{\"\\n{MARK}runtimes\\n\"}}}}{{{{json .Runtimes}}}}"
        f"{{{{\"\\n{MARK}driverstatus\\n\"}}}}{{{{json .DriverStatus}}}}' 2>/dev/null)",
        f"echo '{MARK}dockerroot'; printf '%s\\n' \"$info\"; root=$(printf '%s\\n' \"$info\" | head -n 1)",
        f"echo '{MARK}df'; df -Pk \"${{root:-/}}\" 2>/dev/null | tail -n 1",
        f"echo '{MARK}tcp'; {tcp}",
        f"echo '{MARK}net'", netlinks.SCRIPT,
        f"echo '{MARK}image'; docker image inspect --format '{{{{.Id}}}}' {q(image)} 2>/dev/null",
        f"echo '{MARK}layers'; docker image ls -q --no-trunc 2>/dev/null | sort -u | xargs -r docker image inspect "
        f"--format '{{{{json .RootFS.Layers}}}}' 2>/dev/null",
        f"echo '{MARK}python3'; command -v python3",
        f"echo '{MARK}container'; docker inspect --type container --format "
        f"'{{{{json .State.Status}}}} {{{{json .Image}}}} {{{{json .Config.Labels}}}}' {q(container)} 2>/dev/null",
        f"echo '{MARK}kitdir'; test -d {q(kit_dir)} && echo yes",
        f"echo '{MARK}owner'; cat {q(place.owner_file)} 2>/dev/null",
        f"echo '{MARK}kitfiles'; cd {q(kit_dir + '/ssh')} 2>/dev/null && sha256sum -- * 2>/dev/null",
        f"echo '{MARK}workspace'; test -d {q(workspace)} && echo yes",
        *nvidia.SCRIPT,
        f"echo '{MARK}tags'; docker image ls --no-trunc --format '{{{{.Repository}}}}:{{{{.Tag}}}} {{{{.ID}}}}' "
        "2>/dev/null",
        f"echo '{MARK}limits'; ulimit -Hl; grep '^CapBnd:' /proc/self/status",
        f"echo '{MARK}hostname'; hostname",
        f"echo '{MARK}slurmjobports'; test -e /etc/slurm/kit-job-ports-prolog && echo yes",
        f"echo '{MARK}network'; docker network inspect --format '{{{{json .Labels}}}} "
        f"{{{{range .IPAM.Config}}}}{{{{.Subnet}}}} {{{{end}}}}' {q(place.network)} 2>/dev/null" if place.private else "",
        *storage.facts_script(cluster, workspace),
        f"echo '{MARK}sources'; for p in {' '.join(map(q, sources))}; do if [ -d \"$p\" ]; then echo \"folder $p\"; "
        "elif [ -e \"$p\" ]; then echo \"other $p\"; fi; done" if sources else "",
        f"echo '{MARK}{END}'",
    ])


def complete(text: str) -> bool:
    return f"{MARK}{END}" in lines(text)


def listening_ports(proc_net_tcp: str) -> frozenset[int]:
    """TCP ports in LISTEN state (st 0A) from /proc/net/tcp and tcp6 (a container's, with INNER in front)."""
    ports = set()
    for line in lines(proc_net_tcp):
        cols = line.removeprefix(INNER).split()
        if len(cols) > 3 and cols[3] == "0A" and re.fullmatch(r"[0-9A-F]+:[0-9A-F]{4}", cols[1]):
            ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return frozenset(ports)


def label_owner(labels: dict) -> Owner | None:
    return Owner(labels["io.kit.owner"], labels.get("io.kit.owner-name", "someone")) if labels.get("io.kit.owner") \
        else None


def _network(text: str) -> NetworkFacts | None:
    if not text:
        return None
    labels, _, subnets = text.partition(" ")
    labels = json.loads(labels) or {}
    return NetworkFacts(labels.get("io.kit.cluster", ""), tuple(subnets.split()), label_owner(labels))


def _container(text: str) -> ContainerFacts | None:
    if not text:
        return None
    status, image, labels = text.split(" ", 2)
    labels = json.loads(labels) or {}
    return ContainerFacts(json.loads(status), json.loads(image), labels.get("io.kit.spec", ""),
                          labels.get("io.kit.cluster", ""), label_owner(labels))


CAP_SYS_RESOURCE = 24


def _limits(text: str) -> tuple[int | None, bool]:
    said = lines(text)
    hard = said[0].strip() if said else "unlimited"
    bounding = next((l.split()[1] for l in said if l.startswith("CapBnd:") and len(l.split()) > 1), "")
    can_raise = not re.fullmatch(r"[0-9a-f]+", bounding) or bool(int(bounding, 16) >> CAP_SYS_RESOURCE & 1)
    return (int(hard) if is_number(hard) else None), can_raise


def parse_facts(uid: int, text: str) -> HostFacts:
    s = sections(text)
    memlock_kb, can_raise = _limits(s.get("limits", ""))
    docker = s.get("docker", "")
    answers = bool(re.fullmatch(r"[0-9]+\.[0-9]+\S*", docker))
    df = s.get("df", "").split()
    runtimes = s.get("runtimes", "")
    gpus = nvidia.parse(s)
    return HostFacts(
        uid=uid,
        docker_version=docker if answers else None,
        docker_error="" if answers else lines(docker)[-1] if docker else "docker: command not found",
        docker_root=s.get("dockerroot", ""),
        free_bytes=int(df[3]) * 1024 if len(df) >= 4 and is_number(df[3]) else 0,
        listening=listening_ports(s.get("tcp", "")),
        links=netlinks.parse(s.get("net", "")),
        image_id=s.get("image") or None,
        container=_container(s.get("container", "")),
        kit_files={name: digest for digest, name in (l.split(None, 1) for l in lines(s.get("kitfiles", "")) if l)},
        kit_dir_exists=s.get("kitdir") == "yes",
        workspace_exists=s.get("workspace") == "yes",
        gpus=gpus.listed,
        drivers=gpus.drivers,
        pci_gpus=gpus.pci,
        tags=dict(l.split(" ", 1) for l in lines(s.get("tags", "")) if " " in l and "<none>" not in l),
        runtimes=frozenset(json.loads(runtimes)) if runtimes.startswith("{") else frozenset(),
        hostname=s.get("hostname", ""),
        network=_network(s.get("network", "")),
        kit_dir_owner=Owner.parse(s.get("owner", "")),
        memlock_kb=memlock_kb,
        can_raise_limits=can_raise,
        mount=storage.parse_mount(s.get("mount", "")),
        export=s.get("exports", ""),
        tools=frozenset(s.get("tools", "").split()),
        layer_chains=_layer_chains(s.get("layers", "")),
        python3=bool(s.get("python3")),
        containerd_store=_containerd_store(s.get("driverstatus", "")),
        sources={path: kind for kind, _, path in (l.partition(" ") for l in lines(s.get("sources", ""))) if path},
        slurm_job_ports=s.get("slurmjobports") == "yes",
    )


def _containerd_store(driver_status: str) -> bool:
    try:
        return containerd_store(json.loads(driver_status))
    except ValueError:
        return False


CONTAINERD_STORE = ("Docker keeps images in containerd's image store (Docker 29's default on a new install), which "
                    "kit does not support yet: it moves images with `docker save` and `docker load` in Docker's own "
                    "image store")
CONTAINERD_HINT = ('set "features": {"containerd-snapshotter": false} in /etc/docker/daemon.json and restart Docker '
                   "(the images kept in containerd's store are not seen from the other)")


def containerd_store(driver_status: object) -> bool:
    """Whether `docker info`'s DriverStatus is that of containerd's image store."""
    return isinstance(driver_status, list) and ["driver-type", "io.containerd.snapshotter.v1"] in driver_status


def _layer_chains(text: str) -> tuple[tuple[str, ...], ...]:
    chains = []
    for line in lines(text):
        try:
            layers = json.loads(line)
        except ValueError:
            continue
        if isinstance(layers, list) and all(isinstance(d, str) for d in layers):
            chains.append(tuple(layers))
    return tuple(chains)
