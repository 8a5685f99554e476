"""kit doctor's parsers (on output captured from real hosts) and its judgments, which are pure. The checks on real
hosts, with real faults, are in tests/lab/test_health.py."""

import subprocess

from kit.doctor import check as dr
from kit.doctor import judge as jd
from kit.doctor import read as rd
from kit.cluster import state as st
from kit.config.settings import ClusterConfig
from kit.cluster.identity import Owner
from kit.cluster.place import Place
from kit.cluster.steps.facts import ContainerFacts, HostFacts

NICS = """\
docker0 1500 10000
eth0 1400 -1
lo 65536 ?
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever
5: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever preferred_lft forever
"""
OWNER = Owner("u1", "ann")
ID, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_nics_are_read_with_mtu_and_speed_where_the_driver_gives_one():
    assert rd.parse_nics(NICS) == [rd.Nic("lo", "127.0.0.1", 8, 65536, None), rd.Nic("eth0", "192.0.2.2", 24, 1400, None),
                                   rd.Nic("docker0", "172.17.0.1", 16, 1500, 10000)]


def test_the_cluster_nic_is_chosen_by_subnet_not_by_name():
    nics = rd.parse_nics(NICS)
    assert jd.cluster_nic(nics, ["192.0.2.2", "192.0.2.7"]).name == "eth0"
    assert jd.cluster_nic(nics, ["192.0.2.2", "10.0.0.7"]) is None


def test_the_doctor_script_runs_here_and_is_parsed(tmp_path):
    """The script as a host runs it (here: no container, so docker exec fails and says so)."""
    script = rd.doctor_script(Place("kit-doctor-none", str(tmp_path)), str(tmp_path))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60).stdout
    reading = rd.Reading("here")
    rd.parse_doctor(reading, out)
    assert any(n.name == "lo" and n.address == "127.0.0.1" for n in reading.nics)
    assert reading.container_error and reading.shm_bytes is None


def test_the_containers_side_is_parsed():
    reading = rd.Reading("a")
    rd.parse_doctor(reading, "@@kit nics\n@@kit listen\n0B4DE70A:3039 777\n00000000000000000000000000000000:7530 778\n"
                             "@@kit owners\n777 4242 pid:[4026532] sshd\n778 4300 pid:[4026532] python3\n"
                             "@@kit cpidns\npid:[4026532]\n"
                             "@@kit container\n"
                             "|@@kit shm\n|tmpfs 65536 1000 64536 2% /dev/shm\n|@@kit memlock\n|unlimited\n"
                             "|@@kit wsdf\n|/dev/sda1 100000000 1000 2097152 1% /work\n|@@kit cgpus\n"
                             "|GPU 0: NVIDIA H100 (UUID: GPU-1)\n|GPU 1: NVIDIA H100 (UUID: GPU-2)\n"
                             "|@@kit listen\n|00000000:7530 779\n@@kit end\n")  # (the last: the container's forgery)
    assert (reading.shm_bytes, reading.memlock, reading.workspace_free, reading.container_gpus) == \
        (64 << 20, "unlimited", 2 << 30, 2)
    assert reading.listeners == [rd.Listener("10.231.77.11", 12345, 4242, "sshd", "pid:[4026532]"),
                                 rd.Listener("::", 30000, 4300, "python3", "pid:[4026532]")]


def test_the_listeners_are_read_with_their_processes_here():
    """Two real listeners on this machine, one on loopback and one on every IPv6 interface, found with their pids."""
    import os
    import socket
    from kit.cluster.place import Place
    local, wide = socket.socket(), socket.socket(socket.AF_INET6)
    local.bind(("127.0.0.1", 0))
    wide.bind(("::", 0))
    for s in (local, wide):
        s.listen()
    try:
        out = subprocess.run(["sh", "-c", rd.doctor_script(Place("kit-doctor-none", "/tmp"), "/tmp")],
                             capture_output=True, text=True, timeout=60).stdout
    finally:
        ports = [local.getsockname()[1], wide.getsockname()[1]]
        local.close()
        wide.close()
    reading = rd.Reading("here")
    rd.parse_doctor(reading, out)
    found = {l.port: l for l in reading.listeners}
    assert (found[ports[0]].address, found[ports[0]].pid, found[ports[0]].everywhere) == ("127.0.0.1", os.getpid(),
                                                                                          False)
    assert (found[ports[1]].address, found[ports[1]].pid, found[ports[1]].everywhere) == ("::", os.getpid(), True)
    with open("/proc/self/comm") as f:
        assert found[ports[0]].comm == f.read().strip()  # the process's own name, nothing added


