"""The training network (kit.network): the reading of a host's interfaces and RDMA ports (on /sys trees of machines
with an InfiniBand HCA, a RoCE NIC and none), the pure choice over torture cases, the survey's protocol on loopback,
what a container and each launcher get, and what doctor says."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kit.jobs.commands.docker import ContainerSpec
from kit.config.settings import ClusterConfig
from kit.doctor.network import judge_candidates, judge_rdma, judge_survey
from kit.doctor.read import Reading as DoctorReading
from kit.errors import BadInput, KitError
from kit.network import measure, shipped, survey
from kit.network.choose import (ROUTED, SSH, Decision, Member, Refused, candidates, checked, decide, to_probe,
                                unaddressed_rdma)
from kit.network.links import SCRIPT, Address, Link, Port, Reading, parse
from kit.network.rdma import rdma_devices
from kit.cluster.steps.facts import HostFacts

SYSFS = Path(__file__).parent / "data" / "sysfs"


def read_tree(case: str, host: int, tmp_path: Path) -> Reading:
    """links.SCRIPT, run here on a /sys tree of case's machine as host `host` would show it (its `ip -o addr` from
    the case's ip-addr.txt, with N its number): what kit's facts read on such a host."""
    tools = tmp_path / f"bin-{case}-{host}"
    tools.mkdir(parents=True)
    text = re.sub(r"([0-9a-f])N/", rf"\g<1>{host}/", (SYSFS / case / "ip-addr.txt").read_text())
    (tools / "ip").write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\n")
    (tools / "ip").chmod(0o755)
    out = subprocess.run(["sh", "-c", SCRIPT], capture_output=True, text=True, check=True,
                         env={"PATH": f"{tools}:/usr/bin:/bin", "KIT_SYSFS": str(SYSFS / case / "sys"),
                              "KIT_DEVFS": str(SYSFS / case / "dev")})
    return parse(out.stdout)


# ---------------------------------------------------------------- reading a host

def test_an_infiniband_hca_with_two_ports_one_down(tmp_path):
    r = read_tree("ib-two-ports", 1, tmp_path)
    assert {l.name: (l.mtu, l.mbps, l.state, l.kind) for l in r.links} == {
        "lo": (65536, None, "unknown", "loopback"), "eno1": (1500, 1000, "up", "ether"),
        "docker0": (1500, None, "down", "ether"), "ib0": (2044, 200000, "up", "infiniband"),
        "ib1": (2044, None, "down", "infiniband")}
    assert r.link("ib0").addresses == (Address("10.233.0.11", 16), Address("fe80::ba59:9f03:ac:2e61", 64))
    assert r.ports == (Port("mlx5_0", 1, "ACTIVE", "LinkUp", "InfiniBand", 200.0, "ib0"),
                       Port("mlx5_1", 1, "DOWN", "Polling", "InfiniBand", 10.0, "ib1"))
    assert r.devices == ("issm0", "issm1", "rdma_cm", "umad0", "umad1", "uverbs0", "uverbs1")
    assert Reading.from_dict(r.as_dict()) == r  # as the survey sends it


def test_a_roce_nic_is_its_ethernet_interface(tmp_path):
    r = read_tree("roce", 2, tmp_path)
    assert r.ports == (Port("mlx5_0", 1, "ACTIVE", "LinkUp", "Ethernet", 100.0, "ens1f0np0"),)
    assert r.ports[0].kind == "RoCE" and r.ports_of("ens1f0np0") == r.ports
    assert r.link("ens1f0np0").addresses[0] == Address("10.232.0.12", 24)


def test_a_host_without_rdma(tmp_path):
    r = read_tree("none", 3, tmp_path)
    assert (r.ports, r.devices) == ((), ())
    assert [l.name for l in r.links] == ["docker0", "eth0", "lo"]


def test_what_a_reading_takes_and_what_it_leaves_out():
    text = ("@@kit-net links\neth0 1500 10000 up 1\nbad/name 1500 1 up 1\nwlan0 ² -1 dormant 1\n"
            "@@kit-net addr\n2: eth0    inet 10.0.0.1/24 brd 10.0.0.255 scope global eth0\\ valid_lft\n"
            "2: eth0    inet 10.0.0.9²/24 scope global eth0\n"
            "3: ppp0    inet 10.9.0.1 peer 10.9.0.2/32 scope global ppp0\n"
            "4: bond0.100    inet 10.100.0.1/24 scope global bond0.100\n"
            "@@kit-net rdma\nmlx5_0|1|4: ACTIVE|5: LinkUp|Ethernet|25 Gb/sec (1X EDR)|bad/name\n"
            "@@kit-net devices\nuverbs0\n../../etc\n")
    r = parse(text)
    assert [l.name for l in r.links] == ["eth0", "wlan0", "ppp0", "bond0.100"]
    assert r.link("eth0").addresses == (Address("10.0.0.1", 24),)
    assert r.link("wlan0").mtu is None and r.link("wlan0").mbps is None  # no negative speed, no forged digit
    assert r.link("ppp0").addresses == (Address("10.9.0.1", 32, "10.9.0.2"),)
    assert r.ports[0].netdev == "" and r.devices == ("uverbs0",)


# ---------------------------------------------------------------- the choice: torture cases

def link(name: str, address: str, mbps: int | None = 10000, state: str = "up", mtu: int = 1500,
         kind: str = "ether") -> Link:
    ip, _, prefix = address.partition("/")
    return Link(name, mtu, mbps, state, kind, (Address(ip, int(prefix or 24)),))


def host(*links: Link, ports: tuple[Port, ...] = ()) -> Reading:
    return Reading((Link("lo", 65536, None, "unknown", "loopback", (Address("127.0.0.1", 8),)), *links), ports)


SSH_ADDRESSES = {"h1": "10.1.0.11", "h2": "10.1.0.12", "h3": "10.1.0.13"}


def three(fabric=lambda i: link("fabric0", f"10.2.0.1{i}", 100000), management=1000) -> dict[str, Reading]:
    return {f"h{i}": host(link("eth0", f"10.1.0.1{i}", management), *([fabric(i)] if fabric(i) else []))
            for i in (1, 2, 3)}


def test_the_fastest_network_that_joins_every_host_wins_by_its_links_speed():
    found, _ = candidates(three(), SSH_ADDRESSES)
    assert [(c.network, c.ssh, c.joins, c.mbps) for c in found] == [
        ("10.1.0.0/24", True, True, 1000), ("10.2.0.0/24", False, True, 100000)]
    assert to_probe(found) == []  # the links' speeds tell them apart
    d = decide(found)
    assert (d.network, d.gbits, d.measured, d.ssh, d.ssh_network) == ("10.2.0.0/24", 100.0, False, False, "10.1.0.0/24")
    assert {h: (m.iface, m.address) for h, m in d.members.items()} == {
        "h1": ("fabric0", "10.2.0.11"), "h2": ("fabric0", "10.2.0.12"), "h3": ("fabric0", "10.2.0.13")}
    assert d.summary(3) == ("training network: 10.2.0.0/24 (fabric0), 100 Gbit/s, 3 of 3 hosts; ssh over 10.1.0.0/24 "
                            "(its links report the most, against 10.1.0.0/24 1 Gbit/s)")


def test_names_that_differ_from_host_to_host_are_each_hosts_own():
    names = {1: "ens1f0", 2: "enp65s0", 3: "fabric0"}
    d = decide(candidates(three(lambda i: link(names[i], f"10.2.0.1{i}", 100000)), SSH_ADDRESSES)[0])
    assert {h: m.iface for h, m in d.members.items()} == {"h1": "ens1f0", "h2": "enp65s0", "h3": "fabric0"}
    assert "(ens1f0 / enp65s0 / fabric0)" in d.summary(3)


def test_decoys_with_one_address_on_every_host_join_nothing():
    readings = three(lambda i: link("docker0", "172.17.0.1/16", None))
    readings["h1"] = host(*readings["h1"].links[1:], link("virbr0", "192.168.122.1/24", None))
    readings["h2"] = host(*readings["h2"].links[1:], link("virbr0", "192.168.122.1/24", None))
    found, notes = candidates(readings, SSH_ADDRESSES)
    assert [c.network for c in found] == ["10.1.0.0/24"]
    assert "172.17.0.1 (docker0) on h1, h2, h3: an address several hosts have joins nothing (as docker0's " \
           "172.17.0.1)" in notes
    assert any(n.startswith("192.168.122.1 (virbr0) on h1, h2:") for n in notes)


def test_ipv6_link_local_and_link_local_ipv4_are_no_candidates():
    readings = {f"h{i}": host(link("eth0", f"10.1.0.1{i}"), Link("eth1", 1500, 10000, "up", "ether", (
        Address(f"fe80::1:{i}", 64), Address(f"169.254.7.{i}", 16), Address(f"fd00::{i}", 64))))
        for i in (1, 2, 3)}
    found, notes = candidates(readings, SSH_ADDRESSES)
    assert [c.network for c in found] == ["10.1.0.0/24"]
    assert "fe80::1:1 (eth1) on h1: IPv6 (kit's launchers talk IPv4)" in notes
    assert "169.254.7.2 (eth1) on h2: link-local" in notes


def test_point_to_point_addresses_share_no_subnet():
    readings = {f"h{i}": host(link("eth0", f"10.1.0.1{i}"), Link("ib0", 2044, 100000, "up", "infiniband", (
        Address(f"10.5.0.{i}", 32, f"10.5.0.{i + 10}"),))) for i in (1, 2, 3)}
    found, notes = candidates(readings, SSH_ADDRESSES)
    assert [c.network for c in found] == ["10.1.0.0/24"]
    assert "10.5.0.3 (ib0) on h3: a point-to-point /32, which no other host shares" in notes


def test_bonds_and_vlans_are_interfaces_like_any_other():
    d = decide(candidates(three(lambda i: link("bond0.100", f"10.2.0.1{i}", 200000)), SSH_ADDRESSES)[0])
    assert (d.network, {m.iface for m in d.members.values()}, d.gbits) == ("10.2.0.0/24", {"bond0.100"}, 200.0)


def test_hosts_named_in_hosts_txt_are_placed_by_the_address_kit_reached_them_at():
    """hosts.txt by name (gpu-1): kit reaches each at an address (the SSH connection's peer); that address's subnet
    is the hosts.txt network."""
    readings = {name: r for name, r in zip(("gpu-1", "gpu-2", "gpu-3"), three().values())}
    found, _ = candidates(readings, dict(zip(readings, SSH_ADDRESSES.values())))
    assert [c.network for c in found if c.ssh] == ["10.1.0.0/24"]


def test_two_fabrics_of_equal_speed_are_told_apart_by_the_probe_and_a_tie_is_explained():
    readings = {f"h{i}": host(link("eth0", f"10.1.0.1{i}", 1000), link("ens1", f"10.2.0.1{i}", 100000, mtu=9000),
                              link("ens2", f"10.3.0.1{i}", 100000, mtu=9000)) for i in (1, 2, 3)}
    found, _ = candidates(readings, SSH_ADDRESSES)
    assert to_probe(found) == ["10.2.0.0/24", "10.3.0.0/24"]  # the management network is slower: not probed
    by = {c.network: c for c in found}
    by["10.2.0.0/24"].gbits, by["10.3.0.0/24"].gbits = 40.0, 41.5
    d = decide(found)
    assert (d.network, d.measured, d.gbits) == ("10.2.0.0/24", True, 40.0)  # within 10%: the lower address
    assert d.how == ("as fast as 10.3.0.0/24 as measured; more RDMA ports, then a larger MTU, then the lower address")
    by["10.3.0.0/24"].gbits = 80.0
    assert decide(found).network == "10.3.0.0/24"


def test_a_tie_with_the_hosts_txt_network_goes_to_it():
    found, _ = candidates(three(lambda i: link("fabric0", f"10.2.0.1{i}", 10000), management=10000), SSH_ADDRESSES)
    assert to_probe(found) == ["10.1.0.0/24", "10.2.0.0/24"]
    for c, gbits in zip(found, (9.4, 9.9)):
        c.gbits = gbits
    d = decide(found)
    assert (d.network, d.ssh) == ("10.1.0.0/24", True) and "ties go to the hosts.txt network" in d.how
    assert d.summary(3).endswith("; the hosts.txt network (as fast as 10.2.0.0/24 as measured; ties go to the "
                                 "hosts.txt network)")


def test_a_faster_fabric_that_misses_a_host_is_named_and_not_used():
    found, _ = candidates(three(lambda i: link("ib0", f"10.2.0.1{i}", 100000, state="down" if i == 2 else "up")),
                          SSH_ADDRESSES)
    d = decide(found)
    assert (d.network, d.ssh) == ("10.1.0.0/24", True)
    assert d.unjoined == ["10.2.0.0/24 (ib0) misses h2 (ib0 is down there)"]
    with pytest.raises(Refused, match=r"cluster.network 10.2.0.0/24 does not join every host: it misses h2 \(ib0 is "
                                      r"down there\)"):
        decide(found, "10.2.0.0/24")
    found, _ = candidates(three(lambda i: link("ib0", f"10.2.0.1{i}", 100000) if i != 3 else None), SSH_ADDRESSES)
    assert decide(found).unjoined == ["10.2.0.0/24 (ib0) misses h3 (no address on it)"]


def test_a_network_whose_pair_did_not_answer_does_not_join():
    found, _ = candidates(three(), SSH_ADDRESSES)
    found[1].failed["h1 -> h3"] = "[Errno 113] No route to host"
    d = decide(found)
    assert d.network == "10.1.0.0/24"
    assert d.unjoined == ["10.2.0.0/24 (fabric0) misses h3 (no answer from h1: [Errno 113] No route to host)"]


def test_the_setting_overrides_the_choice():
    found, _ = candidates(three(), SSH_ADDRESSES)
    assert decide(found, SSH).network == "10.1.0.0/24"
    assert decide(found, "10.2.0.0/24").how == "cluster.network"
    assert decide(found, "10.2.0.0/16").network == "10.2.0.0/24"  # a wider subnet that holds it
    with pytest.raises(Refused, match="no two hosts have an address of their own on it"):
        decide(found, "10.9.0.0/24")


def test_hosts_txt_addresses_on_several_subnets_are_the_routed_network():
    readings = {f"h{i}": host(link("eth0", f"10.{i}.0.11")) for i in (1, 2, 3)}
    found, _ = candidates(readings, {f"h{i}": f"10.{i}.0.11" for i in (1, 2, 3)})
    assert [(c.network, c.ssh, c.joins) for c in found] == [(ROUTED, True, True)]
    d = decide(found)
    assert (d.network, d.how) == (ROUTED, "the only network that joins every host")
    assert d.summary(3).startswith("training network: the hosts.txt addresses (routed) (eth0), 10 Gbit/s, 3 of 3")


def test_one_host_talks_to_itself():
    found, _ = candidates({"h1": host(link("eth0", "10.1.0.11"), link("ib0", "10.2.0.11"))}, {"h1": "10.1.0.11"})
    assert decide(found, "10.2.0.0/24").members == {"h1": Member("eth0", "10.1.0.11", 10000, 1500)}


def test_hosts_that_give_one_subnet_different_prefixes_make_one_candidate():
    readings = three(lambda i: link("fabric0", f"10.2.0.1{i}/{24 if i < 3 else 16}", 100000))
    found, _ = candidates(readings, SSH_ADDRESSES)
    assert [c.network for c in found] == ["10.1.0.0/24", "10.2.0.0/24"] and found[1].joins


# ---------------------------------------------------------------- the survey's protocol, on loopback

def loopback_host(i: int, fabric: bool = True, fabric_address: str | None = None) -> Reading:
    """A host whose two networks are loopback's 127.0.2.0/24 ("hosts.txt") and 127.0.1.0/24 ("fabric")."""
    links = [link("eth0", f"127.0.2.{i}", 10000), link("docker0", "172.17.0.1/16", None)]
    if fabric:
        links.append(link("fab0", fabric_address or f"127.0.1.{i}", 100000))
    return host(*links)


def run_survey(readings: list[Reading], setting: str | None = None, members: int | None = None, wait: float = 10,
               before=None):
    """The survey on loopback: the coordinator here, each member in a thread, each node with a key of its own;
    before(port, keys), where given, runs once the coordinator listens (an intruder)."""
    nodes = [(f"h{i + 1}", f"127.0.2.{i + 1}") for i in range(len(readings))]
    keys = {name: f"key-of-{name}" for name, _ in nodes}
    server = survey.listen("127.0.2.1")
    port, said = server.getsockname()[1], {}

    def member(i: int) -> None:
        try:
            said[i] = survey.member("127.0.2.1", port, nodes[i][0], readings[i], keys[nodes[i][0]], wait)
        except survey.SurveyError as e:
            said[i] = e
    decided: list = []

    def coordinate() -> None:
        with server:
            try:
                decided.append(survey.coordinate(server, nodes, len(readings), readings[0], keys, setting, wait))
            except survey.SurveyError as e:
                decided.append(e)
    coordinator = threading.Thread(target=coordinate)
    coordinator.start()
    if before:
        before(port, keys)  # before any member says hello
    threads = [threading.Thread(target=member, args=(i,)) for i in range(1, members or len(readings))]
    for t in threads:
        t.start()
    for t in [*threads, coordinator]:
        t.join(60)
    if isinstance(decided[0], Exception):
        raise decided[0]
    return decided[0], said


def test_the_survey_checks_every_pair_and_every_member_learns_the_choice():
    decision, said = run_survey([loopback_host(i) for i in (1, 2, 3)])
    assert decision.network == "127.0.1.0/24" and not decision.measured  # the links' speeds told them apart
    sent = json.loads(json.dumps(decision.as_dict()))
    assert [d.as_dict() for d in said.values()] == [Decision.from_dict(sent).as_dict()] * 2
    assert {h: m.address for h, m in decision.members.items()} == {"h1": "127.0.1.1", "h2": "127.0.1.2",
                                                                   "h3": "127.0.1.3"}
    assert all(c["failed"] == {} for c in decision.candidates)


def test_an_address_another_host_answers_for_is_caught_by_its_token():
    """Each connection of the check is answered with the listening node's token: an address that another host
    answers (a duplicate kit could not see, a NAT) does not count as the node's."""
    listener = survey.Listener("aaaa")
    try:
        assert survey.reach(["n", "h2", "127.0.0.1", listener.port, "aaaa", ""]) == ""
        assert survey.reach(["n", "h3", "127.0.0.1", listener.port, "bbbb", "127.0.0.1"]) == \
            "127.0.0.1 answered, but is not h3 (another host has that address)"
    finally:
        listener.close()
    assert survey.reach(["n", "h3", "127.0.0.1", 1, "bbbb", ""]).startswith("127.0.0.1:1: ")


def test_a_process_without_the_nodes_key_cannot_speak_for_it_nor_stop_the_survey():
    """A job's process that found the coordinator's port says hello as h2 (with a reading of its own), sends what
    is no hello at all, and dribbles a byte at a time: none of it is heard, and the real h2 takes part."""
    import socket as sockets

    def intruder(port: int, keys: dict) -> None:
        forged = {"node": "h2", "nonce": "0" * 32, "body": {"node": "h2", "reading": loopback_host(9).as_dict(),
                                                             "port": 1, "token": "ab"}, "mac": "00" * 32}
        for message in (json.dumps(forged).encode() + b"\n", b'{"node": "h2", "reading": 7}\n', b"[1, 2]\n"):
            with sockets.create_connection(("127.0.2.1", port), timeout=5) as s:
                s.recv(100)
                s.sendall(message)
        slow = sockets.create_connection(("127.0.2.1", port), timeout=5)
        slow.sendall(b"{")  # and no more: the coordinator waits for it a bounded time only
    decision, said = run_survey([loopback_host(i) for i in (1, 2, 3)], before=intruder)
    assert {h: m.address for h, m in decision.members.items()} == {"h1": "127.0.1.1", "h2": "127.0.1.2",
                                                                   "h3": "127.0.1.3"}
    assert all(not isinstance(d, Exception) for d in said.values())


def test_a_member_does_not_take_a_decision_from_what_is_not_the_coordinator():
    """A program on the port before the coordinator (another user's, on the job's port): it cannot seal a decision
    with the job's key, so the member refuses what it says."""
    import socket as sockets
    server = sockets.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def squat() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b'{"nonce": "' + b"1" * 32 + b'"}\n')
            conn.recv(1 << 16)
            conn.sendall(json.dumps({"body": {"decision": {}}, "mac": "00" * 32}).encode() + b"\n")
    threading.Thread(target=squat, daemon=True).start()
    with pytest.raises(survey.SurveyError, match="its seal does not hold"):
        survey.member("127.0.0.1", server.getsockname()[1], "h2", loopback_host(2), "the-job-key", 5)
    server.close()


