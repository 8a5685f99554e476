"""`kit doctor`: will a job start on this cluster, and if not, which host and what to fix.

Each host is read with few commands (kit's facts script, a doctor script on the host and in its container, the
clock), all at once across the hosts; then pure functions turn what was read into findings, one per check per host:
ok, warn or fail, each warn and fail with its fix. Nothing on a host is changed but one file of its own that the
workspace check writes in the workspace and removes again.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from kit import gpus as nvidia
from kit import state as st
from kit.commands.docker import command, exec_argv
from kit.commands.horovod import on_cluster_subnet
from kit.config import AUTO_FLAVORS, ClusterConfig, cuda_line, uses_gpus
from kit.errors import BadInput, HostsFailed, KitError
from kit.fanout import fan_out
from kit.hostoutput import INNER, PREFIX_INNER, inner_lines, is_number, lines, number
from kit.place import Place
from kit.runners import Runner
from kit.steps import check, preflight
from kit.steps.facts import CONTAINERD_HINT, CONTAINERD_STORE, MARK, HostFacts, sections
from kit.steps.node import Node

OK, WARN, FAIL = "ok", "warn", "fail"
MIB, GIB = 1 << 20, 1 << 30
SHM_FAIL, SHM_WARN = 512 * MIB, GIB       # Docker's default /dev/shm is 64 MB: NCCL and DataLoader workers die of it
DISK_FAIL, DISK_WARN = GIB, 5 * GIB
CLOCK_FAIL_S, CLOCK_WARN_S = 5.0, 1.0    # from the median of the hosts' clocks
PAIR_TIMEOUT_S = 20                       # one SSH between two containers, connection and handshake included
DOCTOR_TIMEOUT_S = 60


@dataclass(frozen=True)
class Finding:
    host: str
    check: str
    level: str   # ok, warn, fail
    text: str
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Nic:
    name: str
    address: str
    prefix: int
    mtu: int | None = None
    speed_mbps: int | None = None   # None: the driver does not say (virtual NICs, some VMs)


@dataclass(frozen=True)
class Listener:
    address: str        # 0.0.0.0 or :: : every interface
    port: int
    pid: int | None = None   # None: no process of this host holds it (it was closed while read)
    comm: str = ""
    pidns: str = ""

    @property
    def everywhere(self) -> bool:
        return ipaddress.ip_address(self.address).is_unspecified


@dataclass
class Reading:
    """What was read on one host; `error` set when it could not be reached (nothing else is then known)."""

    name: str
    container: str = ""
    address: str = ""
    error: str = ""
    facts: HostFacts | None = None
    clock_offset: float | None = None   # its clock minus the control machine's, in seconds
    clock_error: float = 0.0            # half the round trip of that reading
    nics: list[Nic] = field(default_factory=list)
    listeners: list[Listener] = field(default_factory=list)  # the host's listening TCP sockets (host network)
    container_pidns: str = ""           # the pid namespace of the container's main process
    drivers: tuple[str, ...] = ()       # NVIDIA driver version of each GPU (from the facts)
    shm_bytes: int | None = None        # the container's /dev/shm
    memlock: str = ""                   # the container's `ulimit -l`
    workspace_free: int | None = None   # free bytes in the workspace, as the container sees it
    container_gpus: int = 0
    container_error: str = ""           # what `docker exec` said when the container did not answer


# ---------------------------------------------------------------- reading a host

def doctor_script(place: Place, workspace: str) -> str:
    """A POSIX sh script for the host, in `@@kit NAME` sections: its NICs (MTU, speed), its listening sockets with
    the process of each and the container's pid namespace (to tell the container's from another program's), the
    NVIDIA driver, and from inside the container: /dev/shm, the memlock limit, free space in the workspace, its
    GPUs."""
    q = shlex.quote
    nics = ('for d in /sys/class/net/*; do echo "${d##*/} $(cat "$d/mtu" 2>/dev/null || echo ?) '
            '$(cat "$d/speed" 2>/dev/null || echo ?)"; done; ip -o -4 addr show 2>/dev/null')
    inner = "; ".join([
        f"echo '{MARK}shm'; df -Pk /dev/shm | tail -n 1",
        f"echo '{MARK}memlock'; ulimit -l",
        f"echo '{MARK}wsdf'; df -Pk {q(workspace)} 2>/dev/null | tail -n 1",
        f"echo '{MARK}cgpus'; nvidia-smi -L 2>/dev/null",
        *([f"echo '{MARK}nics'; {nics}"] if place.private else []),
    ])
    # Every listening socket (read once), and the process that holds each (its pid namespace tells the container's
    # from another program's)
    sockets = "sockets=$(awk '$4 == \"0A\" {print $2, $10}' /proc/net/tcp /proc/net/tcp6 2>/dev/null)"
    owners = ("listen=\" $(echo \"$sockets\" | cut -d' ' -f2 | tr '\\n' ' ')\"; "
              "for p in /proc/[0-9]*; do for i in $(ls -l \"$p/fd\" 2>/dev/null | "
              "sed -n 's/.*socket:\\[\\([0-9]*\\)\\]$/\\1/p'); do case \" $listen \" in *\" $i \"*) "
              "echo \"$i ${p#/proc/} $(readlink \"$p/ns/pid\") $(tr -d '\\n' < \"$p/comm\" | tr -c '[:alnum:]._-' '?')\";; "
              "esac; done; done")  # (a process names itself: only letters, digits and ._- of it are printed)
    return "\n".join([
        *([] if place.private else [f"echo '{MARK}nics'; {nics}", sockets,
                                    f"echo '{MARK}listen'; echo \"$sockets\"", f"echo '{MARK}owners'; {owners}"]),
        f"echo '{MARK}cpidns'; pid=$(docker inspect --format '{{{{.State.Pid}}}}' {q(place.container)} 2>/dev/null) "
        "&& [ \"$pid\" -gt 0 ] && readlink /proc/$pid/ns/pid",
        # What the container prints is the job's to forge: each of its lines goes with INNER in front (and a last line
        # it leaves open is closed, so that the end mark starts a line of its own)
        f"echo '{MARK}container'; docker exec {q(place.container)} sh -c {q(inner)} 2>&1 | {PREFIX_INNER}; echo",
        f"echo '{MARK}end'",
    ])


def parse_nics(text: str) -> list[Nic]:
    """`name mtu speed` lines, then `ip -o -4 addr` lines: the NICs that have an IPv4 address (a container's, with
    a private network: what is no IPv4 interface is left out). Pure."""
    link: dict[str, tuple[int | None, int | None]] = {}
    nics = []
    for line in lines(text):
        words = line.split()
        if len(words) == 3 and not is_number(words[0][:1]):
            mtu, speed = (number(w) for w in words[1:])
            link[words[0]] = (mtu, speed if speed and speed > 0 else None)
        elif len(words) >= 4 and words[2] == "inet" and _ipv4_interface(words[3]):
            name, (address, _, prefix) = words[1], words[3].partition("/")
            nics.append(Nic(name, address, int(prefix), *link.get(name.split("@")[0], (None, None))))
    return nics


def _ipv4_interface(text: str) -> bool:
    """ADDRESS/PREFIX of an IPv4 interface, in ASCII digits."""
    try:
        return bool(re.fullmatch(r"[0-9.]+/[0-9]+", text)) and ipaddress.IPv4Interface(text) is not None
    except ValueError:
        return False


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address (IPv4, or IPv6 as four 32-bit words, each in the host's byte order: little-endian)."""
    raw = bytes.fromhex(hex_address)
    return str(ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))))


