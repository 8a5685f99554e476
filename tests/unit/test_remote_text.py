"""What a host prints is read at line feeds only, and its numbers are ASCII digits only: a container (a job's root)
cannot start a section of the host's output with another line break, and a forged digit ('²', '٣') does not crash a
parser, make a host read as unreachable or pass for a number."""

import os
import socket
import stat
import subprocess

import pytest

from kit.doctor import judge as jd
from kit.doctor import read as rd
from kit.doctor import slurm as ds
from kit.image import gpus
from kit.cluster.place import Place
from kit.cluster.steps import facts

# Every line break of str.splitlines that is not a line feed
BREAKS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
LISTEN = "00000000:5BA0 901"                # a backdoor on 0.0.0.0 port 23456
OWNERS = "901 4400 pid:[4026532] python3"   # held by a process of the container


def host_output(container_line: str) -> str:
    """The doctor script's output as a host prints it: its own sections, then the container's lines with INNER."""
    return ("@@kit nics\n@@kit listen\n" + LISTEN + "\n@@kit owners\n" + OWNERS + "\n@@kit cpidns\npid:[4026532]\n"
            "@@kit container\n|@@kit shm\n|tmpfs 65536 1000 64536 2% /dev/shm\n|@@kit memlock\n|unlimited\n"
            "|@@kit wsdf\n|/dev/sda1 100000000 1000 2097152 1% /work\n|@@kit cgpus\n|" + container_line + "\n"
            "\n@@kit end\n")


@pytest.mark.parametrize("brk", BREAKS, ids=[f"U+{ord(b):04X}" for b in BREAKS])
def test_a_container_cannot_start_a_section_with_any_line_break(brk):
    forged = "".join(f"{brk}@@kit {name}" for name in ("listen", "owners", "cpidns")) + f"{brk}@@kit nics{brk}" \
        "9: eth9 inet 10.9.9.9/8"
    reading = rd.Reading("a")
    rd.parse_doctor(reading, host_output("No devices were found" + forged))
    assert reading.listeners == [rd.Listener("0.0.0.0", 23456, 4400, "python3", "pid:[4026532]")]
    assert reading.container_pidns == "pid:[4026532]" and reading.nics == []
    assert [f.level for f in [jd._job_ports(reading)]] == [jd.WARN]  # the backdoor is still named
    assert reading.memlock == "unlimited" and reading.workspace_free == 2 << 30  # the container's own, as it said
    # kit's other readers of sections (facts, the Slurm checks) are cut the same way
    assert facts.sections(f"@@kit image\nsha256:1{brk}@@kit kitdir\n@@kit end\n") == \
        {"image": f"sha256:1{brk}@@kit kitdir", "end": ""}
    assert not facts.complete(f"@@kit docker\n27.0.1{brk}@@kit end\n")


@pytest.mark.parametrize("brk", BREAKS, ids=[f"U+{ord(b):04X}" for b in BREAKS])
def test_the_doctor_script_prefixes_every_line_of_the_container(tmp_path, brk):
    """The real script on this machine, with a `docker` whose exec prints as a hostile container would: a line with
    a forged section after `brk`, then a forged section on a line of its own, then a last line left open."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\n[ \"$1\" = exec ] || exit 1\nprintf '%s\\n@@kit cpidns\\n%s' \"$FORGED\" "
                      "'@@kit listen'\n")
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    script = rd.doctor_script(Place("kit-doctor-none", str(tmp_path)), str(tmp_path))
    forged = f"tmpfs 1 1 1 1% /dev/shm{brk}@@kit listen{brk}@@kit owners{brk}@@kit shm{brk}"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FORGED": forged}
    backdoor = socket.socket()
    backdoor.bind(("0.0.0.0", 0))
    backdoor.listen()
    try:  # (bytes: text=True would turn \r into \n on its own)
        out = subprocess.run(["sh", "-c", script], capture_output=True, timeout=60, env=env).stdout.decode()
    finally:
        port = backdoor.getsockname()[1]
        backdoor.close()
    assert "@@kit end" in out.split("\n") and forged in out
    reading = rd.Reading("here")
    rd.parse_doctor(reading, out)
    assert ("0.0.0.0", port, os.getpid()) in {(l.address, l.port, l.pid) for l in reading.listeners}
    assert reading.container_pidns == "" and reading.shm_bytes is None  # no pid namespace was read, no shm forged
    assert reading.container_error == "@@kit listen"  # the container's last line, as it printed it


def _host_sections(out: str) -> tuple[str, str]:
    s = facts.sections("\n".join(l for l in out.split("\n") if not l.startswith("|")))
    return s["listen"], s["owners"]


def test_a_private_containers_sockets_cannot_start_a_facts_section():
    """With a private network the facts script reads the container's /proc/net/tcp: its lines go with INNER."""
    script = facts.facts_command("img", Place("kit-x", "/tmp/kit-x", network="kit-x", subnet="10.9.0.0/24",
                                              address="10.9.0.2"), "/work", "x")
    assert "docker exec kit-x cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | sed 's/^/|/'" in script
    s = facts.sections("@@kit tcp\n|  0: 00000000:3039 00000000:0000 0A 0 0\n|@@kit image\n@@kit end\n")
    assert "image" not in s and facts.listening_ports(s["tcp"]) == {12345}


DIGITS = ["²", "٣", "３", "①", "1²", "٣٣", "-"]


