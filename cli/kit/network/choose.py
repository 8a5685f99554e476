"""Which network the ranks train over: the candidates that the hosts' interfaces make, and the choice among those
that join every host. Pure, standard library only (shipped in the survey's script, kit.network.survey).

A candidate is a subnet on which two hosts or more have an address of their own, on a link that is up: never the
loopback interface, link-local, a point-to-point /32, IPv6 (kit's launchers talk IPv4), or an address that several hosts share
(docker0's 172.17.0.1 on every host joins nothing). Names may differ from host to host: each host's own interface on
the subnet is its member. The hosts.txt addresses (SSH's) are a candidate too: their subnet, or, where they are on
several subnets that routers join, each host's interface that holds its own ("routed").

Of the candidates that join every host (and whose every pair answered the survey's connection), the fastest wins:
by the speed the links report (the slowest member's), and, where that is absent or equal at the top, by the figure
of a short bandwidth probe; a tie goes to the hosts.txt network. cluster.network (a subnet, or `ssh`) overrides.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass, field

from kit.network.links import NAME, Reading  # shipped together

ROUTED = "routed"     # the hosts.txt addresses' network where they are on no one subnet
SSH = "ssh"           # cluster.network: train over the hosts.txt network, as kit did before it chose
TIE = 0.9             # probe figures within 10% of each other are a tie
NO_ADDRESS = "no address on it"
RAIL = re.compile(r"[A-Za-z0-9_.-]{1,64}:[0-9]{1,3}")   # an RDMA port as NCCL_IB_HCA names it


@dataclass(frozen=True)
class Member:
    """A host's interface on a candidate network."""

    iface: str
    address: str
    mbps: int | None = None
    mtu: int | None = None
    rdma: tuple[str, ...] = ()    # NCCL_IB_HCA's ports (mlx5_0:1): where an active one carries it, its kind's (rails)


@dataclass
class Candidate:
    network: str                                   # 10.232.0.0/24, or ROUTED
    members: dict[str, Member] = field(default_factory=dict)   # host -> its interface on it
    missing: dict[str, str] = field(default_factory=dict)      # host -> why it is not on it
    ssh: bool = False                              # the hosts.txt addresses are on it
    failed: dict[str, str] = field(default_factory=dict)       # "a -> b" -> what the survey's connection met
    gbits: float | None = None                     # the bandwidth probe's figure, where one ran

    @property
    def joins(self) -> bool:
        return not self.missing and not self.failed

    @property
    def mbps(self) -> int | None:
        """The speed of its slowest member's link; None where any does not report one."""
        speeds = [m.mbps for m in self.members.values()]
        return min(speeds) if speeds and None not in speeds else None

    @property
    def names(self) -> str:
        """Its interfaces' names, each once: `fabric0`, or `ens1f0 / enp65s0` where hosts name it differently."""
        return " / ".join(dict.fromkeys(m.iface for m in self.members.values()))

    def label(self) -> str:
        return f"{'the hosts.txt addresses (routed)' if self.network == ROUTED else self.network} ({self.names})"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Candidate":
        return cls(**{**data, "members": _members(data["members"])})

    def misses(self) -> str:
        """The hosts it does not join, and why: `h2 (fabric0 is down there), h3 (no answer from h1)`."""
        why = dict(self.missing)
        for pair, error in self.failed.items():
            target = pair.split(" -> ")[1]
            why.setdefault(target, f"no answer from {pair.split(' -> ')[0]}: {error}")
        return ", ".join(f"{host} ({reason})" for host, reason in why.items())


