"""What a host's network looks like: each interface (its name, addresses, MTU, reported speed, state and kind) and
each RDMA port (InfiniBand or RoCE: state, rate, the interface it carries), read with a few lines of sh (SCRIPT) and
parsed by a pure function (parse).

Standard library only: kit reads a host with SCRIPT in its facts, and the network survey (kit.network.survey), shipped
to the containers and to a Slurm job's tasks, reads where it runs with the same lines. KIT_SYSFS and KIT_DEVFS move
/sys and /dev (the tests read trees recorded from machines with RDMA ports, as the GPU facts read a recorded
nvidia-smi).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass

MARK = "@@kit-net "  # a line that starts one of SCRIPT's sections

# Each interface: name, MTU, speed (Mb/s; unreadable on a virtual or down link), operstate, ARPHRD type; its addresses
# as `ip -o addr` gives them; each RDMA port: device|port|state|physical state|link layer|rate|the interface it
# carries (RoCE: its GID table's; InfiniBand: the IPoIB interface of the device whose dev_port is the port's); then
# the RDMA device files a container would need.
SCRIPT = f"""\
s=${{KIT_SYSFS:-/sys}}
echo '{MARK}links'
for d in "$s"/class/net/*; do
  [ -e "$d/mtu" ] || continue
  echo "${{d##*/}} $(cat "$d/mtu" 2>/dev/null || echo -) $(cat "$d/speed" 2>/dev/null || echo -) \
$(cat "$d/operstate" 2>/dev/null || echo -) $(cat "$d/type" 2>/dev/null || echo -)"
done
echo '{MARK}addr'
ip -o addr show 2>/dev/null || command -v ip >/dev/null 2>&1 || echo '{MARK}noip'
echo '{MARK}rdma'
for p in "$s"/class/infiniband/*/ports/*; do
  [ -e "$p/state" ] || continue
  dev=${{p%/ports/*}}; dev=${{dev##*/}}; n=${{p##*/}}
  nd=$(cat "$p/gid_attrs/ndevs/0" 2>/dev/null)
  if [ -z "$nd" ]; then
    for c in "$s/class/infiniband/$dev/device/net"/*; do
      [ -e "$c" ] && [ "$(cat "$c/dev_port" 2>/dev/null || echo 0)" = "$((n - 1))" ] && nd=${{c##*/}} && break
    done
  fi
  echo "$dev|$n|$(cat "$p/state" 2>/dev/null)|$(cat "$p/phys_state" 2>/dev/null)|\
$(cat "$p/link_layer" 2>/dev/null)|$(cat "$p/rate" 2>/dev/null)|$nd"
done
echo '{MARK}devices'
ls "${{KIT_DEVFS:-/dev}}/infiniband" 2>/dev/null || true
"""

# ARPHRD_* of /sys/class/net/*/type that kit names
KINDS = {"1": "ether", "32": "infiniband", "772": "loopback", "65534": "none"}
# A name as Linux allows it (15 bytes, no slash, no white space), and as kit passes it on to launchers
NAME = re.compile(r"[A-Za-z0-9_.:@+-]{1,15}")
_ADDR = re.compile(r"^[0-9]+:\s+(\S+)\s+(inet6?)\s+([0-9a-fA-F.:]+)(?:/([0-9]+)|\s+peer\s+([0-9a-fA-F.:]+)/([0-9]+))(?=\s|$)")
_RATE = re.compile(r"([0-9.]+)\s*Gb/sec")


@dataclass(frozen=True)
class Address:
    address: str
    prefix: int
    peer: str = ""          # a point-to-point link's other end

    @property
    def ip(self):
        return ipaddress.ip_address(self.address)

    @property
    def network(self):
        return ipaddress.ip_network(f"{self.address}/{self.prefix}", strict=False)


@dataclass(frozen=True)
class Port:
    """An RDMA port, as /sys/class/infiniband shows it."""

    device: str             # mlx5_0
    port: int
    state: str              # ACTIVE, DOWN, INIT, ARMED
    physical: str           # LinkUp, Disabled, Polling...
    layer: str              # InfiniBand, or Ethernet (RoCE)
    gbits: float | None     # its rate
    netdev: str = ""        # the interface it carries ("": none known)

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def label(self) -> str:
        """As NCCL_IB_HCA names it."""
        return f"{self.device}:{self.port}"

    @property
    def kind(self) -> str:
        return "RoCE" if self.layer == "Ethernet" else self.layer or "RDMA"

    def describe(self) -> str:
        rate = f"{self.gbits:g} Gb/s" if self.gbits else "no rate"
        return f"{self.label} {self.kind} {self.state or '?'} {rate}" + (f" ({self.netdev})" if self.netdev else "")


@dataclass(frozen=True)
class Link:
    """A network interface."""

    name: str
    mtu: int | None
    mbps: int | None        # the speed it reports (None: it reports none, as virtual links and down ones)
    state: str              # operstate: up, down, unknown (some virtual links), lowerlayerdown...
    kind: str               # ether, infiniband, loopback, none, or the ARPHRD number
    addresses: tuple[Address, ...] = ()

    @property
    def usable(self) -> bool:
        """Carries traffic now: up, or a link that does not say (operstate unknown)."""
        return self.state in ("up", "unknown")


@dataclass(frozen=True)
class Reading:
    """A host's network, as SCRIPT read it."""

    links: tuple[Link, ...] = ()
    ports: tuple[Port, ...] = ()
    devices: tuple[str, ...] = ()   # the files under /dev/infiniband (uverbs0, rdma_cm...)
    noip: bool = False              # `ip` is not installed: the addresses could not be read

    def link(self, name: str) -> Link | None:
        return next((l for l in self.links if l.name == name), None)

    def ports_of(self, name: str) -> tuple[Port, ...]:
        """The RDMA ports that carry interface `name`."""
        return tuple(p for p in self.ports if p.netdev == name)

    def rails(self, name: str) -> tuple[str, ...]:
        """NCCL_IB_HCA's ports for a training network over interface `name`: where an active RDMA port carries it,
        every active port of its kind here (a GPU server's rails: 8 InfiniBand ports, of which 1 or 2 carry an IP
        address), so that NCCL keeps them all but those of another fabric (a RoCE storage network beside InfiniBand)."""
        kinds = {p.layer for p in self.ports_of(name) if p.active}
        return tuple(sorted(p.label for p in self.ports if p.active and p.layer in kinds))

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Reading":
        """What as_dict made (sent by another host in the survey): each value checked as parse checks it."""
        links = tuple(Link(_name(l["name"]), _int(l["mtu"]), _int(l["mbps"]), str(l["state"])[:20],
                           str(l["kind"])[:12], tuple(Address(str(ipaddress.ip_address(a["address"])),
                                                              int(a["prefix"]) % 129,
                                                              str(ipaddress.ip_address(a["peer"])) if a["peer"] else "")
                                                      for a in l["addresses"]))
                      for l in data.get("links", []))
        ports = tuple(Port(_name(p["device"], 64), int(p["port"]), str(p["state"])[:20], str(p["physical"])[:20],
                           str(p["layer"])[:20], float(p["gbits"]) if p["gbits"] else None,
                           _name(p["netdev"]) if p["netdev"] else "")
                      for p in data.get("ports", []))
        return cls(links, ports, tuple(_name(d, 64) for d in data.get("devices", [])), data.get("noip") is True)