@pytest.mark.parametrize("digit", DIGITS)
def test_forged_digits_do_not_crash_a_parser(digit):
    reading = rd.Reading("a")
    rd.parse_doctor(reading, f"@@kit nics\nlo {digit} {digit}\n1: lo inet 127.0.0.{digit}/{digit}\n"
                             f"2: eth0 inet 10.0.0.1/{digit}\n"
                             f"@@kit listen\n00000000:{digit} 7\n0100007F:0019 {digit}\n"
                             f"@@kit owners\n{digit} 1 pid:[1] sshd\n7 {digit} pid:[1] sshd\n"
                             f"@@kit container\n|@@kit shm\n|tmpfs {digit} 1 {digit} 1% /dev/shm\n|@@kit memlock\n"
                             f"|{digit}\n|@@kit wsdf\n|/dev/sda1 1 1 {digit} 1% /work\n|@@kit cgpus\n@@kit end\n")
    assert reading.nics == [] and reading.shm_bytes is None and reading.workspace_free is None
    assert [(l.port, l.pid) for l in reading.listeners] == [(25, None)]
    assert rd.parse_nics(f"eth0 {digit} {digit}\n2: eth0 inet 10.0.0.1/24\n") == [rd.Nic("eth0", "10.0.0.1", 24)]
    assert rd.parse_pairs(f"@@kit pair 10.0.0.2 {digit}\nPermission denied\n") == \
        {"10.0.0.2": (-1, "Permission denied")}
    f = facts.parse_facts(0, f"@@kit docker\n27.0.{digit}\n@@kit df\n/dev/sda1 1 1 {digit} 1% /\n@@kit tcp\n"
                             f"  0: 00000000:{digit} 00000000:0000 0A\n"
                             f"@@kit net\n@@kit-net addr\n2: eth0    inet 10.0.0.{digit}/{digit}\n"
                             f"@@kit limits\n{digit}\nCapBnd:\t{digit}\n@@kit drivers\n{digit}.1\n@@kit end\n")
    assert (f.free_bytes, f.listening, f.ipv4, f.memlock_kb, f.can_raise_limits, f.drivers) == \
        (0, frozenset(), (), None, True, ())
    assert gpus.parse({"drivers": f"{digit}\n535.{digit}"}).drivers == ()
    assert ds.parse_sinfo(f"n1|10.0.0.1|idle|{digit}\n")["n1"].reason == digit  # words, not numbers: kept as said
    assert [f.level for f in _slurm_port(digit)] == ["ok", "ok", "ok"]


def _slurm_port(digit: str) -> list:
    """doctor_slurm.examine on a primary whose `scontrol show config` gives a forged SlurmdPort: slurmd's default."""
    from kit.doctor.slurm import examine
    from kit.config.hosts import Host
    from kit.runners.base import Result
    from kit.cluster.steps.node import Node

    class Primary:
        def run(self, script, stdin=None, timeout=None):
            if "unmunge" in script:
                return Result("n1", "", 0, "@@kit hostname\nn1\n@@kit unmunge\nSTATUS: Success (0)\n@@kit end\n", "")
            return Result("n1", "", 0, f"@@kit conf\npresent\n@@kit ping\nSlurmctld(primary) at h is UP\n"
                                       f"@@kit port\n{digit}\n@@kit nodes\nn1|10.0.0.1|idle|none\n"
                                       "@@kit cred\nMUNGE:abc\n@@kit end\n", "")

    node = Node(Host("10.0.0.1", primary=True), Primary(), None)
    reading = rd.Reading("10.0.0.1", address="10.0.0.1", facts=facts.HostFacts(0, "27.0", listening=frozenset({6818})))
    return examine([node], [reading], True)


def test_lines_are_cut_at_line_feeds_only_and_numbers_are_ascii_digits():
    from kit.hostoutput import is_number, lines, number
    text = "a" + "".join(BREAKS) + "b\nc\n"
    assert lines(text) == ["a" + "".join(BREAKS) + "b", "c"] and lines("") == [] and lines("\n") == [""]
    assert lines("x\ny") == "x\ny".splitlines()
    assert [is_number(t) for t in ("0", "12345", "", "-1", " 1", "1\n", *DIGITS)] == [True, True] + [False] * 11
    assert (number("42"), number("٣"), number("²", -1)) == (42, None, -1)


@pytest.mark.parametrize("brk", BREAKS, ids=[f"U+{ord(b):04X}" for b in BREAKS])
def test_a_ranks_stack_cannot_forge_another_ranks(brk):
    """`kit stacks` and the hang report: rank 0's stack text (a thread's name, a function's) is the job's own."""
    from kit.backends.cluster.supervisor.heartbeats import parse_stacks
    text = f"@@kit-stack 0 101\nThread main{brk}@@kit-stack 1 102{brk}all is well\n@@kit-stack ² 103\nx\n" \
           "@@kit-stack 1 102\n  File train.py, line 9\n"
    assert parse_stacks(text) == {0: f"Thread main{brk}@@kit-stack 1 102{brk}all is well\n@@kit-stack ² 103\nx",
                                  1: "  File train.py, line 9"}


def test_a_container_that_floods_its_section_leaves_the_hosts_end_mark_to_kit(tmp_path):
    """The real script on this machine, with a `docker` whose exec never stops printing: what the container prints
    is cut at CONTAINER_MAX, and the host's end mark still comes (else the host reads as cut short)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\n[ \"$1\" = exec ] || exit 1\nexec yes 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'\n")
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    script = rd.doctor_script(Place("kit-doctor-none", str(tmp_path)), str(tmp_path))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", "-c", script], capture_output=True, timeout=60, env=env).stdout.decode()
    assert out.split("\n")[-2:] == ["@@kit end", ""] and len(out) < 2 * rd.CONTAINER_MAX