@dataclass
class Decision:
    network: str                            # the chosen candidate's network (10.232.0.0/24, or ROUTED)
    members: dict[str, Member]              # host -> the interface and address its ranks use
    how: str                                # why this one, in words
    gbits: float | None                     # its speed: the probe's figure, or the links' reported speed
    measured: bool = False                  # gbits is the probe's
    ssh: bool = False                       # it is the hosts.txt network
    ssh_network: str = ""                   # the hosts.txt network, for the summary
    unjoined: list[str] = field(default_factory=list)   # candidates that miss hosts, each with them
    notes: list[str] = field(default_factory=list)      # what was left out, and why
    candidates: list[dict] = field(default_factory=list)  # every candidate as the survey found it (Candidate.as_dict)
    warnings: list[str] = field(default_factory=list)   # what the user should know of it (said at kit up)

    def summary(self, hosts: int, word: str = "hosts", home: str = "hosts.txt", reach: str = "ssh",
                earlier: bool = False) -> str:
        """`training network: 10.232.0.0/24 (fabric0), 0.95 Gbit/s measured, 3 of 3 hosts; ssh over ...`, where
        home names the addresses kit was given (a Slurm job: NodeAddr) and reach what goes over them; earlier: the
        choice is one an earlier survey made (the hosts' networks read the same since)."""
        speed = (f"{self.gbits:.2f} Gbit/s measured" + (" before" if earlier else "") if self.measured else
                 f"{self.gbits:g} Gbit/s" if self.gbits else "speed not reported")
        where = f"the {home} addresses (routed)" if self.network == ROUTED else self.network
        names = " / ".join(dict.fromkeys(m.iface for m in self.members.values()))
        tail = f"the {home} network" if self.ssh else f"{reach} over {self.ssh_network or f'the {home} addresses'}"
        rails = sorted({len(m.rdma) for m in self.members.values()})
        nccl = f", NCCL over {'-'.join(map(str, rails))} RDMA port{'s' if rails[-1] > 1 else ''} a host" \
            if rails and rails[-1] else ""
        return (f"training network: {where} ({names}), {speed}, {len(self.members)} of {hosts} {word}{nccl}; "
                f"{tail}" + (f" ({self.how.replace('hosts.txt', home)})" if self.how else ""))

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Decision":
        return cls(**{**data, "members": _members(data["members"])})

    def found(self) -> list[Candidate]:
        return [Candidate.from_dict(c) for c in self.candidates]


def _members(data: dict) -> dict[str, Member]:
    return {str(h): Member(**{**m, "rdma": tuple(m.get("rdma", ()))}) for h, m in data.items()}


class Refused(Exception):
    """cluster.network names a network that does not join every host (or none at all); the message says which
    hosts it misses."""


def candidates(readings: dict[str, Reading], ssh: dict[str, str]) -> tuple[list[Candidate], list[str]]:
    """The candidate networks of these hosts (in their order), and what was left out, in words.
    readings: host -> its network; ssh: host -> the address kit reaches it at (hosts.txt's)."""
    counts: dict[str, list[str]] = {}
    for host, r in readings.items():
        for link in r.links:
            for a in link.addresses:
                counts.setdefault(a.address, []).append(host)
    notes: list[str] = []
    owned: dict[str, list[tuple]] = {}   # host -> [(link, address)] that may make a candidate
    for host, r in readings.items():
        owned[host] = []
        for link in r.links:
            if link.kind == "loopback":
                continue
            for a in link.addresses:
                why = _left_out(a, counts[a.address])
                if why:
                    shared = sorted(set(counts[a.address]), key=list(readings).index)
                    where = f"on {', '.join(shared)}" if len(shared) > 1 else f"on {host}"
                    notes.append(f"{a.address} ({link.name}) {where}: {why}")
                else:
                    owned[host].append((link, a))
    networks: dict[str, ipaddress.IPv4Network] = {}
    for host, found in owned.items():
        for _, a in found:
            networks.setdefault(str(a.network), a.network)
    found_candidates = []
    for name, net in sorted(networks.items(), key=lambda kv: (kv[1].network_address, kv[1].prefixlen)):
        c = _candidate(name, net, owned, readings)
        if len(c.members) + sum(r != NO_ADDRESS for r in c.missing.values()) >= 2:  # two hosts have an address on it
            found_candidates.append(c)
    found_candidates = _distinct(found_candidates, owned)
    _mark_ssh(found_candidates, owned, readings, ssh)
    return found_candidates, _once(notes)


def _left_out(a, hosts: list[str]) -> str:
    ip = a.ip
    if ip.version == 6:
        return "IPv6 (kit's launchers talk IPv4)"
    if ip.is_link_local:
        return "link-local"
    if a.peer or a.prefix == 32:
        return "a point-to-point /32, which no other host shares"
    if len(set(hosts)) > 1:
        return "an address several hosts have joins nothing (as docker0's 172.17.0.1)"
    return ""


