"""kit's side of the training network: the survey on a cluster's containers (`kit up`, `kit doctor`), its record in
the cluster's state, and what each launcher is given from it (kit.network.survey runs in the containers)."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import secrets
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.jobs.commands.docker import command, exec_argv
from kit.jobs.commands.horovod import on_cluster_subnet
from kit.errors import BadInput, HostsFailed, KitError
from kit.cluster.fanout import fan_out
from kit.network import shipped
from kit.network.choose import ROUTED, SSH, Candidate, Decision, Member, Refused, candidates, checked, decide

if TYPE_CHECKING:
    from kit.cluster import state as st
# The nodes below are kit.cluster.steps.node.Node (a step imports this module: it cannot import the steps).

SCRIPT = shipped.script()
WAIT_S = 30           # for every container's hello to the survey's coordinator


def survey_argv(container: str, *args: str) -> list[str]:
    """The survey in a container, isolated (-I): the workspace (its folder) holds the job's files, not kit's; its stdin
    (-i) is the container's key."""
    return exec_argv(container, ["python", "-I", "-c", SCRIPT, *args], ("-i",))


def bounded(argv: list[str], seconds: float) -> str:
    return command(["timeout", str(int(seconds)), *argv])


def survey(nodes: list, setting: str | None = None, wait: float = WAIT_S) -> Decision:
    """The survey on the nodes' containers (nodes[0], the primary's, coordinates): the network the ranks train over.
    Each container gets a key of its own on stdin (never on a command line), which its messages are sealed with.
    Raises KitError naming the host where it failed, or a setting (cluster.network) that misses a host."""
    primary = nodes[0]
    keys = {n.name: secrets.token_hex(16) for n in nodes}
    names = " ".join(f"{n.name}={n.address}" for n in nodes)
    said: list[str] = []
    listening, ended = threading.Event(), threading.Event()

    def coordinate() -> None:
        try:
            primary.runner.stream_out(bounded(survey_argv(primary.place.container, "coordinate", primary.address,
                                                          names, str(wait), setting or ""), wait * 2 + 60),
                                      lambda line: (said.append(line), listening.set()),
                                      stdin=json.dumps(keys).encode())
        finally:
            listening.set()
            ended.set()
    threading.Thread(target=coordinate, daemon=True).start()
    listening.wait(wait + 60)
    port = _port(said[0] if said else "")
    if port is None and (error := _error(said[0] if said else "")) is not None:
        raise _failure(error, primary.name)  # it started, and said why it stopped
    if port is None:
        raise KitError("the network survey did not start in the primary's container", host=primary.name,
                       command="kit's network survey", output_tail="\n".join(said[-5:]),
                       hint="`kit status` shows the containers; run kit up again")

    def join(n) -> None:
        argv = survey_argv(n.place.container, "member", f"{primary.address}:{port}", n.name, str(wait))
        r = n.runner.run(bounded(argv, wait * 2 + 60), stdin=keys[n.name].encode(), timeout=wait * 2 + 90)
        if not r.ok:
            raise KitError(f"its part of the network survey failed (exit {r.exit_code})", host=n.name,
                           command="kit's network survey", output_tail=r.tail(),
                           hint="`kit status` shows the containers; `kit doctor` each host's networks")
    failures: dict[str, KitError] = {}
    try:
        fan_out("the network survey", nodes[1:], join, lambda n: n.name)
    except HostsFailed as failed:
        failures = failed.failures
    ended.wait(wait * 2 + 90)
    answer = _answer(said[-1] if len(said) > 1 else "", [n.name for n in nodes], primary.name)
    if isinstance(answer, Decision):
        return answer  # (where a member failed after the decision, what it had to say was said)
    if failures:
        raise HostsFailed("the network survey", {primary.name: answer, **failures})
    raise answer


def _port(line: str) -> int | None:
    try:
        port = json.loads(line).get("port")
    except (ValueError, AttributeError):
        return None
    return port if isinstance(port, int) and 0 < port < 65536 else None


def parse_answer(line: str, hosts: list[str], where: str) -> Decision:
    """The coordinator's last line -> Decision, every value checked (a container's root could have printed it)."""
    answer = _answer(line, hosts, where)
    if isinstance(answer, KitError):
        raise answer
    return answer


