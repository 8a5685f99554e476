"""`kit doctor`'s Slurm section: parsing what scontrol, sinfo and unmunge print (captured from Debian 12's Slurm 22.05
and munge 0.5.15), and the findings judged from it."""

import subprocess

from kit.doctor.judge import FAIL, OK, WARN
from kit.doctor.slurm import (HOST_SCRIPT, PREPARE, SlurmNode, judge_controller, judge_munge, judge_node,
                              parse_ping, parse_sinfo, parse_unmunge, primary_script)
from kit.cluster.steps.facts import sections

PING_UP = "Slurmctld(primary) at kitlab-h1 is UP\n"
PING_DOWN = """Slurmctld(primary) at kitlab-h1 is DOWN
*****************************************
** RESTORE SLURMCTLD DAEMON TO SERVICE **
*****************************************
"""
SINFO = """kitlab-h1|10.231.77.11|idle|none
kitlab-h2|10.231.77.12|mixed|none
kitlab-h3|10.231.77.13|idle*|none
kitlab-h4|10.231.77.14|drained|bad disk
kitlab-h5|10.231.77.15|down*|Not responding
"""
UNMUNGE_OK = """STATUS:          Success (0)
ENCODE_HOST:     localhost (127.0.0.1)
ENCODE_TIME:     2026-11-26 06:24:56 +0000 (1795674296)
DECODE_TIME:     2026-11-26 06:24:56 +0000 (1795674296)
TTL:             300
"""


def test_scontrol_ping_up_and_down():
    assert parse_ping(PING_UP) == (True, "Slurmctld(primary) at kitlab-h1 is UP")
    assert parse_ping(PING_DOWN) == (False, "Slurmctld(primary) at kitlab-h1 is DOWN")
    assert parse_ping("scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
                      "scontrol: error: fetch_config: DNS SRV lookup failed\n") == \
        (False, "scontrol: error: fetch_config: DNS SRV lookup failed")
    assert parse_ping("") == (False, "scontrol printed nothing")


def test_sinfo_nodes_with_their_flags_and_reasons():
    nodes = parse_sinfo(SINFO + "kitlab-h1|10.231.77.11|idle|none\n")  # listed again: in a second partition
    assert nodes == {
        "kitlab-h1": SlurmNode("kitlab-h1", "10.231.77.11", "idle", True),
        "kitlab-h2": SlurmNode("kitlab-h2", "10.231.77.12", "mixed", True),
        "kitlab-h3": SlurmNode("kitlab-h3", "10.231.77.13", "idle", False),
        "kitlab-h4": SlurmNode("kitlab-h4", "10.231.77.14", "drained", True, "bad disk"),
        "kitlab-h5": SlurmNode("kitlab-h5", "10.231.77.15", "down", False, "Not responding"),
    }
    assert parse_sinfo("slurm_load_partitions: Unable to contact slurm controller (connect failure)\n") is None


def test_unmunge_success_and_its_errors():
    assert parse_unmunge(UNMUNGE_OK) == (True, "Success (0)")
    assert parse_unmunge("unmunge: Error: Invalid credential\n") == (False, "Invalid credential")
    assert parse_unmunge('unmunge: Error: Failed to access "/run/munge/munge.socket.2": No such file or directory '
                         '(Did you start munged?)\n') == \
        (False, 'Failed to access "/run/munge/munge.socket.2": No such file or directory (Did you start munged?)')
    assert parse_unmunge("") == (False, "unmunge printed nothing")


def test_the_controller_finding():
    assert judge_controller("h1", True, "Slurmctld(primary) at kitlab-h1 is UP").level == OK
    down = judge_controller("h1", False, "Slurmctld(primary) at kitlab-h1 is DOWN")
    assert (down.host, down.check, down.level) == ("h1", "slurmctld", FAIL) and PREPARE in down.fix


def test_node_findings_name_the_host_the_state_the_reason_and_the_fix():
    nodes = parse_sinfo(SINFO)
    ok = judge_node("10.231.77.11", nodes["kitlab-h1"], True, 6818, [])
    assert (ok.level, ok.text) == (OK, "node kitlab-h1 is idle (10.231.77.11)")
    assert judge_node("h2", nodes["kitlab-h2"], True, 6818, []).level == OK
    quiet = judge_node("h3", nodes["kitlab-h3"], False, 6818, [])
    assert quiet.level == FAIL and "does not answer" in quiet.text and PREPARE in quiet.fix
    drained = judge_node("h4", nodes["kitlab-h4"], True, 6818, [])
    assert drained.level == FAIL and drained.text == "node kitlab-h4 is drained: bad disk"
    assert "scontrol update nodename=kitlab-h4 state=resume" in drained.fix
    down = judge_node("h5", nodes["kitlab-h5"], False, 6818, [])
    assert down.level == FAIL and "Not responding" in down.text and PREPARE in down.fix


def test_a_stopped_slurmd_is_named_before_slurm_notices():
    """Slurm shows a node idle for minutes after its slurmd stopped (until its pings time out): nothing listening
    on slurmd's port on the host says so at once."""
    f = judge_node("h1", SlurmNode("kitlab-h1", "10.231.77.11", "idle", True), False, 6818, [])
    assert f.level == FAIL and "slurmd of node kitlab-h1 does not run here" in f.text and "6818" in f.text
    assert PREPARE in f.fix


def test_a_host_that_is_no_node_and_a_node_in_another_state():
    missing = judge_node("gpu-9", None, True, 6818, ["kitlab-h1", "kitlab-h2"])
    assert missing.level == FAIL and "sinfo lists kitlab-h1, kitlab-h2" in missing.text
    busy = judge_node("h1", SlurmNode("kitlab-h1", "10.0.0.1", "completing", True), True, 6818, [])
    assert busy.level == WARN and "scontrol show node kitlab-h1" in busy.fix