def parse_listeners(listen: str, owners: str) -> list[Listener]:
    """`ADDRESS:PORT INODE` lines of /proc/net/tcp{,6} in LISTEN, and `INODE PID PIDNS COMM` lines. Pure."""
    held = {}
    for line in lines(owners):
        words = line.split(None, 3)
        if len(words) == 4 and is_number(words[0]) and is_number(words[1]):
            held[words[0]] = (int(words[1]), words[3], words[2])
    found = []
    for line in lines(listen):
        words = line.split()
        if len(words) == 2 and re.fullmatch(r"([0-9A-F]{8}|[0-9A-F]{32}):[0-9A-F]{4}", words[0]):
            address, port = words[0].rsplit(":", 1)
            found.append(Listener(_address(address), int(port, 16), *held.get(words[1], (None, "", ""))))
    return found


def _kib(df_line: str, column: int = 3) -> int | None:
    """Bytes from a `df -Pk` line: column 3 is what is free, 1 the size."""
    cols = df_line.split()
    return int(cols[column]) * 1024 if len(cols) >= 4 and is_number(cols[column]) else None


def parse_doctor(reading: Reading, text: str) -> None:
    """The host's sections, and the container's (its lines start with INNER: nothing it prints can pass for one of
    the host's: the text is cut at line feeds only); a container that did not answer printed only docker exec's
    complaint."""
    s = sections("\n".join(l for l in lines(text) if not l.startswith(INNER)))
    c = sections("\n".join(inner_lines(text)))
    reading.nics = parse_nics(s.get("nics") or c.get("nics", ""))
    reading.listeners = parse_listeners(s.get("listen", ""), s.get("owners", ""))
    reading.container_pidns = s.get("cpidns", "")
    if "shm" not in c:
        said = [l for l in inner_lines(text) if l.strip()]
        reading.container_error = said[-1] if said else "docker exec printed nothing"
        return
    reading.shm_bytes = _kib(c["shm"], column=1)  # its size: with --ipc=host others' files take some of it
    reading.memlock = c.get("memlock", "")
    reading.workspace_free = _kib(c.get("wsdf", ""))
    reading.container_gpus = len([l for l in lines(c.get("cgpus", "")) if l.startswith("GPU ")])