def test_a_job_port_open_on_every_interface_is_a_warning():
    ns = "pid:[2]"
    r = reading("a", container_pidns=ns, listeners=[rd.Listener("10.0.0.1", 12345, 9, "sshd", ns),
                                                    rd.Listener("0.0.0.0", 29500, 11, "torchrun", ns),
                                                    rd.Listener("0.0.0.0", 22, 1, "sshd", "pid:[1]")])
    f = jd._job_ports(r)
    assert (f.level, f.text) == ("warn", "listening on every interface, not only the cluster address: torchrun on "
                                         "0.0.0.0 port 29500")
    assert jd._job_ports(reading("a", container_pidns=ns, listeners=r.listeners[:1])).level == "ok"


def test_pairs_are_read_per_target_with_what_ssh_said():
    out = subprocess.run(["sh", "-c", rd.pairs_script(["10.0.0.2", "10.0.0.3"]).replace("ssh -o", "sh -c 'echo "
                                                                                          "refused >&2; exit 255' -o")],
                         capture_output=True, text=True, timeout=60).stdout
    assert rd.parse_pairs(out) == {"10.0.0.2": (255, "refused"), "10.0.0.3": (255, "refused")}


NAMES = {"10.0.0.1": "a", "10.0.0.2": "b", "10.0.0.3": "c"}


def _mesh(bad: set[tuple[str, str]]) -> dict:
    return {s: {addr: ((255, "Connection timed out during banner exchange") if (s, t) in bad else (0, ""))
                for addr, t in NAMES.items() if t != s} for s in NAMES.values()}


def by_host(findings):
    return {f.host: (f.level, f.text) for f in findings}


def test_a_container_nobody_reaches_is_named():
    found = by_host(jd.judge_pairs(_mesh({("a", "b"), ("c", "b")}), NAMES, 12345))
    assert found["b"] == ("fail", "SSH to its container (10.0.0.2:12345) fails from a, c: Connection timed out "
                                  "during banner exchange")
    assert found["a"][0] == found["c"][0] == "ok"


def test_a_container_that_reaches_nobody_is_named_itself():
    found = jd.judge_pairs(_mesh({("a", "b"), ("a", "c")}), NAMES, 12345)
    assert [(f.host, f.level) for f in found if f.level == "fail"] == [("a", "fail")]
    assert "reaches none of the others" in found[0].text


def reading(name, **kw) -> rd.Reading:
    facts = kw.pop("facts", {})
    r = rd.Reading(name, address=kw.pop("address", "10.0.0.1"), **kw)
    r.facts = HostFacts(**{**dict(uid=0, docker_version="27.1", listening=frozenset({12345}), free_bytes=50 << 30,
                                  image_id=ID, container=ContainerFacts("running", ID, "", "lab", OWNER)), **facts})
    return r


def test_the_cluster_port_held_by_another_program_is_named_with_it():
    r = reading("b", listeners=[rd.Listener("10.0.0.2", 12345, 777, "python3", "pid:[1]")], container_pidns="pid:[2]")
    f = jd._port(r, 12345, up=True)
    assert (f.level, f.text) == ("fail", "port 12345 is held by python3 (pid 777), not by the container's sshd")
    assert "cluster.ssh_port" in f.fix
    assert jd._port(reading("b", listeners=[rd.Listener("10.0.0.2", 12345, 9, "sshd", "pid:[2]")],
                            container_pidns="pid:[2]"), 12345, True).level == "ok"
    assert jd._port(reading("b", facts=dict(listening=frozenset())), 12345, True).text.startswith("nothing listens")
    before = jd._port(r, 12345, up=False)
    assert before.level == "fail" and "taken by python3 (pid 777)" in before.text