def test_munge_findings():
    """(A replayed credential: one decoded twice, which the doctor avoids by making one per host.)"""
    assert judge_munge("h2", True, "Success (0)").level == OK
    other_key = judge_munge("h2", False, "Invalid credential")
    assert other_key.level == FAIL and "key differs" in other_key.text and PREPARE in other_key.fix
    clock = judge_munge("h2", False, "Expired credential")
    assert clock.level == FAIL and "clocks differ" in clock.text and "NTP" in clock.fix
    absent = judge_munge("h2", False, 'Failed to access "/run/munge/munge.socket.2": No such file or directory')
    assert absent.level == FAIL and "munge does not answer here" in absent.text
    assert judge_munge("h2", None, "connection reset").text == "cannot check munge here: connection reset"
    replayed = judge_munge("h2", False, "Replayed credential (17)")
    assert replayed.level == FAIL and "key differs" not in replayed.text and "munged.log" in replayed.fix


def test_the_scripts_sections():
    script = primary_script(3)
    for command in ("scontrol ping", "sinfo -h -N -o '%N|%o|%T|%E'", "for i in $(seq 3); do timeout 20 munge -n",
                    "[ -f /etc/slurm/slurm.conf ]"):
        assert command in script
    assert sections(subprocess.run(["sh", "-c", script.replace("/etc/slurm/slurm.conf", "/nonexistent/slurm.conf")],
                                   capture_output=True, text=True, timeout=30).stdout) == {"conf": "", "end": ""}
    assert set(sections("@@kit hostname\nkitlab-h2\n@@kit unmunge\nSTATUS: Success (0)\n@@kit end\n")) == \
        {"hostname", "unmunge", "end"}
    assert "unmunge" in HOST_SCRIPT and "hostname -s" in HOST_SCRIPT


# ---------------------------------------------------------------- the section, end to end on scripted hosts

class Scripted:
    """A host that answers kit's two Slurm scripts as a real one did (the primary's, and every host's with the
    credential it is given on stdin), and records what it was given."""

    def __init__(self, name: str, hostname: str, primary_out: str = "", decodes: str = "STATUS: Success (0)"):
        self.name, self.hostname, self.primary_out, self.decodes, self.given = name, hostname, primary_out, decodes, []

    def run(self, command, *, stdin=None, timeout=None, changes=False):
        from kit.runners.base import Result
        if command == HOST_SCRIPT:
            self.given.append(stdin)
            out = f"@@kit hostname\n{self.hostname}\n@@kit unmunge\n{self.decodes}\n@@kit end\n"
        else:
            out = self.primary_out
        return Result(self.name, command, 0, out)


PRIMARY_OUT = f"""@@kit conf
present
@@kit ping
{PING_UP}@@kit port
6818
@@kit nodes
kitlab-h1|10.231.77.11|idle|none
kitlab-h2|10.231.77.12|idle|none
kitlab-h3|10.231.77.13|idle|none
@@kit cred
MUNGE:AAA1:
MUNGE:AAA2:
MUNGE:AAA3:
@@kit end
"""


def scripted_cluster(**third):
    from kit.doctor.read import Reading
    from kit.config.hosts import Host
    from kit.cluster.steps.facts import HostFacts
    from kit.cluster.steps.node import Node
    runners = [Scripted("10.231.77.11", "kitlab-h1", PRIMARY_OUT), Scripted("10.231.77.12", "kitlab-h2"),
               Scripted("10.231.77.13", "kitlab-h3", **third)]
    nodes = [Node(Host(r.name, primary=i == 0), r, None) for i, r in enumerate(runners)]
    readings = [Reading(r.name, address=r.name, facts=HostFacts(uid=0, docker_version="27.1", listening=frozenset({22, 6818})))
                for r in runners]
    return runners, nodes, readings


def test_the_section_gives_each_host_a_credential_of_its_own_and_finds_its_node_by_hostname():
    from kit.doctor.slurm import examine
    runners, nodes, readings = scripted_cluster()
    found = [(f.host, f.check, f.level) for f in examine(nodes, readings, configured=False)]
    assert found == [("10.231.77.11", "slurmctld", OK)] + [
        (r.name, check, OK) for r in runners for check in ("slurm node", "munge")]
    assert [r.given for r in runners] == [[b"MUNGE:AAA1:\n"], [b"MUNGE:AAA2:\n"], [b"MUNGE:AAA3:\n"]]


def test_the_section_names_the_host_whose_key_differs_and_the_one_whose_slurmd_is_gone():
    from kit.doctor.slurm import examine
    runners, nodes, readings = scripted_cluster(decodes="unmunge: Error: Invalid credential")
    readings[1].facts = readings[1].facts.__class__(uid=0, docker_version="27.1", listening=frozenset({22}))
    bad = {(f.host, f.check): f.text for f in examine(nodes, readings, configured=False) if f.level == FAIL}
    assert set(bad) == {("10.231.77.12", "slurm node"), ("10.231.77.13", "munge")}
    assert "slurmd of node kitlab-h2 does not run here" in bad["10.231.77.12", "slurm node"]


def test_no_slurm_conf_on_the_primary_is_no_section_unless_kit_yaml_has_one():
    from kit.doctor.slurm import examine
    runners, nodes, readings = scripted_cluster()
    runners[0].primary_out = "@@kit conf\n@@kit end\n"
    assert examine(nodes, readings, configured=False) == []
    [f] = examine(nodes, readings, configured=True)
    assert (f.host, f.check, f.level) == ("10.231.77.11", "slurmctld", WARN) and PREPARE in f.fix
    assert runners[1].given == []  # nothing was asked of the other hosts
