"""`kit doctor`'s readings: what is read on each host, the scripts that read it, and the pure parsers of what they
print.

Each host is read with few commands (kit's facts script, a doctor script on the host and in its container, the clock);
a container's lines reach the parsers with INNER in front, so that nothing a job prints passes for the host's. Nothing
on a host is changed.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import time
from dataclasses import dataclass, field

from kit.jobs.commands.docker import command, exec_argv
from kit.config.settings import ClusterConfig
from kit.errors import KitError
from kit.doctor.gpufacts import SCRIPT as GPU_HEALTH_SCRIPT, GpuHealth, parse_health
from kit.hostoutput import INNER, MARK, PREFIX_INNER, inner_lines, is_number, lines, number, sections
from kit.network.links import NAME
from kit.cluster.place import Place
from kit.runners import Runner
from kit.cluster.steps import preflight
from kit.cluster.steps.facts import HostFacts
from kit.cluster.steps.node import Node

PAIR_TIMEOUT_S = 20                       # one SSH between two containers, connection and handshake included
DOCTOR_TIMEOUT_S = 90                     # nvidia-smi and the kernel's log are bounded within it (gpufacts)
CONTAINER_MAX = 1 << 20                   # bytes of the container's own section that doctor reads


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
    hint: str = ""                      # the fix that came with the error, where kit knows it
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
    container_rdma: tuple[str, ...] = ()  # the files of /dev/infiniband in the container
    container_verbs: bool | None = None   # the image has libibverbs (None: not read)
    ib_disabled: str = ""               # NCCL_IB_DISABLE as the container sets it (its environment, /etc/nccl.conf)
    gpu_health: GpuHealth | None = None  # the GPUs' memory errors and Xids, read on the host (None: not read)


def doctor_script(place: Place, workspace: str, gpus: bool = False) -> str:
    """A POSIX sh script for the host, in `@@kit NAME` sections: its NICs (MTU, speed), its listening sockets with
    the process of each and the container's pid namespace (to tell the container's from another program's), with
    `gpus` (the host has NVIDIA GPUs) their health (kit.doctor.gpufacts), and from inside the container: /dev/shm,
    the memlock limit, free space in the workspace, its GPUs."""
    q = shlex.quote
    nics = ('for d in /sys/class/net/*; do echo "${d##*/} $(cat "$d/mtu" 2>/dev/null || echo ?) '
            '$(cat "$d/speed" 2>/dev/null || echo ?)"; done; ip -o -4 addr show 2>/dev/null')
    inner = "; ".join([
        f"echo '{MARK}shm'; df -Pk /dev/shm | tail -n 1",
        f"echo '{MARK}memlock'; ulimit -l",
        f"echo '{MARK}wsdf'; df -Pk {q(workspace)} 2>/dev/null | tail -n 1",
        f"echo '{MARK}cgpus'; nvidia-smi -L 2>/dev/null",
        f"echo '{MARK}crdma'; ls /dev/infiniband 2>/dev/null",
        f"echo '{MARK}verbs'; ls /usr/lib/*/libibverbs.so.1 /usr/lib64/libibverbs.so.1 2>/dev/null | head -n 1",
        f"echo '{MARK}ibdisable'; grep -hs '^[[:space:]]*NCCL_IB_DISABLE=' /etc/nccl.conf; "
        "printenv NCCL_IB_DISABLE | sed 's/^/NCCL_IB_DISABLE=/'",
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
        *([GPU_HEALTH_SCRIPT] if gpus else []),
        f"echo '{MARK}cpidns'; pid=$(docker inspect --format '{{{{.State.Pid}}}}' {q(place.container)} 2>/dev/null) "
        "&& [ \"$pid\" -gt 0 ] && readlink /proc/$pid/ns/pid",
        # What the container prints is the job's to forge: each of its lines goes with INNER in front (and a last line
        # it leaves open is closed, so that the end mark starts a line of its own)
        # (what the container prints is bounded: the host's end mark after it always reaches kit)
        f"echo '{MARK}container'; docker exec {q(place.container)} sh -c {q(inner)} 2>&1 | head -c {CONTAINER_MAX} "
        f"| {PREFIX_INNER}; echo",
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
    host = "\n".join(l for l in lines(text) if not l.startswith(INNER))
    s, c = sections(host), sections("\n".join(inner_lines(text)))
    reading.gpu_health = parse_health(host)
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
    reading.container_rdma = tuple(l.strip() for l in lines(c.get("crdma", "")) if NAME.fullmatch(l.strip()))
    reading.container_verbs = bool(c.get("verbs", "").strip())
    said = [l.strip() for l in lines(c.get("ibdisable", "")) if re.fullmatch(r"NCCL_IB_DISABLE=[0-9A-Za-z]{1,8}",
                                                                            l.strip())]
    reading.ib_disabled = said[-1] if said and said[-1].split("=", 1)[1] not in ("0", "") else ""


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
        r = node.runner.run(doctor_script(node.place, cfg.workspace_path, gpus=node.facts.nvidia_gpus > 0),
                            timeout=DOCTOR_TIMEOUT_S)
        if f"{MARK}end" not in lines(r.stdout):
            raise KitError("kit's doctor script was cut short", host=node.name, output_tail=r.tail())
        parse_doctor(reading, r.stdout)
    except KitError as e:
        reading.error = e.message + (f": {lines(e.output_tail)[-1]}" if e.output_tail else "")
        reading.hint = e.hint or ""
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