def read_clock(runner: Runner) -> tuple[float, float]:
    """(host clock - this machine's, half the round trip) from `date` run on the host."""
    before = time.time()
    r = runner.run("date +%s.%N", timeout=DOCTOR_TIMEOUT_S).check("cannot read the clock")
    after = time.time()
    if not re.fullmatch(r"[0-9]+\.[0-9]+", r.stdout.strip()):
        raise KitError("cannot read the clock: `date +%s.%N` printed no time", output_tail=r.tail())
    return float(r.stdout.strip()) - (before + after) / 2, (after - before) / 2


def read_host(node: Node, cfg: ClusterConfig, image: str) -> Reading:
    """Everything doctor needs from one host; an unreachable host is a Reading with its error."""
    reading = Reading(node.name, container=node.place.container)
    try:
        preflight.gather(node, cfg, image)
        reading.address, reading.facts, reading.drivers = node.address, node.facts, node.facts.drivers
        reading.clock_offset, reading.clock_error = read_clock(node.runner)
        r = node.runner.run(doctor_script(node.place, cfg.workspace_path), timeout=DOCTOR_TIMEOUT_S)
        if f"{MARK}end" not in lines(r.stdout):
            raise KitError("kit's doctor script was cut short", host=node.name, output_tail=r.tail())
        parse_doctor(reading, r.stdout)
    except KitError as e:
        reading.error = e.message + (f": {lines(e.output_tail)[-1]}" if e.output_tail else "")
    except Exception as e:  # noqa: BLE001 - a dropped connection, odd output: this host's finding, not the end
        reading.error = f"{type(e).__name__}: {e}"
    return reading


PAIR = "pair "


def pairs_script(targets: list[str]) -> str:
    """Run in a container: SSH to every target at once on the cluster's settings (its ssh config: port, key,
    pinned host keys); per target a `@@kit pair ADDRESS EXIT` line and the tail of what ssh said."""
    names = " ".join(shlex.quote(t) for t in targets)
    return (f'd=$(mktemp -d) && for t in {names}; do (timeout {PAIR_TIMEOUT_S} ssh -o BatchMode=yes '
            f'-o ConnectTimeout={PAIR_TIMEOUT_S // 2} "$t" true > "$d/$t.out" 2>&1; echo $? > "$d/$t.rc") & done; '
            f'wait; for t in {names}; do echo "{MARK}{PAIR}$t $(cat "$d/$t.rc")"; tail -n 2 "$d/$t.out"; done; '
            'rm -rf "$d"')