def usable(d: Decision) -> Decision:
    """A checked decision whose every address another host can reach: not 0.0.0.0, loopback, link-local, multicast
    or reserved (a container's root could have written 127.0.0.1, and every rank would have talked to itself), and
    whose speed is a finite figure. Raises ValueError."""
    for name, m in d.members.items():
        a = ipaddress.ip_address(m.address)
        if a.is_unspecified or a.is_loopback or a.is_link_local or a.is_multicast or a.is_reserved:
            raise ValueError(f"{name}'s address {m.address} is not one another host reaches")
    if d.network != ROUTED and ipaddress.ip_network(d.network).prefixlen == 0:
        raise ValueError(f"{d.network} is not a network of the hosts")
    if d.gbits is not None and not (math.isfinite(d.gbits) and d.gbits >= 0):
        raise ValueError("its speed is not a figure")
    return d


def _error(line: str) -> str | None:
    """What a survey's line says went wrong, where it is its error line."""
    try:
        answer = json.loads(line)
    except ValueError:
        return None
    return str(answer["error"]) if isinstance(answer, dict) and "error" in answer else None


def _failure(error: str, where: str) -> KitError:
    return KitError(f"the network survey failed: {error[:500]}", host=where, command="kit's network survey",
                    hint="kit doctor shows each host's networks; fix the host it names and run kit up again")


def _answer(line: str, hosts: list[str], where: str) -> Decision | KitError:
    if (error := _error(line)) is not None:
        return _failure(error, where)
    try:
        answer = json.loads(line)
        return usable(checked(Decision.from_dict(answer["decision"]), hosts))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return KitError(f"the network survey's answer is not kit's ({type(e).__name__})", host=where,
                        command="kit's network survey", output_tail=line[-500:],
                        hint="run kit up again; `kit doctor` checks each host")


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
        d = usable(checked(Decision.from_dict(data["decision"]), [h.name for h in state.hosts]))
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
        at = on_cluster_subnet([tuple(i) for i in h.interfaces], addresses)
        if at is None:
            raise BadInput(f"{h.name} has no interface on a subnet that holds every cluster address "
                           f"({', '.join(addresses)})", hint="run kit up again: it chooses the training network")
        out[h.name] = Member(h.interfaces[at][0], h.address)
    return out


def addresses(state: st.ClusterState) -> dict[str, str]:
    """host -> its address on the training network (route's): where a measurement between the containers goes."""
    return {h: m.address for h, m in route(state).items()}


def described(state: st.ClusterState, hosts: set[str]) -> str:
    """A job's line of its network, on a cluster of servers: `10.232.0.0/24 (fabric0), not the hosts.txt network`."""
    found = recorded(state)
    if found is None or state.local:
        return ""
    d = found.decision
    names = " / ".join(dict.fromkeys(m.iface for h, m in d.members.items() if h in hosts))
    where = "the hosts.txt addresses (routed)" if d.network == ROUTED else d.network
    return f"{where} ({names})" + ("" if d.ssh else ", not the hosts.txt network")


def rank_env(members: dict[str, Member], addresses: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """What horovodrun's ranks get of the training network, from which each rank takes its own host's (horovodrun
    gives every rank the same variables, and names may differ between hosts): KIT_RANK_NICS, `hosts.txt
    address=interface ...`, and, where hosts have RDMA ports on it, KIT_RANK_HCAS, `address=mlx5_0:1,mlx5_1:1 ...`
    (kit.jobs.commands.horovod's rank launcher)."""
    on = [(addresses[h], m) for h, m in members.items() if h in addresses]
    hcas = " ".join(f"{a}={','.join(m.rdma)}" for a, m in on if m.rdma)
    return (("KIT_RANK_NICS", " ".join(f"{a}={m.iface}" for a, m in on)), *((("KIT_RANK_HCAS", hcas),) if hcas else ()))


def host_env(member: Member) -> list[str]:
    """A host's variables for the training network, `NAME=VALUE`: its interface for Gloo, and for NCCL by its exact
    name (NCCL takes a bare name as a prefix: eth1 would also be eth10), and NCCL_IB_HCA where it has RDMA ports."""
    return [f"GLOO_SOCKET_IFNAME={member.iface}", f"NCCL_SOCKET_IFNAME=={member.iface}",
            *([f"NCCL_IB_HCA=={','.join(member.rdma)}"] if member.rdma else [])]