def _candidate(name: str, net, owned: dict[str, list[tuple]], readings: dict[str, Reading]) -> Candidate:
    c = Candidate(name)
    for host, found in owned.items():
        on = [(link, a) for link, a in found if a.ip in net]
        up = [(link, a) for link, a in on if link.usable]
        if up:
            link, a = up[0]
            rate = max([int(p.gbits * 1000) for p in readings[host].ports_of(link.name) if p.active and p.gbits],
                       default=0)
            c.members[host] = Member(link.name, a.address, max(link.mbps or 0, rate) or None, link.mtu,
                                     readings[host].rails(link.name))
        elif on:
            c.missing[host] = f"{on[0][0].name} is {on[0][0].state} there"
        else:
            c.missing[host] = NO_ADDRESS
    return c


def _distinct(found: list[Candidate], owned: dict[str, list[tuple]]) -> list[Candidate]:
    """One candidate a set of members: hosts that give one subnet different prefixes (/24 here, /16 there) make
    several networks of the same addresses; the one most hosts declare stays."""
    def declared(c: Candidate) -> int:
        return sum(any(str(a.network) == c.network for _, a in found_) for found_ in owned.values())
    kept: dict[tuple, Candidate] = {}
    for c in found:
        key = tuple(sorted((h, m.address) for h, m in c.members.items()))
        if key not in kept or declared(c) > declared(kept[key]):
            kept[key] = c
    return [c for c in found if c in kept.values()]


def _mark_ssh(found: list[Candidate], owned, readings: dict[str, Reading], ssh: dict[str, str]) -> None:
    """The candidate that holds every hosts.txt address; else the routed one: each host's interface with its own."""
    for c in found:
        if c.members and all(c.members.get(h) and c.members[h].address == ssh.get(h) for h in readings):
            c.ssh = True
            return
    routed = Candidate(ROUTED, ssh=True)
    for host, r in readings.items():
        link = next((l for l in r.links if any(a.address == ssh.get(host) for a in l.addresses)), None)
        if r.noip:
            routed.missing[host] = "kit cannot read its interfaces: `ip` (iproute2) is not installed there"
        elif link is None:
            routed.missing[host] = f"its address {ssh.get(host)} is on none of its interfaces (behind NAT?)"
        else:
            routed.members[host] = Member(link.name, ssh[host], link.mbps, link.mtu, r.rails(link.name))
    found.append(routed)


