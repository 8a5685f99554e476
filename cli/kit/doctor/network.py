"""`kit doctor`'s network section: pure functions from what was read (and, on a cluster that is up, what the network
survey measured from its containers) to findings. Check `network`: the training network and why, the candidates that
miss a host, an MTU that differs on it, a link below its peers' speed. Check `rdma`: each host's RDMA ports, and where
NCCL would fall back to sockets beside an active one."""

from __future__ import annotations

from kit.doctor.judge import FAIL, OK, WARN, Finding, majority
from kit.doctor.read import Reading
from kit.network.choose import NO_ADDRESS, ROUTED, Candidate, Decision

LINK_FIX = "check its cable, transceiver and switch port (`ethtool {iface}` on the host says what it negotiated)"


def _where(c: Candidate) -> str:
    return "the hosts.txt addresses (routed)" if c.network == ROUTED else c.network


def _speed(mbps: int | None) -> str:
    return f"{mbps / 1000:g} Gbit/s" if mbps else "speed not reported"


def judge_survey(hosts: list[str], fresh: Decision | None, recorded: Decision | None, error: str = "",
                 primary: str = "") -> list[Finding]:
    """A cluster that is up: per host, the network its ranks train over (as `kit up` recorded it) and what the survey
    finds now. fresh: the survey's decision (None: it failed with `error`); recorded: kit up's (None: an older kit's)."""
    if fresh is None:
        return [Finding(primary or hosts[0], "network", FAIL, f"the network survey failed: {error}",
                        "kit up measures again (the tail says which host did not answer)")]
    out = []
    chosen = recorded or fresh
    found = {c.network: c for c in fresh.found()}
    now = found.get(chosen.network)
    for host in hosts:
        m = chosen.members.get(host)
        if now is not None and host in now.missing or now is not None and _failed_to(now, host):
            reason = now.missing.get(host) or _failed_to(now, host)
            out.append(Finding(host, "network", FAIL, f"the training network {_where(now)} no longer reaches this "
                               f"host: {reason}", f"bring {m.iface if m else 'its interface'} up again, or run kit up: "
                                                  "it chooses a network that joins every host"))
        elif m is not None:
            out.append(Finding(host, "network", OK, f"trains over {_where(now or _as_candidate(chosen))}: "
                               f"{m.iface} {m.address}, MTU {m.mtu or '?'}, {_speed(m.mbps)}"
                               + (f", RDMA {', '.join(m.rdma)}" if m.rdma else "")))
    if recorded is not None and fresh.network != recorded.network and now is not None and now.joins:
        out.append(Finding(primary or hosts[0], "network", WARN, f"kit up chose {_where(now)}; the survey now finds "
                           f"{fresh.summary(len(hosts)).removeprefix('training network: ')}",
                           "run kit up to choose again (the running jobs keep their network)"))
    target = now if now is not None else _as_candidate(fresh)
    out += _mtu(target) + _slow_links(target) + _missing(fresh.found(), chosen.network)
    return out


def _as_candidate(d: Decision) -> Candidate:
    return Candidate(d.network, dict(d.members), ssh=d.ssh)


def _failed_to(c: Candidate, host: str) -> str:
    said = [f"no answer from {pair.split(' -> ')[0]} ({error})" for pair, error in c.failed.items()
            if pair.endswith(f" -> {host}")]
    return said[0] if said else ""


def judge_candidates(found: list[Candidate]) -> list[Finding]:
    """Hosts before `kit up`: each host's candidate networks, from its facts (no connection is made)."""
    out = []
    hosts = list(dict.fromkeys(h for c in found for h in (*c.members, *c.missing)))
    for host in hosts:
        on = [c for c in found if host in c.members]
        names = ", ".join(f"{_where(c)} ({c.members[host].iface}, {_speed(c.members[host].mbps)})" for c in on)
        out.append(Finding(host, "network", OK, f"candidate networks: {names or 'none'}"
                           + ("; kit up measures which joins the hosts and is fastest" if len(on) > 1 else "")))
    return out + _missing(found, "")