def parse_pairs(text: str) -> dict[str, tuple[int, str]]:
    """target address -> (ssh's exit code, the last line it said). Pure."""
    found = {}
    for name, body in sections(text).items():
        if name.startswith(PAIR):
            target, _, code = name[len(PAIR):].partition(" ")
            said = [l for l in lines(body) if l.strip()]
            found[target] = (number(code, -1), said[-1] if said else "")
    return found


def read_pairs(node: Node, targets: list[str]) -> dict[str, tuple[int, str]]:
    r = node.runner.run(command(exec_argv(node.place.container, ["sh", "-c", pairs_script(targets)])),
                        timeout=PAIR_TIMEOUT_S * 3)
    found = parse_pairs(r.stdout)
    unread = (r.exit_code, lines(r.tail())[-1] if r.tail() else "no answer")  # the script itself failed
    return {t: found.get(t, unread) for t in targets}


# ---------------------------------------------------------------- judging

def _host_checks(r: Reading, cfg: ClusterConfig, state: st.ClusterState | None, gpu: bool,
                 flavor: str = "gpu", cuda: str | None = None) -> list[Finding]:
    f = r.facts
    out = [Finding(r.name, "ssh", OK, f"reached from this machine as root (as {r.address})"), _docker(r.name, f)]
    out.append(_disk(r.name, "docker disk", f"in Docker's data root {f.docker_root or '?'}", f.free_bytes,
                     "free space there (`docker system prune`, old images)"))
    if gpu:
        out += _gpu(r, state is not None) + _cuda(r, flavor, cuda)
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


def _flavor(requested: str, where: str, readings: list[Reading]) -> tuple[str, list[Finding]]:
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
    seen = [r for r in readings if r.facts]
    addresses = [r.address for r in seen]
    chosen = {r.name: cluster_nic(r.nics, addresses) for r in seen}
    names = {n.name for n in chosen.values() if n}
    mtus = [n.mtu for n in chosen.values() if n and n.mtu]
    usual = majority(mtus)
    out = []
    for r in seen:
        n = chosen[r.name]
        if n is None:
            out.append(Finding(r.name, "nic", FAIL, f"no interface here is on a subnet that holds every cluster "
                               f"address ({', '.join(addresses)})", "put the hosts on one subnet, or list them "
                               "in hosts.txt by their addresses on it"))
            continue
        text = (f"{n.name} ({n.address}/{n.prefix}), MTU {n.mtu or '?'}, "
                + (f"{n.speed_mbps} Mb/s" if n.speed_mbps else "speed not reported"))
        if n.mtu and len(set(mtus)) > 1 and n.mtu != usual:
            others = usual or ", ".join(str(c.mtu) for h, c in chosen.items() if h != r.name and c and c.mtu)
            out.append(Finding(r.name, "nic", FAIL, f"{text}; the other hosts' MTU is {others}: large messages "
                               "stall between them", f"set the same MTU on every host (ip link set dev {n.name} "
                               f"mtu N, and in the host's network configuration)"))
        elif len(names) > 1:
            out.append(Finding(r.name, "nic", WARN, f"{text}; the hosts' names for it differ "
                               f"({', '.join(sorted(names))})", "nothing to do for kit (it passes every name to "
                               "Horovod, NCCL and Gloo); scripts of your own must not assume one name"))
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


# ---------------------------------------------------------------- the whole run

@dataclass
class Report:
    findings: list[Finding]
    hosts: list[str]

    @property
    def failed(self) -> int:
        return sum(f.level == FAIL for f in self.findings)

    @property
    def warned(self) -> int:
        return sum(f.level == WARN for f in self.findings)

    def of(self, host: str) -> list[Finding]:
        return [f for f in self.findings if f.host == host]