def test_a_replaced_image_and_a_small_shm_fail_with_their_fix():
    state = st.ClusterState("lab", "kit-horovod:cpu-1", ID, 12345, "/w")
    r = reading("c", facts=dict(image_id=OTHER), shm_bytes=64 << 20, memlock="unlimited", workspace_free=9 << 30)
    found = {f.check: f for f in jd._container(r, state, ClusterConfig(name="lab"), owner_ok=True, gpu=False)}
    assert found["image"].level == "fail" and "here is aaaaaaaaaaaa, bbbbbbbbbbbb" in found["image"].text
    assert "kit up" in found["image"].fix
    assert found["shm"].level == "fail" and found["shm"].text.startswith("/dev/shm in the container is 64 MiB")
    assert found["memlock"].level == found["workspace disk"].level == found["container"].level == "ok"


def test_a_clock_ten_minutes_off_is_named_against_the_others():
    rs = [reading(n, clock_offset=o, clock_error=0.002) for n, o in (("a", 0.01), ("b", 0.02), ("c", 600.0))]
    found = by_host(jd._clocks(rs))
    assert found["c"] == ("fail", "clock 10.0 min ahead of the others (±2 ms)")
    assert found["a"][0] == found["b"][0] == "ok"


def test_each_hosts_nic_is_that_of_its_own_address_and_a_different_mtu_is_a_warning():
    """Names that differ are nothing to fix (each host's ranks get their own); hosts.txt addresses on several
    subnets (routed) are fine; an address that is on none of the host's interfaces is a failure."""
    def host(name, nic, address, mtu, prefix=24):
        return reading(name, address=address, nics=[rd.Nic(nic, address, prefix, mtu, 1000)])
    same = by_host(jd._nics([host("a", "eth0", "10.0.0.1", 1500), host("b", "ens3", "10.0.0.2", 1500)]))
    assert same == {"a": ("ok", "eth0 (10.0.0.1/24), MTU 1500, 1000 Mb/s"), "b": ("ok", "ens3 (10.0.0.2/24), MTU "
                                                                                 "1500, 1000 Mb/s")}
    routed = by_host(jd._nics([host("a", "eth0", "10.1.0.1", 1500), host("b", "eth0", "10.2.0.1", 1500)]))
    assert {level for level, _ in routed.values()} == {"ok"}
    mtu = by_host(jd._nics([host("a", "eth0", "10.0.0.1", 1500), host("b", "eth0", "10.0.0.2", 1500),
                            host("c", "eth0", "10.0.0.3", 9000)]))
    assert mtu["c"][0] == "warn" and "the other hosts' MTU is 1500" in mtu["c"][1]
    nat = by_host(jd._nics([reading("d", address="203.0.113.9", nics=[rd.Nic("eth0", "10.0.0.4", 24, 1500, 1000)])]))
    assert nat["d"][0] == "fail" and "(203.0.113.9) is on none of its interfaces" in nat["d"][1]


def test_gpu_drivers_that_differ_are_named():
    rs = [reading("a", drivers=("550.54",)), reading("b", drivers=("550.54",)), reading("c", drivers=("535.1",))]
    assert by_host(jd._drivers(rs)) == {"c": ("fail", "NVIDIA driver 535.1 here, 550.54 on the others")}


def test_a_memlock_limit_is_only_a_warning_where_nccl_could_use_rdma():
    state = st.ClusterState("lab", "kit-horovod:cpu-1", ID, 12345, "/w")
    r = reading("c", shm_bytes=8 << 30, memlock="8192", workspace_free=9 << 30)
    cpu = {f.check: f for f in jd._container(r, state, ClusterConfig(name="lab"), owner_ok=True, gpu=False)}
    gpu = {f.check: f for f in jd._container(r, state, ClusterConfig(name="lab"), owner_ok=True, gpu=True)}
    assert cpu["memlock"].level == "ok" and "enough" in cpu["memlock"].text
    assert gpu["memlock"].level == "warn" and "RoCE" in gpu["memlock"].fix


def test_a_container_that_cannot_enter_its_workspace_names_the_dead_mount():
    state = st.ClusterState("lab", "kit-horovod:cpu-1", ID, 12345, "/var/lib/kit/lab/workspace")
    said = ('OCI runtime exec failed: exec failed: unable to start container process: chdir to cwd '
            '("/var/lib/kit/lab/workspace") set in config.json failed: transport endpoint is not connected: unknown')
    found = jd._container(reading("c", container_error=said), state, ClusterConfig(name="lab"), True, False)
    assert [(f.check, f.level) for f in found if f.level != "ok"] == [("workspace", "fail")]
    assert "(transport endpoint is not connected): the shared mount here is gone or dead" in found[0].text