def _once(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def unaddressed_rdma(readings: dict[str, Reading], chosen: Decision) -> list[str]:
    """Where the training network has no RDMA port but hosts have active ones (InfiniBand without IPoIB addresses):
    NCCL (in a gpu image) moves its data over those ports all the same, and only its setup over the network."""
    if any(m.rdma for m in chosen.members.values()):
        return []
    found = {host: [p.label for p in r.ports if p.active] for host, r in readings.items()}
    found = {host: ports for host, ports in found.items() if ports}
    if not found:
        return []
    where = "; ".join(f"{host}: {', '.join(ports)}" for host, ports in found.items())
    return [f"active RDMA ports that carry no network of the hosts ({where}): NCCL, in a gpu image, moves its data "
            "over them, and only its setup over the training network"]


def checked(d: Decision, hosts: list[str]) -> Decision:
    """A decision whose every host is one of `hosts` (all of them), every interface a name, every address IPv4, every
    RDMA port mlx5_0:1's form: it came from another process (a container's root could have written it). Raises
    ValueError."""
    if set(d.members) != set(hosts):
        raise ValueError(f"members {sorted(d.members)} are not the hosts {sorted(hosts)}")
    for m in d.members.values():
        if not NAME.fullmatch(m.iface) or ipaddress.ip_address(m.address).version != 4 or \
                not all(RAIL.fullmatch(p) for p in m.rdma):
            raise ValueError(f"{m.iface!r} {m.address!r} is not an interface and an IPv4 address")
    if d.network != ROUTED:
        ipaddress.ip_network(d.network)
    if d.gbits is not None and not isinstance(d.gbits, (int, float)):
        raise ValueError("its speed is not a number")
    return d


def to_probe(found: list[Candidate]) -> list[str]:
    """The networks whose speed a bandwidth probe must tell apart: of those that join every host, the ones at the
    top of the reported speeds, where more than one is there or a speed is not reported. Empty: no probe."""
    joined = [c for c in found if c.joins]
    if len(joined) < 2:
        return []
    known = [c.mbps for c in joined if c.mbps is not None]
    best = max(known, default=None)
    top = [c for c in joined if c.mbps is None or c.mbps == best]
    return [c.network for c in top] if len(top) > 1 else []


def decide(found: list[Candidate], setting: str | None = None, notes: list[str] = ()) -> Decision:
    """The training network. setting: cluster.network (a subnet, or SSH), None: choose. Raises Refused where the
    setting names a network that misses a host, or where no network joins every host."""
    ssh = next(c for c in found if c.ssh)
    unjoined = [f"{c.label()} misses {c.misses()}" for c in found if not c.joins and c.members]
    if len(ssh.members) + len(ssh.missing) == 1:  # one host: its ranks talk among themselves
        return _decision(ssh, ssh, "one host", found, [], notes)
    if setting == SSH:
        if ssh.missing:
            raise Refused(f"the hosts.txt addresses do not join every host: {ssh.misses()}")
        return _decision(ssh, ssh, "cluster.network: ssh", found, unjoined, notes)
    if setting:
        wanted = ipaddress.ip_network(setting, strict=False)
        c = next((c for c in found if c.network != ROUTED and ipaddress.ip_network(c.network) == wanted), None) \
            or next((c for c in found if c.network != ROUTED and ipaddress.ip_network(c.network).subnet_of(wanted)
                     and c.joins), None)
        if c is None:
            raise Refused(f"cluster.network {wanted}: no two hosts have an address of their own on it")
        if not c.joins:
            raise Refused(f"cluster.network {wanted} does not join every host: it misses {c.misses()}")
        return _decision(c, ssh, "cluster.network", found, unjoined, notes)
    joined = [c for c in found if c.joins]
    if not joined:
        raise Refused("no network joins every host: " + "; ".join(unjoined or ["the hosts share no subnet"]))
    probed = [c for c in joined if c.gbits is not None]
    if probed:
        best = max(c.gbits for c in probed)
        top = sorted((c for c in probed if c.gbits >= best * TIE), key=_preference)
        others = ", ".join(f"{c.network} {c.gbits:.2f}" for c in probed if c is not top[0])
        how = (f"measured, against {others} Gbit/s" if len(top) == 1 else
               f"as fast as {', '.join(c.network for c in top[1:])} as measured; " +
               ("ties go to the hosts.txt network" if top[0].ssh else "more RDMA ports, then a larger MTU, then the "
                                                                       "lower address"))
        return _decision(top[0], ssh, how, found, unjoined, notes, measured=True)
    best = sorted(joined, key=lambda c: (-(c.mbps or 0), _preference(c)))[0]
    how = ("the only network that joins every host" if len(joined) == 1 else
           f"its links report the most, against {', '.join(f'{c.network} {_speed(c.mbps)}' for c in joined if c is not best)}")
    return _decision(best, ssh, how, found, unjoined, notes)


def _preference(c: Candidate) -> tuple:
    """Among equals: the hosts.txt network, then more active RDMA ports, a larger MTU, the lower address."""
    mtu = min((m.mtu or 0 for m in c.members.values()), default=0)
    rdma = sum(len(m.rdma) for m in c.members.values())
    address = ipaddress.ip_network(c.network).network_address if c.network != ROUTED else ipaddress.ip_address("0.0.0.0")
    return (not c.ssh, -rdma, -mtu, int(address))


def _speed(mbps: int | None) -> str:
    return f"{mbps / 1000:g} Gbit/s" if mbps else "no speed reported"


def _decision(c: Candidate, ssh: Candidate, how: str, found: list[Candidate], unjoined: list[str],
              notes: list[str] = (), measured: bool = False) -> Decision:
    gbits = c.gbits if measured else (c.mbps / 1000 if c.mbps else None)
    return Decision(c.network, dict(c.members), how, gbits, measured, c.ssh,
                    ssh.network if ssh.network != ROUTED else "", unjoined, list(notes), [f.as_dict() for f in found])