def examine(nodes: list[Node], cfg: ClusterConfig, image: str, state: st.ClusterState | None, flavor: str,
            owner, *, cuda: str | None = None, where: str = "build.flavor", slurm: bool = False) -> Report:
    """Read every host at once, then judge. `state`: the cluster as `up` recorded it (None: hosts before `up`);
    `flavor`: the image's, or auto / tf (decided from the hosts' GPUs, as `where` asks); `cuda`: the gpu flavor's
    CUDA line; `slurm`: kit.yaml has a slurm section (the Slurm section runs then, and wherever the primary has
    slurm.conf)."""
    readings = fan_out("reading the hosts", nodes, lambda n: read_host(n, cfg, image), lambda n: n.name)
    findings = [Finding(r.name, "ssh", FAIL, f"cannot reach or read the host: {r.error}",
                        "check that the host is up and that `ssh` to it works as in hosts.txt")
                for r in readings if r.error]
    flavor, mixed = _flavor(flavor, where, readings)
    findings += mixed
    gpu = uses_gpus(flavor)
    up = state is not None
    for r in readings:
        if r.error:
            continue
        if other := r.facts.foreign(cfg.name, owner):  # nothing of theirs is read as this cluster's
            findings.append(Finding(r.name, "owner", FAIL, f"a cluster named {cfg.name} of {other} is here; kit "
                                    "leaves another's cluster alone", "choose another cluster name (--name or "
                                    "cluster.name in kit.yaml), or ask its owner to run kit down"))
            r.container_pidns, r.shm_bytes, r.memlock, r.workspace_free = "", None, "", None
        findings += _host_checks(r, cfg, state, gpu, flavor, cuda)
        if r.facts.docker_version:
            findings.append(_port(r, cfg.ssh_port, up))
        if up and (ports := _job_ports(r)):
            findings.append(ports)
        if up and r.facts.docker_version:
            mine = bool(r.facts.container and r.facts.container.cluster == cfg.name
                        and r.facts.container.owner == owner)
            findings += _container(r, state, cfg, mine, gpu)
    findings += _clocks(readings) + _nics(readings) + _drivers(readings)
    if up:
        reachable = [n for n, r in zip(nodes, readings) if not r.error and not r.container_error
                     and r.facts.container and r.facts.container.status == "running"]
        findings += _mesh(reachable, cfg.ssh_port) + _workspace(reachable, state, cfg)
    from kit import doctor_slurm  # (it builds on this module's Finding and Reading)
    findings += doctor_slurm.examine(nodes, readings, slurm)
    order = {n.name: i for i, n in enumerate(nodes)}
    findings.sort(key=lambda f: order.get(f.host, len(order)))  # stable: each host's checks in the order made
    return Report(findings, [n.name for n in nodes])


def _mesh(nodes: list[Node], port: int) -> list[Finding]:
    if len(nodes) < 2:
        return []
    addresses = {n.address: n.name for n in nodes}
    seen = fan_out("SSH between the containers", nodes,
                   lambda n: read_pairs(n, [a for a in addresses if a != n.address]), lambda n: n.name)
    return judge_pairs({n.name: r for n, r in zip(nodes, seen)}, addresses, port)


def _workspace(nodes: list[Node], state: st.ClusterState, cfg: ClusterConfig) -> list[Finding]:
    """With storage nfs or sshfs, a file the primary's container writes must be seen by every other container."""
    if len(nodes) < 2 or state.storage == "copy" or not nodes[0].host.primary:
        return []
    try:
        check.shared_workspace(nodes[0], nodes[1:], cfg.workspace_path)
        failures: dict[str, KitError] = {}
    except HostsFailed as e:
        failures = e.failures
    except KitError as e:
        return [Finding(nodes[0].name, "workspace", FAIL, e.message, e.hint or "")]
    return [Finding(n.name, "workspace", FAIL, failures[n.name].message, failures[n.name].hint or "")
            if n.name in failures else
            Finding(n.name, "workspace", OK, f"{cfg.workspace_path} is shared ({state.storage}): a file the "
                    "primary wrote is seen here")
            for n in nodes[1:]]