def test_the_probe_decides_where_the_speeds_are_equal():
    readings = [host(link("eth0", f"127.0.2.{i}", 10000), link("fab0", f"127.0.1.{i}", 10000)) for i in (1, 2)]
    decision, _ = run_survey(readings)
    assert decision.measured and decision.gbits > 0
    assert all(c["gbits"] > 0 for c in decision.candidates)


def test_a_setting_that_misses_a_host_fails_the_survey_everywhere():
    with pytest.raises(survey.SurveyError, match="misses h2 .fab0 is down there."):
        run_survey([loopback_host(1), host(link("eth0", "127.0.2.2"), link("fab0", "127.0.1.2", state="down")),
                    loopback_host(3)], setting="127.0.1.0/24")


def test_a_member_that_never_comes_is_named():
    with pytest.raises(survey.SurveyError, match="only 2 of 3 answered in 1 s; none from h3"):
        run_survey([loopback_host(i) for i in (1, 2, 3)], members=2, wait=1)


def _far_end(token: str, answer, counted: list | None = None) -> int:
    """A listener on loopback that says `token`, takes a probe's stream and answers with `answer` (bytes, or made
    of the count of bytes it took); its port."""
    import socket as sockets
    server = sockets.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(f"KIT {token}\n".encode())
            count = -len(b"PROBE\n")
            while data := conn.recv(1 << 20):
                count += len(data)
            (counted if counted is not None else []).append(count)
            conn.sendall(answer(count) if callable(answer) else answer)
        server.close()
    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