def _missing(found: list[Candidate], chosen: str) -> list[Finding]:
    """A candidate that joins some hosts and misses others: a warning on each host it misses."""
    out = []
    for c in found:
        if c.network == chosen or c.network == ROUTED or not c.members:
            continue
        for host, reason in c.missing.items():
            if reason == NO_ADDRESS and len(c.members) < len(c.missing):
                continue  # a network of a few hosts only (a storage network): no fabric that misses this one
            out.append(Finding(host, "network", WARN, f"{_where(c)} ({c.names}) joins {len(c.members)} other hosts "
                               f"but not this one: {reason}", "bring its link up and give it its address there; kit "
                               "up then trains over it if it is faster"))
        for pair, error in c.failed.items():
            source, target = pair.split(" -> ")
            out.append(Finding(target, "network", WARN, f"{_where(c)} ({c.names}): {source} cannot reach this host's "
                               f"{c.members[target].address if target in c.members else 'address'} on it ({error})",
                               "check the host's firewall (`kit prepare --hosts hosts.txt` opens the cluster's "
                               "ports on each network of the hosts) and the switch between them; kit trains over "
                               "another network meanwhile"))
    return out


def _mtu(c: Candidate) -> list[Finding]:
    mtus = {h: m.mtu for h, m in c.members.items() if m.mtu}
    usual = majority(list(mtus.values()))
    if len(set(mtus.values())) < 2:
        return []
    return [Finding(h, "network", FAIL, f"{c.members[h].iface}'s MTU on {_where(c)} is {mtu}, the other hosts' "
                    f"{usual or ', '.join(str(v) for k, v in mtus.items() if k != h)}: large messages stall",
                    f"set the same MTU on every host (ip link set dev {c.members[h].iface} mtu N, and in its network "
                    "configuration)")
            for h, mtu in mtus.items() if mtu != usual]


def _slow_links(c: Candidate) -> list[Finding]:
    """A member whose link reports less than the others' on the same network (a port that negotiated down)."""
    speeds = {h: m.mbps for h, m in c.members.items() if m.mbps}
    if len(speeds) < 2:
        return []
    top = max(speeds.values())
    return [Finding(h, "network", WARN, f"{c.members[h].iface} reports {_speed(mbps)} on {_where(c)}, the other "
                    f"hosts' links {_speed(top)}: the whole job runs at its pace", LINK_FIX.format(iface=c.members[h].iface))
            for h, mbps in speeds.items() if mbps < top]


def judge_rdma(r: Reading, gpu: bool, up: bool) -> list[Finding]:
    """A host's RDMA ports (none: no finding), and where NCCL would fall back to sockets beside an active one."""
    ports = r.facts.links.ports
    if not ports:
        return []
    shown = ", ".join(p.describe() for p in ports)
    active = [p for p in ports if p.active]
    out = [Finding(r.name, "rdma", WARN, f"{p.label} ({p.kind}) is {p.state or 'not active'}"
                   + (f" ({p.physical})" if p.physical else "") + ": NCCL cannot use it",
                   "connect its cable or enable its switch port (ibstat shows it); NCCL uses the active ports")
           for p in ports if not p.active]
    if not active:
        return out + [Finding(r.name, "rdma", WARN, f"ports: {shown}; none is active: NCCL talks over sockets",
                              "bring a port up (its cable, the subnet manager for InfiniBand: opensm)")]
    if not gpu:
        return out + [Finding(r.name, "rdma", OK, f"ports: {shown} (for NCCL, in gpu images: the cpu image's Gloo "
                              "talks TCP)")]
    fallback = []
    if up and not r.container_rdma:
        fallback.append(("the container has no /dev/infiniband", "run kit up again: it gives the container the "
                         "host's RDMA devices and IPC_LOCK"))
    if up and r.container_verbs is False:
        fallback.append(("the image has no libibverbs (NCCL's IB transport loads it)", "rebuild the image with kit "
                         "build: the gpu image carries rdma-core"))
    if r.ib_disabled:
        fallback.append((f"{r.ib_disabled} in the container", "remove NCCL_IB_DISABLE (from /etc/nccl.conf, the "
                         "image's environment or your job's -e)"))
    for why, fix in fallback:
        out.append(Finding(r.name, "rdma", WARN, f"active RDMA ports ({', '.join(p.label for p in active)}), but "
                           f"{why}: NCCL falls back to sockets", fix))
    if not fallback:
        out.append(Finding(r.name, "rdma", OK, f"ports: {shown}" + ("; the container has them" if up else "")))
    return out