def test_a_two_host_clock_difference_is_judged_whole():
    rs = [reading("a", clock_offset=0.0, clock_error=0.001), reading("b", clock_offset=9.0, clock_error=0.001)]
    found = by_host(jd._clocks(rs))
    assert found == {"a": ("fail", "clock 9.0 s behind the other (±1 ms)"), "b": ("fail", "clock 9.0 s ahead of the other (±1 ms)")}


def test_another_owners_cluster_of_the_name_fails_and_is_not_read_as_ours(monkeypatch):
    from kit.config.hosts import Host
    from kit.cluster.steps.node import Node
    theirs = ContainerFacts("running", ID, "", "lab", Owner("u2", "bob"))
    r = reading("a", facts=dict(container=theirs), container_pidns="pid:[2]", shm_bytes=8 << 30, clock_offset=0.0,
                listeners=[rd.Listener("10.0.0.1", 12345, 9, "sshd", "pid:[2]")])
    monkeypatch.setattr(dr, "read_host", lambda node, cfg, image: r)  # (the reading is given: examine judges it)
    report = dr.examine([Node(Host("a"), None, Place("kit-lab", "/var/lib/kit/lab"))], ClusterConfig(name="lab"),
                        "img", None, "cpu", OWNER)
    found = {f.check: f for f in report.findings}
    assert found["owner"].level == "fail" and "of bob" in found["owner"].text
    assert found["port"].level == "fail" and "taken by sshd (pid 9)" in found["port"].text


def test_a_docker_in_containerds_image_store_fails_with_the_setting_that_changes_it():
    r = reading("a", facts=dict(docker_version="29.1.3", containerd_store=True))
    found = {f.check: f for f in jd._host_checks(r, ClusterConfig(name="lab"), None, gpu=False)}
    assert found["docker"].level == "fail" and "containerd's image store" in found["docker"].text
    assert "daemon.json" in found["docker"].fix
    r = reading("a", facts=dict(docker_version="29.1.3"))
    assert {f.check: f for f in jd._host_checks(r, ClusterConfig(name="lab"), None, gpu=False)}["docker"].level == "ok"


def test_gpu_health_read_on_a_host_is_judged_and_printed_with_its_fix(monkeypatch, capsys):
    """doctor from a recorded host output (tests/unit/data/gpu_health_v100_xid79.txt): the GPU off the bus fails and
    the page pending retirement warns, each naming the host and the GPU; a clean H200 host gives one ok line."""
    from helpers import REPO
    from kit.cli import doctor as cli_doctor
    from kit.config.hosts import Host
    from kit.cluster.steps.node import Node

    def host(name, data):
        r = reading(name, facts=dict(gpus=8, runtimes=frozenset({"nvidia"}), drivers=("550.127.05",)),
                    drivers=("550.127.05",), clock_offset=0.0)
        rd.parse_doctor(r, (REPO / "tests/unit/data" / data).read_text())
        return r
    readings = {"h1": host("h1", "gpu_health_h200_clean.txt"), "h2": host("h2", "gpu_health_v100_xid79.txt")}
    monkeypatch.setattr(dr, "read_host", lambda node, cfg, image: readings[node.name])
    monkeypatch.setattr(dr, "facts_candidates", lambda nodes: ([], None))  # (the training network is not this test's)
    nodes = [Node(Host(n), None, Place("kit-lab", "/var/lib/kit/lab")) for n in readings]
    report = dr.examine(nodes, ClusterConfig(name="lab"), "img", None, "gpu", OWNER)
    health = [(f.host, f.level) for f in report.findings if f.check == "gpu health"]
    assert health == [("h1", "ok"), ("h2", "warn"), ("h2", "fail")]
    cli_doctor._print(report, "lab", up=False)
    out = capsys.readouterr().out
    assert "GPU 1 (00000000:00:05.0) on h2: a page waits to be retired" in out
    assert "the GPU at 0000:00:07 on h2, which nvidia-smi does not list: Xid 79 (fallen off the bus)" in out
    assert "fix: drain h2 and reboot it" in out