@pytest.mark.parametrize("answer", [b"999999999999 0.000001\n", b"100 nan\n", b"100 -1\n", b"-5 0.5\n",
                                    b"100 inf\n"])
def test_the_probe_takes_no_figure_that_is_not_a_count_of_what_it_sent(answer):
    """A far end's figure is at most what this end sent, in at least the time it took to send it: a forged
    `999999999999 0.000001` no longer wins the network choice, and nan is a failed probe, not an error in decide."""
    port = _far_end("tok", answer)
    if answer.startswith(b"999"):
        with pytest.raises(ValueError, match="not a count"):
            survey.probe("127.0.0.1", port, "", "tok", seconds=0.2)
        return
    with pytest.raises(ValueError):
        survey.probe("127.0.0.1", port, "", "tok", seconds=0.2)


def test_the_probe_measures_only_the_node_that_said_hello_and_at_most_at_the_rate_it_sent():
    with pytest.raises(ValueError, match="not as the node that said hello"):
        survey.probe("127.0.0.1", _far_end("someone-else", b"1 1\n"), "", "tok", seconds=0.1)
    listener = survey.Listener("tok")
    try:
        gbits = survey.probe("127.0.0.1", listener.port, "", "tok", seconds=0.2)
    finally:
        listener.close()
    assert 0 < gbits < 1e4
    slow = survey.probe("127.0.0.1", _far_end("tok", b"1000000 1000\n"), "", "tok", seconds=0.1)
    assert slow == pytest.approx(1000000 * 8 / 1000 / 1e9)   # a slower figure than it sent is the far end's to say
    counted: list[int] = []
    fast = survey.probe("127.0.0.1", _far_end("tok", lambda n: f"{n} 0.000001\n".encode(), counted), "", "tok",
                        seconds=0.2)
    assert fast <= counted[0] * 8 / 0.2 / 1e9   # every byte, but in no less time than they took to send


