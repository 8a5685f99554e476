"""kit's side of the training network: the survey on a cluster's containers (`kit up`, `kit doctor`), its record in
the cluster's state, and what each launcher is given from it (kit.network.survey runs in the containers)."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.commands.docker import command, exec_argv
from kit.errors import BadInput, KitError
from kit.fanout import fan_out
from kit.network import shipped
from kit.network.choose import ROUTED, SSH, Candidate, Decision, Member, Refused, candidates, decide
from kit.network.links import NAME

if TYPE_CHECKING:
    from kit import state as st
# The nodes below are kit.steps.node.Node (a step imports this module: it cannot import the steps).

SCRIPT = shipped.script()
WAIT_S = 30           # for every container's hello to the survey's coordinator
RDMA_PORT = re.compile(r"[A-Za-z0-9_.-]{1,64}:[0-9]{1,3}")


def survey_argv(container: str, *args: str) -> list[str]:
    """The survey in a container, isolated (-I): the workspace (its folder) holds the job's files, not kit's."""
    return exec_argv(container, ["python", "-I", "-c", SCRIPT, *args])


def bounded(argv: list[str], seconds: float) -> str:
    return command(["timeout", str(int(seconds)), *argv])


def survey(nodes: list, setting: str | None = None, wait: float = WAIT_S) -> Decision:
    """The survey on the nodes' containers (nodes[0], the primary's, coordinates): the network the ranks train over.
    Raises KitError naming the host where it failed, or a setting (cluster.network) that misses a host."""
    primary = nodes[0]
    names = " ".join(f"{n.name}={n.address}" for n in nodes)
    said: list[str] = []
    listening, ended = threading.Event(), threading.Event()

    def coordinate() -> None:
        try:
            primary.runner.stream_out(bounded(survey_argv(primary.place.container, "coordinate", primary.address,
                                                          names, str(wait), setting or ""), wait * 2 + 60),
                                      lambda line: (said.append(line), listening.set()))
        finally:
            listening.set()
            ended.set()
    threading.Thread(target=coordinate, daemon=True).start()
    listening.wait(wait + 60)
    port = _port(said[0] if said else "")
    if port is None:
        raise KitError("the network survey did not start in the primary's container", host=primary.name,
                       command="kit's network survey", output_tail="\n".join(said[-5:]),
                       hint="`kit status` shows the containers; run kit up again")

    def join(n) -> None:
        argv = survey_argv(n.place.container, "member", f"{primary.address}:{port}", n.name, str(wait))
        n.runner.run(bounded(argv, wait * 2 + 60), timeout=wait * 2 + 90)
    try:
        fan_out("the network survey", nodes[1:], join, lambda n: n.name)
    finally:
        ended.wait(wait * 2 + 90)
    return parse_answer(said[-1] if said else "", [n.name for n in nodes], primary.name)


def _port(line: str) -> int | None:
    try:
        port = json.loads(line).get("port")
    except (ValueError, AttributeError):
        return None
    return port if isinstance(port, int) and 0 < port < 65536 else None


def parse_answer(line: str, hosts: list[str], where: str) -> Decision:
    """The coordinator's last line -> Decision, every value checked (a container's root could have printed it)."""
    try:
        answer = json.loads(line)
        if "error" in answer:
            raise KitError(f"the network survey failed: {str(answer['error'])[:500]}", host=where,
                           command="kit's network survey",
                           hint="kit doctor shows each host's networks; fix the host it names and run kit up again")
        return checked(Decision.from_dict(answer["decision"]), hosts)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise KitError(f"the network survey's answer is not kit's ({type(e).__name__})", host=where,
                       command="kit's network survey", output_tail=line[-500:],
                       hint="run kit up again; `kit doctor` checks each host") from None


def checked(d: Decision, hosts: list[str]) -> Decision:
    """A decision whose every host is one of ours, every interface a name, every address IPv4: raises ValueError."""
    if set(d.members) != set(hosts):
        raise ValueError(f"members {sorted(d.members)} are not the hosts {sorted(hosts)}")
    for m in d.members.values():
        if not NAME.fullmatch(m.iface) or ipaddress.ip_address(m.address).version != 4 or \
                not all(RDMA_PORT.fullmatch(p) for p in m.rdma):
            raise ValueError(f"{m.iface!r} {m.address!r} is not an interface and an IPv4 address")
    if d.network != ROUTED:
        ipaddress.ip_network(d.network)
    if d.gbits is not None and not isinstance(d.gbits, (int, float)):
        raise ValueError("its speed is not a number")
    return d


# ---------------------------------------------------------------- from the facts, before anything changes

def facts_candidates(nodes: list) -> tuple[list[Candidate], list[str]]:
    """The candidate networks from the hosts' facts (no connection made)."""
    return candidates({n.name: n.facts.links for n in nodes}, {n.name: n.address for n in nodes})


