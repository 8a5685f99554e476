"""`kit doctor`'s findings: pure functions that turn what was read on the hosts into one finding per check per host,
ok, warn or fail, each warn and fail with its fix.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter

from kit.image import gpus as nvidia
from kit.cluster import state as st
from kit.jobs.commands.horovod import on_cluster_subnet
from kit.config.settings import AUTO_FLAVORS, ClusterConfig, cuda_line
from kit.doctor.finding import FAIL, OK, WARN, Finding
from kit.doctor.gpuhealth import judge_health
from kit.doctor.read import Nic, Reading
from kit.errors import BadInput, KitError
from kit.cluster.steps.facts import CONTAINERD_HINT, CONTAINERD_STORE, HostFacts

MIB, GIB = 1 << 20, 1 << 30
SHM_FAIL, SHM_WARN = 512 * MIB, GIB       # Docker's default /dev/shm is 64 MB: NCCL and DataLoader workers die of it
DISK_FAIL, DISK_WARN = GIB, 5 * GIB
CLOCK_FAIL_S, CLOCK_WARN_S = 5.0, 1.0    # from the median of the hosts' clocks


def _host_checks(r: Reading, cfg: ClusterConfig, state: st.ClusterState | None, gpu: bool,
                 flavor: str = "gpu", cuda: str | None = None) -> list[Finding]:
    f = r.facts
    out = [Finding(r.name, "ssh", OK, f"reached from this machine as root (as {r.address})"), _docker(r.name, f)]
    out.append(_disk(r.name, "docker disk", f"in Docker's data root {f.docker_root or '?'}", f.free_bytes,
                     "free space there (`docker system prune`, old images)"))
    if gpu:
        out += _gpu(r, state is not None) + _cuda(r, flavor, cuda) + judge_health(r.name, r.gpu_health)
    return out


def _docker(host: str, f: HostFacts) -> Finding:
    if not f.docker_version:
        return Finding(host, "docker", FAIL, f"Docker does not answer ({f.docker_error})",
                       "install and start Docker (`kit prepare --hosts hosts.txt` does it)")
    if f.containerd_store:
        return Finding(host, "docker", FAIL, f"Docker {f.docker_version}: {CONTAINERD_STORE}", CONTAINERD_HINT)
    return Finding(host, "docker", OK, f"Docker {f.docker_version}")


def _disk(host: str, what: str, where: str, free: int | None, fix: str) -> Finding:
    if free is None:
        return Finding(host, what, WARN, f"cannot tell the free space {where}", fix)
    level = FAIL if free < DISK_FAIL else WARN if free < DISK_WARN else OK
    return Finding(host, what, level, f"{free / GIB:.1f} GiB free {where}", "" if level == OK else fix)


def _gpu(r: Reading, up: bool) -> list[Finding]:
    f = r.facts
    out = []
    if not f.gpus:
        out.append(Finding(r.name, "gpu", FAIL, "nvidia-smi lists no GPU", "install the NVIDIA driver "
                           "(`kit prepare`), or use the cpu flavor"))
    elif "nvidia" not in f.runtimes:
        out.append(Finding(r.name, "gpu", FAIL, f"{f.gpus} GPUs, but Docker has no nvidia runtime",
                           "install the NVIDIA Container Toolkit (`kit prepare --hosts hosts.txt`)"))
    elif up and r.container_gpus < f.gpus:
        out.append(Finding(r.name, "gpu", FAIL, f"the container sees {r.container_gpus} of the host's {f.gpus} "
                           "GPUs", "run `kit up` again (it restarts the container with the GPUs)"))
    else:
        out.append(Finding(r.name, "gpu", OK, f"{f.gpus} GPUs, driver {', '.join(sorted(set(r.drivers))) or '?'}"
                           + (", all seen in the container" if up else "")))
    return out


def _cuda(r: Reading, flavor: str, cuda: str | None) -> list[Finding]:
    """The host's NVIDIA driver against the image's CUDA line (as kit up's preflight judges it)."""
    line = cuda_line(flavor, cuda)
    if not r.drivers or not line:
        return []
    found = nvidia.driver_problem(r.drivers, flavor, line)
    if found:
        return [Finding(r.name, "cuda", FAIL, *found)]
    return [Finding(r.name, "cuda", OK, f"NVIDIA driver {min(r.drivers, key=nvidia.version)} runs CUDA {line} (it "
                    f"needs {nvidia.min_driver(line)} or newer)")]


def decide_flavor(requested: str, where: str, readings: list[Reading]) -> tuple[str, list[Finding]]:
    """build.flavor auto (or tf) decided from the hosts' GPUs as kit up decides it; hosts of both kinds fail."""
    seen = [r for r in readings if r.facts]
    try:
        return nvidia.decide(requested, where, {r.name: r.facts.nvidia_gpus for r in seen})[0], []
    except BadInput as e:
        return AUTO_FLAVORS[requested][0], [
            Finding(r.name, "flavor", FAIL, f"the flavor cannot follow the hosts' GPUs: {e.message}",
                    "list only one kind of host in hosts.txt, or set build.flavor to cpu (tf-cpu) in kit.yaml to use "
                    "CPUs everywhere") for r in seen]


def _port(r: Reading, port: int, up: bool) -> Finding:
    """On an up cluster the container's sshd holds the cluster port; before `up` nothing may."""
    fix_other = "stop that program, or choose another cluster.ssh_port in kit.yaml and run `kit up`"
    listening = port in r.facts.listening
    holder = next((l for l in r.listeners if l.port == port and l.pid), None)
    ours = listening and (holder is None or holder.pidns == r.container_pidns)  # (a private network: the container's)
    other = f"{holder.comm} (pid {holder.pid})" if holder else "another program"
    if not up:
        if listening and not ours:
            return Finding(r.name, "port", FAIL, f"port {port} is taken by {other}", fix_other)
        return Finding(r.name, "port", OK, f"port {port} is free" if not listening else
                       f"port {port} is held by this cluster's container")
    if not listening:
        return Finding(r.name, "port", FAIL, f"nothing listens on port {port}: the container's sshd is not running",
                       "run `kit up` (it starts the container again)")
    if not ours:
        return Finding(r.name, "port", FAIL, f"port {port} is held by {other}, not by the container's sshd", fix_other)
    return Finding(r.name, "port", OK, f"the container's sshd listens on port {port}")


def _job_ports(r: Reading) -> Finding | None:
    """What the container's programs listen on (sshd, a job's rendezvous, Gloo, torchrun's store): only the
    cluster's address (or loopback), never every interface (Horovod's rendezvous has no authentication)."""
    mine = [l for l in r.listeners if l.pid and r.container_pidns and l.pidns == r.container_pidns]
    if not mine:
        return None
    wide = [l for l in mine if l.everywhere]
    if not wide:
        return Finding(r.name, "listening", OK, f"the container's {len(mine)} listening port"
                       f"{'s are' if len(mine) > 1 else ' is'} bound to the cluster address or loopback")
    names = ", ".join(f"{l.comm} on {l.address} port {l.port}" for l in wide)
    return Finding(r.name, "listening", WARN, f"listening on every interface, not only the cluster address: {names}",
                   "a job's own servers should bind the cluster address (kit sets MASTER_ADDR, and Horovod's "
                   "interface); `kit prepare`'s firewall admits only the cluster's hosts to these ports")


def _container(r: Reading, state: st.ClusterState, cfg: ClusterConfig, owner_ok: bool, gpu: bool) -> list[Finding]:
    f, name = r.facts, r.container or cfg.container
    c = f.container if owner_ok else None
    out = []
    if c is None or c.status != "running":
        out.append(Finding(r.name, "container", FAIL, f"container {name} is {c.status if c else 'missing'}",
                           "run `kit up` (it starts it again)"))
    elif r.container_error and cfg.workspace_path in r.container_error:  # its working folder: docker exec starts there
        why = re.search(r"(transport endpoint is not connected|stale file handle|no such file or directory|permission "
                        r"denied)", r.container_error, re.I)
        out.append(Finding(r.name, "workspace", FAIL, f"the container cannot enter the workspace {cfg.workspace_path} "
                           f"({why[1].lower() if why else r.container_error}): the shared mount here is gone or dead, "
                           "nothing runs in the container", "`kit down`, then `kit up` (it mounts the workspace "
                           "afresh)"))
    elif r.container_error:
        out.append(Finding(r.name, "container", FAIL, f"container {name} does not answer: {r.container_error}",
                           "`docker restart " + name + "` on that host, or `kit up`"))
    else:
        out.append(Finding(r.name, "container", OK, f"{name} is running"))
    images = {f.image_id, c.image_id if c else f.image_id}
    if images != {state.image_id}:
        seen = ", ".join(sorted(_short(i) for i in images if i)) or "no image"
        out.append(Finding(r.name, "image", FAIL, f"{state.image} here is {seen}, the cluster's is "
                           f"{_short(state.image_id)}", "run `kit up`: it loads the cluster's image here and "
                           "restarts the container"))
    else:
        out.append(Finding(r.name, "image", OK, f"{state.image} ({_short(state.image_id)}), as on every host"))
    if r.shm_bytes is not None:
        level = FAIL if r.shm_bytes < SHM_FAIL else WARN if r.shm_bytes < SHM_WARN else OK
        out.append(Finding(r.name, "shm", level, f"/dev/shm in the container is {r.shm_bytes / MIB:.0f} MiB"
                           + ("" if level == OK else ": NCCL, Gloo's shared memory and DataLoader workers need more"),
                           "" if level == OK else "leave cluster.shm_size out (the container shares the host's "
                           "/dev/shm) and make the host's /dev/shm larger, or set cluster.shm_size: 8g; then `kit up`"))
    if r.memlock:  # only NCCL's RDMA transports (InfiniBand, RoCE) pin memory; TCP and Gloo do not
        fine = r.memlock == "unlimited" or not gpu
        out.append(Finding(r.name, "memlock", OK if fine else WARN, f"memlock limit in the container: {r.memlock}"
                           + ("" if r.memlock == "unlimited" else " KiB" + ("" if gpu else " (enough: only RDMA "
                                                                                    "transports need it unlimited)")),
                           "" if fine else "raise the host's memlock hard limit (limits.conf, LimitMEMLOCK of "
                           "docker.service), then `kit up`: NCCL over InfiniBand or RoCE needs it unlimited"))
    if r.workspace_free is not None or not r.container_error:
        out.append(_disk(r.name, "workspace disk", f"in the workspace {cfg.workspace_path}", r.workspace_free,
                         "free space there (old checkpoints and outputs)"))
    return out


def _short(image_id: str) -> str:
    return image_id.split(":")[-1][:12]


def _clocks(readings: list[Reading]) -> list[Finding]:
    """Each host's clock against the median of all (three or more: the odd one is named), or, with two, against the
    other's (which of two is wrong cannot be told: both carry the whole difference)."""
    seen = [r for r in readings if r.clock_offset is not None]
    if not seen:
        return []
    out = []
    for r in seen:
        others = [o.clock_offset for o in seen if o is not r]
        if not others:
            off, text = r.clock_offset, f"clock {_seconds(r.clock_offset)} from this machine's"
        else:
            off = r.clock_offset - (statistics.median([o.clock_offset for o in seen]) if len(seen) > 2 else others[0])
            text = f"clock {_seconds(off)} {'ahead of' if off > 0 else 'behind'} the other{'s' if len(others) > 1 else ''}"
        level = FAIL if abs(off) > CLOCK_FAIL_S else WARN if abs(off) > CLOCK_WARN_S else OK
        out.append(Finding(r.name, "clock", level, f"{text} (±{r.clock_error * 1000:.0f} ms)",
                           "" if level == OK else "run NTP on every host (systemd-timesyncd or chrony) so their "
                           "clocks agree"))
    return out


def _seconds(s: float) -> str:
    s = abs(s)
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def cluster_nic(nics: list[Nic], addresses: list[str]) -> Nic | None:
    """The NIC whose subnet holds every cluster address (kit picks by subnet, never by name)."""
    i = on_cluster_subnet([(n.name, n.address, n.prefix) for n in nics], addresses)
    return None if i is None else nics[i]


def _nics(readings: list[Reading]) -> list[Finding]:
    """Each host's NIC of its hosts.txt address (SSH and kit's own traffic go over it; the training network has a
    check of its own): one that differs in MTU from the others' is a warning."""
    seen = [r for r in readings if r.facts]
    chosen = {r.name: next((n for n in r.nics if n.address == r.address), None) for r in seen}
    mtus = [n.mtu for n in chosen.values() if n and n.mtu]
    usual = majority(mtus)
    out = []
    for r in seen:
        n = chosen[r.name]
        if n is None:
            out.append(Finding(r.name, "nic", FAIL, f"the address kit reaches it at ({r.address}) is on none of its "
                               "interfaces (behind NAT, or a jump host's?): its container's sshd cannot listen there",
                               "list the host in hosts.txt by an address of its own (or by a name that resolves to "
                               "one)"))
            continue
        text = (f"{n.name} ({n.address}/{n.prefix}), MTU {n.mtu or '?'}, "
                + (f"{n.speed_mbps} Mb/s" if n.speed_mbps else "speed not reported"))
        if n.mtu and len(set(mtus)) > 1 and n.mtu != usual:
            others = usual or ", ".join(str(c.mtu) for h, c in chosen.items() if h != r.name and c and c.mtu)
            out.append(Finding(r.name, "nic", WARN, f"{text}; the other hosts' MTU is {others}: large messages between "
                               "them stall", f"set the same MTU on every host (ip link set dev {n.name} mtu N, and "
                               "in the host's network configuration)"))
        else:
            out.append(Finding(r.name, "nic", OK, text))
    return out


def majority(values: list):
    """The value more than half of them have, else None (a tie names no one). Pure."""
    if not values:
        return None
    value, count = Counter(values).most_common(1)[0]
    return value if count * 2 > len(values) else None


def _drivers(readings: list[Reading]) -> list[Finding]:
    versions = {r.name: ", ".join(sorted(set(r.drivers))) for r in readings if r.drivers}
    if len(set(versions.values())) <= 1:
        return []
    usual = majority(list(versions.values()))
    return [Finding(host, "gpu driver", FAIL, f"NVIDIA driver {v} here, " + (f"{usual} on the others" if usual else
                    "other versions on the others (" + "; ".join(f"{h}: {o}" for h, o in versions.items()
                                                                if h != host) + ")"),
                    "install the same driver version on every host (NCCL between versions can fail or hang)")
            for host, v in versions.items() if v != usual]


def judge_pairs(results: dict[str, dict[str, tuple[int, str]]], names: dict[str, str], port: int) -> list[Finding]:
    """results: source host -> target address -> (ssh's exit, its last line); names: address -> host. Each target
    is judged by who reaches its sshd; a source that reaches nobody while the others reach everyone is named
    itself (its own ssh client, keys or network are at fault). Pure."""
    out, judged = [], dict(results)
    for source, tried in results.items():
        others_fine = all(code == 0 for s in results if s != source
                          for a, (code, _) in results[s].items() if names[a] != source)
        if len(results) > 2 and tried and others_fine and all(code != 0 for code, _ in tried.values()):
            out.append(Finding(source, "ssh mesh", FAIL, "this container reaches none of the others over SSH: "
                               f"{next(iter(tried.values()))[1]}", "run `kit up` (it rewrites the keys and "
                               "restarts the container)"))
            del judged[source]
    for address, target in names.items():
        tried = {s: r[address] for s, r in judged.items() if address in r}
        bad = {s: v for s, v in tried.items() if v[0] != 0}
        if not tried:
            continue
        if not bad:
            out.append(Finding(target, "ssh mesh", OK, f"its container's sshd (port {port}) answers SSH from the "
                               f"{len(tried)} other containers"))
            continue
        code, said = next(iter(bad.values()))
        out.append(Finding(target, "ssh mesh", FAIL, f"SSH to its container ({address}:{port}) fails from "
                           f"{', '.join(bad)}: {said or f'exit {code}'}", "see the port and container lines of this "
                           "host and `docker logs` of its container; `kit up` restarts the container"))
    return out


# ---------------------------------------------------------------- a host, the hosts

def judge_host(r: Reading, cfg: ClusterConfig, state: st.ClusterState | None, gpu: bool, flavor: str,
               cuda: str | None, owner) -> list[Finding]:
    """One reachable host's findings. `state`: the cluster as `up` recorded it (None: hosts before `up`)."""
    up = state is not None
    out = []
    if other := r.facts.foreign(cfg.name, owner):  # nothing of theirs is read as this cluster's
        out.append(Finding(r.name, "owner", FAIL, f"a cluster named {cfg.name} of {other} is here; kit "
                           "leaves another's cluster alone", "choose another cluster name (--name or "
                           "cluster.name in kit.yaml), or ask its owner to run kit down"))
        r.container_pidns, r.shm_bytes, r.memlock, r.workspace_free = "", None, "", None
    out += _host_checks(r, cfg, state, gpu, flavor, cuda)
    if r.facts.docker_version:
        out.append(_port(r, cfg.ssh_port, up))
    if up and (ports := _job_ports(r)):
        out.append(ports)
    if up and r.facts.docker_version:
        mine = bool(r.facts.container and r.facts.container.cluster == cfg.name
                    and r.facts.container.owner == owner)
        out += _container(r, state, cfg, mine, gpu)
    return out


def judge_across(readings: list[Reading]) -> list[Finding]:
    """What is judged by comparing the hosts: their clocks, their NICs, their NVIDIA drivers."""
    return _clocks(readings) + _nics(readings) + _drivers(readings)


def unreachable(readings: list[Reading]) -> list[Finding]:
    return [Finding(r.name, "ssh", FAIL, f"cannot reach or read the host: {r.error}",
                    r.hint or "check that the host is up and that `ssh` to it works as in hosts.txt")
            for r in readings if r.error]


def judge_workspace(primary: str, others: list[str], state: st.ClusterState, cfg: ClusterConfig,
                    failures: dict[str, KitError], error: KitError | None = None) -> list[Finding]:
    """The shared workspace check: `failures`, the hosts that did not see the primary's file; `error`, the check
    itself failed on the primary."""
    if error is not None:
        return [Finding(primary, "workspace", FAIL, error.message, error.hint or "")]
    return [Finding(n, "workspace", FAIL, failures[n].message, failures[n].hint or "")
            if n in failures else
            Finding(n, "workspace", OK, f"{cfg.workspace_path} is shared ({state.storage}): a file the "
                    "primary wrote is seen here")
            for n in others]