def test_a_flood_of_connections_starts_no_thread_beyond_the_cap_and_the_survey_still_answers():
    """A job's process that opens a few hundred connections to a node's listener: OPEN_MAX are held (each a bounded
    time), the others closed at once, and no more threads than that start; once they are gone, a check connects."""
    import socket as sockets
    listener = survey.Listener("tok")
    before, most = threading.active_count(), 0
    held = []
    try:
        for _ in range(survey.OPEN_MAX + 100):
            held.append(sockets.create_connection(("127.0.0.1", listener.port), timeout=5))
            most = max(most, threading.active_count() - before)
        assert most <= survey.OPEN_MAX + 1   # (the one being started as another ends)
        for s in held:
            s.settimeout(5)
        said = [s.recv(64) for s in held]
        assert said.count(b"") >= 20 and said.count(b"KIT tok\n") >= survey.OPEN_MAX   # closed at once, or served
        for s in held:
            s.close()
        assert survey.reach(["n", "h2", "127.0.0.1", listener.port, "tok", ""]) == ""
    finally:
        listener.close()


def test_the_shipped_script_is_the_three_modules_and_runs_alone(tmp_path):
    script = shipped.script()
    names = [line.split("(")[0].split()[1] for line in script.splitlines() if line.startswith(("def ", "class "))]
    assert len(names) == len(set(names))  # one namespace: no module's name hides another's
    (tmp_path / "kit_net.py").write_text(script)
    r = subprocess.run(["python3", "-I", str(tmp_path / "kit_net.py"), "member", "127.0.0.1:1", "h2", "0.3"],
                       input="a-key", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "the survey's first node at 127.0.0.1:1 does not answer" in r.stdout


# ---------------------------------------------------------------- kit's side: what it takes, records, gives

def test_an_answer_is_checked_before_kit_uses_it():
    d, _ = run_survey([loopback_host(i) for i in (1, 2)])
    line = '{"decision": %s}' % __import__("json").dumps(d.as_dict())
    with pytest.raises(KitError):   # the survey ran over loopback here: such a decision is no hosts' network
        measure.parse_answer(line, ["h1", "h2"], "h1")
    line = line.replace("127.0.1.", "10.9.1.").replace("127.0.2.", "10.9.2.")
    assert measure.parse_answer(line, ["h1", "h2"], "h1").network == d.network.replace("127.0.1.", "10.9.1.")
    for bad in (line.replace('"fab0"', '"fab0; rm -rf /"'), line.replace('"10.9.1.2"', '"::1"'),
                line.replace('"h2"', '"h9"'), '{"error": "x"}', "Traceback", line.replace('"10.9.1.2"', '"0.0.0.0"'),
                line.replace('"10.9.1.2"', '"127.0.0.1"'), line.replace('"10.9.1.2"', '"224.0.0.1"'),
                line.replace('"10.9.1.2"', '"169.254.1.2"'), line.replace('"10.9.1.2"', '"255.255.255.255"'),
                re.sub(r'"gbits": [0-9.e+-]+', '"gbits": NaN', line, count=1)):
        with pytest.raises(KitError):
            measure.parse_answer(bad, ["h1", "h2"], "h1")


class FakeNode:
    def __init__(self, name: str, address: str, links: Reading) -> None:
        self.name, self.address, self.facts = name, address, HostFacts(0, "27.0", links=links)


def test_a_setting_is_refused_from_the_facts_before_anything_changes(tmp_path):
    nodes = [FakeNode(f"h{i}", f"10.231.77.1{i}", read_tree("ib-two-ports", i, tmp_path)) for i in (1, 2, 3)]
    measure.check_setting(nodes, "10.233.0.0/16")
    with pytest.raises(BadInput, match=r"kit.yaml:4: cluster.network: 10.234.0.0/16 does not join every host: it "
                                       r"misses h1 \(ib1 is down there\), h2 \(ib1 is down there\), h3"):
        measure.check_setting(nodes, "10.234.0.0/16", "kit.yaml:4: cluster.network")
    assert measure.fingerprint(nodes, None) != measure.fingerprint(nodes, "10.233.0.0/16")


def test_an_infiniband_cluster_trains_over_ib0_and_nccl_gets_its_active_port(tmp_path):
    readings = {f"h{i}": read_tree("ib-two-ports", i, tmp_path) for i in (1, 2, 3)}
    d = decide(candidates(readings, SSH_ADDRESSES | {"h1": "10.231.77.11", "h2": "10.231.77.12",
                                                     "h3": "10.231.77.13"})[0])
    assert (d.network, d.gbits) == ("10.233.0.0/16", 200.0)
    assert {m.rdma for m in d.members.values()} == {("mlx5_0:1",)}  # (mlx5_1's port is down: not a rail)
    assert d.summary(3).startswith("training network: 10.233.0.0/16 (ib0), 200 Gbit/s, 3 of 3 hosts, NCCL over 1 RDMA "
                                   "port a host; ssh over 10.231.77.0/24")
    assert measure.host_env(d.members["h1"]) == ["GLOO_SOCKET_IFNAME=ib0", "NCCL_SOCKET_IFNAME==ib0",
                                                 "NCCL_IB_HCA==mlx5_0:1"]
    assert d.unjoined == []  # ib1 is down on every host: no candidate at all


def test_a_roce_cluster_and_its_containers(tmp_path):
    readings = {f"h{i}": read_tree("roce", i, tmp_path) for i in (1, 2)}
    d = decide(candidates(readings, {"h1": "10.231.77.11", "h2": "10.231.77.12"})[0])
    assert (d.network, {m.iface for m in d.members.values()}) == ("10.232.0.0/24", {"ens1f0np0"})
    assert measure.rank_env(d.members, {"h1": "10.231.77.11", "h2": "10.231.77.12"}) == (
        ("KIT_RANK_NICS", "10.231.77.11=ens1f0np0 10.231.77.12=ens1f0np0"),
        ("KIT_RANK_HCAS", "10.231.77.11=mlx5_0:1 10.231.77.12=mlx5_0:1"))
    spec = ContainerSpec(ClusterConfig(), ClusterConfig().host_place(), "img", "sha256:1", gpus=True,
                         rdma=rdma_devices(readings["h1"]))
    options = spec.options()
    assert options[-6:] == ["--device", "/dev/infiniband/rdma_cm", "--device", "/dev/infiniband/uverbs0",
                            "--cap-add", "IPC_LOCK"]


def test_a_host_without_rdma_gets_no_device_and_no_nccl_ib_hca(tmp_path):
    readings = {f"h{i}": read_tree("none", i, tmp_path) for i in (1, 2)}
    d = decide(candidates(readings, {"h1": "10.231.77.11", "h2": "10.231.77.12"})[0])
    assert measure.host_env(d.members["h1"]) == ["GLOO_SOCKET_IFNAME=eth0", "NCCL_SOCKET_IFNAME==eth0"]
    assert rdma_devices(readings["h1"]) == () and d.warnings == []
    options = ContainerSpec(ClusterConfig(), ClusterConfig().host_place(), "img", "sha256:1", gpus=True).options()
    assert "--device" not in options and "IPC_LOCK" not in options


# ---------------------------------------------------------------- doctor

def doctor_reading(case: str, i: int, tmp_path: Path, **container) -> DoctorReading:
    r = DoctorReading(f"h{i}", address=f"10.231.77.1{i}", facts=HostFacts(0, "27.0", links=read_tree(case, i, tmp_path)))
    for k, v in container.items():
        setattr(r, k, v)
    return r


def test_doctor_shows_each_hosts_ports_and_warns_where_nccl_would_fall_back_to_sockets(tmp_path):
    ok = doctor_reading("ib-two-ports", 1, tmp_path, container_rdma=("uverbs0",), container_verbs=True)
    found = judge_rdma(ok, gpu=True, up=True)
    assert [(f.level, f.text) for f in found] == [
        ("warn", "mlx5_1:1 (InfiniBand) is DOWN (Polling): NCCL cannot use it"),
        ("ok", "ports: mlx5_0:1 InfiniBand ACTIVE 200 Gb/s (ib0), mlx5_1:1 InfiniBand DOWN 10 Gb/s (ib1); the "
               "container has them")]
    cases = [(dict(container_rdma=(), container_verbs=True), "the container has no /dev/infiniband", "kit up"),
             (dict(container_rdma=("uverbs0",), container_verbs=False),
              "the image has no libibverbs (NCCL's IB transport loads it)", "kit build"),
             (dict(container_rdma=("uverbs0",), container_verbs=True, ib_disabled="NCCL_IB_DISABLE=1"),
              "NCCL_IB_DISABLE=1 in the container", "remove NCCL_IB_DISABLE")]
    for i, (container, why, fix) in enumerate(cases):
        r = doctor_reading("roce", 2, tmp_path / str(i), **container)
        warned = [f for f in judge_rdma(r, gpu=True, up=True) if f.level == "warn"]
        assert [f.text for f in warned] == [f"active RDMA ports (mlx5_0:1), but {why}: NCCL falls back to sockets"]
        assert fix in warned[0].fix
    assert judge_rdma(doctor_reading("none", 3, tmp_path / "n"), gpu=True, up=True) == []
    cpu = judge_rdma(doctor_reading("roce", 1, tmp_path / "c"), gpu=False, up=True)
    assert [f.level for f in cpu] == ["ok"] and "cpu image's Gloo talks TCP" in cpu[0].text


def test_doctor_names_the_host_a_fabric_misses_and_an_mtu_that_differs(tmp_path):
    readings = three(lambda i: link("fabric0", f"10.2.0.1{i}", 100000, mtu=1500 if i == 3 else 9000,
                                    state="down" if i == 2 else "up"))
    found, _ = candidates(readings, SSH_ADDRESSES)
    before = judge_candidates(found)
    assert [(f.host, f.level) for f in before if f.level != "ok"] == [("h2", "warn")]
    assert "10.2.0.0/24 (fabric0) joins 2 other hosts but not this one: fabric0 is down there" in \
           [f.text for f in before if f.level != "ok"][0]
    recorded = decide(candidates(three(lambda i: link("fabric0", f"10.2.0.1{i}", 100000, mtu=1500 if i == 3 else 9000)),
                                 SSH_ADDRESSES)[0])
    fresh = decide(found)
    found_now = judge_survey(["h1", "h2", "h3"], fresh, recorded)
    failed = [(f.host, f.text.split(":")[0]) for f in found_now if f.level == "fail"]
    assert ("h2", "the training network 10.2.0.0/24 no longer reaches this host") in failed
    assert ("h3", "fabric0's MTU on 10.2.0.0/24 is 1500, the other hosts' 9000") in failed
    slow = three(lambda i: link("fabric0", f"10.2.0.1{i}", 25000 if i == 1 else 100000))
    d = decide(candidates(slow, SSH_ADDRESSES)[0])
    warned = [f for f in judge_survey(["h1", "h2", "h3"], d, d) if f.level == "warn"]
    assert [(f.host, f.text) for f in warned] == [("h1", "fabric0 reports 25 Gbit/s on 10.2.0.0/24, the other hosts' "
                                                          "links 100 Gbit/s: the whole job runs at its pace")]
    assert [f.level for f in judge_survey(["h1", "h2"], None, d, "h2: no answer", "h1")] == ["fail"]


# ---------------------------------------------------------------- the gpu image's RDMA libraries

def test_gpu_images_carry_rdma_cores_libraries_in_their_last_stage_and_the_cpu_image_does_not():
    from kit.config.settings import ConfigFile, build_config
    from kit.image.recipe import make_recipe
    packages = "libibverbs1 ibverbs-providers ibverbs-utils"
    for flavor in ("gpu", "tf-gpu"):
        dockerfile = make_recipe(build_config(ConfigFile(), {"flavor": flavor})).dockerfile
        last = dockerfile.rsplit("\nFROM ", 1)[1]
        assert packages in last, flavor
    assert "libibverbs1" not in make_recipe(build_config(ConfigFile(), {"flavor": "cpu"})).dockerfile


def test_the_verification_loads_libibverbs_as_nccl_does_and_says_what_is_missing():
    from kit.image.verify import RDMA_PY, rdma_problem
    here = json.loads(subprocess.run(["python3", "-I", "-c", RDMA_PY], capture_output=True, text=True,
                                     check=True).stdout)  # this machine has no libibverbs: the script says so
    assert set(here) == {"verbs", "devices", "providers"}
    assert rdma_problem(here) == "NCCL cannot load libibverbs (libibverbs1 is not installed)" or here["verbs"]
    good = {"verbs": "libibverbs.so.1", "devices": 0, "providers": ["bnxt_re", "efa", "mlx4", "mlx5"]}
    assert rdma_problem(good) == ""
    assert "no mlx5 provider" in rdma_problem({**good, "providers": ["efa"]})
    assert "does not answer" in rdma_problem({**good, "devices": -1})


# ---------------------------------------------------------------- kit up's step: when it surveys

class UpNode(FakeNode):
    def __init__(self, name: str, address: str, links: Reading) -> None:
        super().__init__(name, address, links)
        from kit.config.hosts import Host
        self.host = Host(name)


def test_kit_up_surveys_only_where_there_is_a_choice_and_only_when_the_hosts_networks_changed(tmp_path, monkeypatch):
    from kit.cluster import state as st
    from kit.cluster.steps import network as step
    place = ClusterConfig().host_place()
    st.save(tmp_path, st.ClusterState("lab", "img", "sha256:0", 12345, "/ws", [
        st.HostState(f"h{i}", f"10.1.0.1{i}", place) for i in (1, 2, 3)]))
    surveys = []

    def survey(nodes, setting=None):
        surveys.append(setting)
        return decide(candidates({n.name: n.facts.links for n in nodes}, {n.name: n.address for n in nodes})[0])
    monkeypatch.setattr(measure, "survey", survey)
    one = [UpNode(f"h{i}", f"10.1.0.1{i}", three(lambda i: None)[f"h{i}"]) for i in (1, 2, 3)]
    decision, note = step.choose(one, tmp_path, None)
    assert (decision.network, decision.how, note, surveys) == ("10.1.0.0/24", "the only network the hosts share", "",
                                                               [])  # the SSH check between the containers crossed it
    two = [UpNode(f"h{i}", f"10.1.0.1{i}", three()[f"h{i}"]) for i in (1, 2, 3)]
    assert step.choose(two, tmp_path, None)[0].network == "10.2.0.0/24" and surveys == [None]
    assert step.choose(two, tmp_path, None) == (measure.recorded(st.load(tmp_path)).decision, step.EARLIER)
    assert surveys == [None]  # the same networks: as recorded, no survey
    assert step.choose(two, tmp_path, "10.2.0.0/24")[0].how == "its links report the most, against 10.1.0.0/24 " \
                                                                "1 Gbit/s" and surveys == [None, "10.2.0.0/24"]
    plain = step.choose(two, tmp_path, SSH)[0]  # the way around a survey that fails: none runs
    assert (plain.network, plain.how, surveys) == ("10.1.0.0/24", "cluster.network: ssh", [None, "10.2.0.0/24"])

    def fails(nodes, setting=None):
        raise KitError("the network survey did not start in the primary's container", host="h1")
    monkeypatch.setattr(measure, "survey", fails)
    fell, note = step.choose(two, tmp_path, None)  # no setting: the hosts.txt network, said, measured at the next up
    assert (fell.network, fell.how) == ("10.1.0.0/24", "not measured: the survey failed"), fell
    assert note.startswith("the network survey failed (h1: the network survey did not start") and \
        measure.recorded(st.load(tmp_path)).fingerprint == ""
    with pytest.raises(KitError):  # a setting is never put aside
        step.choose(two, tmp_path, "10.2.0.0/24")


def test_nccl_keeps_every_rail_of_the_fabric_and_no_port_of_another():
    """A GPU server's eight InfiniBand ports (rails), an IP address on the first only, and a RoCE port of a storage
    network: NCCL_IB_HCA names the eight, per host (its names may differ from another host's)."""
    def server(i: int, first: int) -> Reading:
        rails = tuple(Port(f"mlx5_{first + n}", 1, "ACTIVE", "LinkUp", "InfiniBand", 400.0, "ib0" if n == 0 else "")
                      for n in range(8))
        storage = Port("mlx5_9", 1, "ACTIVE", "LinkUp", "Ethernet", 100.0, "ens9")
        return Reading((link("eno1", f"10.1.0.1{i}", 1000), link("ib0", f"10.5.0.1{i}", 400000, kind="infiniband"),
                        link("ens9", f"10.9.0.1{i}", 100000)), (*rails, storage))
    readings = {"h1": server(1, 0), "h2": server(2, 10)}
    d = decide(candidates(readings, {"h1": "10.1.0.11", "h2": "10.1.0.12"})[0])
    assert d.network == "10.5.0.0/24"
    assert d.members["h1"].rdma == tuple(f"mlx5_{n}:1" for n in range(8))
    assert d.members["h2"].rdma == tuple(sorted(f"mlx5_{n}:1" for n in range(10, 18)))
    env = dict(measure.rank_env(d.members, {"h1": "10.1.0.11", "h2": "10.1.0.12"}))
    assert env["KIT_RANK_HCAS"].split()[0] == "10.1.0.11=" + ",".join(f"mlx5_{n}:1" for n in range(8))


def test_rdma_ports_that_carry_no_network_are_said():
    """InfiniBand without IPoIB addresses: kit trains over the management network for its setup, and says that NCCL
    moves its data over the hosts' active ports all the same."""
    readings = {f"h{i}": Reading((link("eno1", f"10.1.0.1{i}", 1000),),
                                 (Port("mlx5_0", 1, "ACTIVE", "LinkUp", "InfiniBand", 200.0, ""),)) for i in (1, 2)}
    d = decide(candidates(readings, {"h1": "10.1.0.11", "h2": "10.1.0.12"})[0])
    assert unaddressed_rdma(readings, d) == [
        "active RDMA ports that carry no network of the hosts (h1: mlx5_0:1; h2: mlx5_0:1): NCCL, in a gpu image, "
        "moves its data over them, and only its setup over the training network"]


def test_a_decision_that_leaves_out_a_node_or_names_no_interface_is_refused():
    d = decide(candidates(three(), SSH_ADDRESSES)[0])
    assert checked(d, ["h1", "h2", "h3"]) is d
    with pytest.raises(ValueError, match="are not the hosts"):
        checked(d, ["h1", "h2", "h3", "h4"])
    d.members["h2"] = Member("eth0 x", "10.2.0.12")
    with pytest.raises(ValueError, match="is not an interface"):
        checked(d, ["h1", "h2", "h3"])


def test_the_survey_reads_its_key_from_the_containers_stdin():
    """docker exec passes stdin on only with -i: without it the key never reaches the survey, which then fails."""
    argv = measure.survey_argv("kit-lab", "member", "10.0.0.1:4000", "h2", "30")
    assert argv[:4] == ["docker", "exec", "-i", "kit-lab"]
    assert argv[4:7] == ["python", "-I", "-c"] and argv[-4:] == ["member", "10.0.0.1:4000", "h2", "30"]


def test_a_survey_that_stops_at_once_says_why_and_one_that_says_nothing_is_named():
    """The coordinator's own error (a key that did not reach it) is the message, not "did not start"."""
    from types import SimpleNamespace as Ns

    def node(lines):
        runner = Ns(stream_out=lambda command, on_line, stdin=None: [on_line(x) for x in lines] and 1)
        return Ns(name="h1", address="10.1.0.11", runner=runner, place=Ns(container="kit-lab"))
    said = ['{"error": "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"}']
    with pytest.raises(KitError, match=r"the network survey failed: JSONDecodeError: Expecting value") as e:
        measure.survey([node(said), node([])], wait=1)
    assert e.value.host == "h1"
    with pytest.raises(KitError, match="did not start in the primary's container"):
        measure.survey([node(["Traceback (most recent call last):"]), node([])], wait=1)