def _name(text: object, size: int = 15) -> str:
    text = str(text)
    if not re.fullmatch(r"[A-Za-z0-9_.:@+-]{1,%d}" % size, text):
        raise ValueError(f"{text[:40]!r} is not a name kit takes")
    return text


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.split("\n"):
        if line.startswith(MARK):
            current = out.setdefault(line[len(MARK):].strip(), [])
        elif current is not None and line.strip():
            current.append(line)
    return out


def _number(text: str) -> int | None:
    return int(text) if re.fullmatch(r"[0-9]+", text) else None


def parse(text: str) -> Reading:
    """SCRIPT's output -> Reading. Lines that are not what SCRIPT prints are left out (a name Linux would not give, a
    negative speed, an address that is none)."""
    s = _sections(text)
    addresses: dict[str, list[Address]] = {}
    for line in s.get("addr", []):
        m = _ADDR.match(line)
        if not m:
            continue
        name = m[1].split("@", 1)[0]
        try:
            if m[5]:  # inet A peer B/32: the prefix is the peer's
                address = Address(str(ipaddress.ip_address(m[3])), int(m[6]), str(ipaddress.ip_address(m[5])))
            else:
                address = Address(str(ipaddress.ip_address(m[3])), int(m[4]))
        except ValueError:
            continue
        addresses.setdefault(name, []).append(address)
    links = []
    for line in s.get("links", []):
        parts = line.split()
        if len(parts) != 5 or not NAME.fullmatch(parts[0]):
            continue
        name, mtu, speed, state, kind = parts
        mbps = _number(speed)
        links.append(Link(name, _number(mtu), mbps or None, state.lower(), KINDS.get(kind, kind),
                          tuple(addresses.get(name, ()))))
    known = {l.name for l in links}
    links += [Link(name, None, None, "unknown", "?", tuple(found)) for name, found in addresses.items()
              if name not in known and NAME.fullmatch(name)]  # a /sys that does not show it (another namespace's)
    return Reading(tuple(links), tuple(p for p in map(_port, s.get("rdma", [])) if p),
                   tuple(d.strip() for d in s.get("devices", []) if NAME.fullmatch(d.strip())), "noip" in s)


def _port(line: str) -> Port | None:
    parts = line.split("|")
    if len(parts) != 7 or not NAME.fullmatch(parts[0]) or not parts[1].isdigit():
        return None
    device, port, state, physical, layer, rate, netdev = (p.strip() for p in parts)
    gbits = _RATE.search(rate)
    return Port(device, int(port), state.partition(":")[2].strip() or state, physical.partition(":")[2].strip()
                or physical, layer, float(gbits[1]) if gbits else None, netdev if NAME.fullmatch(netdev) else "")