def check_setting(nodes: list, setting: str | None, where: str = "cluster.network") -> None:
    """cluster.network names a network on which every host has an address, on a link that is up: else BadInput,
    naming the hosts it misses, before anything changes."""
    if not setting or setting == SSH or len(nodes) < 2:
        return
    found, notes = facts_candidates(nodes)
    try:
        decide(found, setting, notes)
    except Refused as e:
        raise BadInput(f"{where}: {str(e).removeprefix('cluster.network ')}",
                       hint="bring that host's link up, or set cluster.network to a network that joins every host "
                            "(`kit doctor` lists them), or to ssh, or leave it out: kit chooses") from None


def fingerprint(nodes: list, setting: str | None) -> str:
    """What the choice depends on: every host's interfaces and RDMA ports as read now, and the setting."""
    data = [setting or "", {n.name: [n.address, n.facts.links.as_dict()] for n in nodes}]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the record, and what the launchers get

@dataclass(frozen=True)
class Recorded:
    decision: Decision
    fingerprint: str = ""
    setting: str = ""


def record(state: st.ClusterState, decision: Decision, fingerprint_: str = "", setting: str | None = None) -> None:
    state.network = {"decision": decision.as_dict(), "fingerprint": fingerprint_, "setting": setting or ""}


def recorded(state: st.ClusterState) -> Recorded | None:
    """The choice `kit up` recorded, when it did (an older kit's record has none)."""
    data = state.network or {}
    if "decision" not in data:
        return None
    try:
        d = checked(Decision.from_dict(data["decision"]), [h.name for h in state.hosts])
    except (ValueError, KeyError, TypeError):
        return None
    return Recorded(d, str(data.get("fingerprint", "")), str(data.get("setting", "")))


def local_decision(state_hosts: list) -> Decision:
    """A local cluster: its containers' one private network."""
    first = state_hosts[0]
    members = {h.name: Member("eth0", h.address) for h in state_hosts}
    return Decision(first.place.subnet, members, "the local cluster's private network", None, ssh=True,
                    ssh_network=first.place.subnet)


def route(state: st.ClusterState) -> dict[str, Member]:
    """host -> the interface and address its ranks train over: the recorded choice; for a cluster `up` recorded
    without one, each host's interface on the subnet that holds every hosts.txt address (kit's choice before)."""
    found = recorded(state)
    if found is not None:
        return dict(found.decision.members)
    addresses = [h.address for h in state.hosts]
    out = {}
    for h in state.hosts:
        net = next((i for i in h.interfaces if all(ipaddress.ip_address(a) in ipaddress.ip_network(
            f"{i[1]}/{i[2]}", strict=False) for a in addresses)), None)
        if net is None:
            raise BadInput(f"{h.name} has no interface on a subnet that holds every cluster address "
                           f"({', '.join(addresses)})", hint="run kit up again: it chooses the training network")
        out[h.name] = Member(net[0], h.address)
    return out


def described(state: st.ClusterState, hosts: set[str]) -> str:
    """A job's line of its network, on a cluster of servers: `10.232.0.0/24 (fabric0), not the hosts.txt network`."""
    found = recorded(state)
    if found is None or state.local:
        return ""
    d = found.decision
    names = " / ".join(dict.fromkeys(m.iface for h, m in d.members.items() if h in hosts))
    where = "the hosts.txt addresses (routed)" if d.network == ROUTED else d.network
    return f"{where} ({names})" + ("" if d.ssh else ", not the hosts.txt network")


def ib_hca(members: dict[str, Member]) -> str:
    """NCCL_IB_HCA for these hosts: the active RDMA ports of the training network, exact names (`=` in front), or ""
    where it has none (NCCL then decides by itself)."""
    ports = sorted({p for m in members.values() for p in m.rdma})
    return "=" + ",".join(ports) if ports else ""


def nics_by_address(members: dict[str, Member], addresses: dict[str, str]) -> str:
    """KIT_RANK_NICS: `hosts.txt address=interface ...`, from which each Horovod rank takes its host's interface
    (horovodrun gives every rank the same variables, and the names may differ between hosts)."""
    return " ".join(f"{addresses[h]}={m.iface}" for h, m in members.items() if h in addresses)
