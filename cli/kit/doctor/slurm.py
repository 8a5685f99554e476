"""`kit doctor`'s Slurm section: does the controller answer, is every host a node that takes jobs, do the munge keys
agree? (The hosts' clocks, which munge credentials depend on, are the doctor's clock check.)

Two reads: one on the primary (scontrol ping, sinfo, slurmd's port, a fresh munge credential), then one on every host
at once (its hostname, and that credential decoded by its own munged). Pure functions judge what they printed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.doctor.judge import FAIL, OK, WARN, Finding
from kit.doctor.read import Reading
from kit.errors import KitError
from kit.cluster.fanout import fan_out
from kit.hostoutput import MARK, lines, number, sections
from kit.cluster.steps.node import Node

SLURM_CONF = "/etc/slurm/slurm.conf"
PREPARE = "kit prepare --slurm --hosts hosts.txt"
SLURM_TIMEOUT_S = 20      # one Slurm or munge command (scontrol retries a silent controller for ~10 s)
SLURMD_PORT = 6818        # Slurm's default, when the controller cannot say
UP_STATES = ("idle", "allocated", "mixed")
FLAGS = "*~#!%$@^-+"      # what sinfo appends to a state (* not responding, ~ powered off, ...)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str
    state: str          # idle, allocated, mixed, down, drained, ... without sinfo's flags
    responding: bool    # False: sinfo marks it * (slurmctld's pings go unanswered)
    reason: str = ""    # why it is down or drained, as whoever set it said


def primary_script(hosts: int) -> str:
    """One credential per host: munged refuses to decode one credential twice (a replay), and hosts that share a
    munged (the test lab's) would."""
    t = f"timeout {SLURM_TIMEOUT_S}"
    return "\n".join([
        # No slurm.conf, no Slurm here (and no scontrol that would look for a controller in DNS)
        f"echo '{MARK}conf'; if [ -f {SLURM_CONF} ]; then echo present; else echo '{MARK}end'; exit 0; fi",
        f"echo '{MARK}ping'; {t} scontrol ping 2>&1",
        f"echo '{MARK}port'; {t} scontrol show config 2>/dev/null | sed -n 's/^SlurmdPort *= *//p'",
        f"echo '{MARK}nodes'; {t} sinfo -h -N -o '%N|%o|%T|%E' 2>&1",
        f"echo '{MARK}cred'; for i in $(seq {hosts}); do {t} munge -n 2>&1; done",
        f"echo '{MARK}end'",
    ])


# The credential comes on stdin: unmunge reads it there.
HOST_SCRIPT = (f"echo '{MARK}hostname'; hostname -s; echo '{MARK}unmunge'; "
               f"timeout {SLURM_TIMEOUT_S} unmunge 2>&1 | grep -E '^STATUS:|rror|not found'; echo '{MARK}end'")


def parse_ping(text: str) -> tuple[bool, str]:
    """(the controller answers, what scontrol said), from `scontrol ping`: `Slurmctld(primary) at NAME is UP`. Pure."""
    said_lines = [line.strip() for line in lines(text) if line.strip().strip("*")]
    said = next((line for line in said_lines if line.startswith("Slurmctld(primary)")), None)
    if said:
        return said.endswith(" is UP"), said
    return False, said_lines[-1] if said_lines else "scontrol printed nothing"


def parse_sinfo(text: str) -> dict[str, SlurmNode] | None:
    """node name -> SlurmNode, from `sinfo -h -N -o '%N|%o|%T|%E'` (a node is listed once per partition); None
    when sinfo printed no such line (it failed: the controller does not answer). Pure."""
    nodes = {}
    for line in lines(text):
        parts = line.strip().split("|", 3)
        if len(parts) != 4 or not parts[0]:
            continue
        name, address, state, reason = parts
        nodes[name] = SlurmNode(name, address, state.rstrip(FLAGS).lower(), not state.endswith("*"),
                                "" if reason.strip() == "none" else reason.strip())
    return nodes or None


def parse_unmunge(text: str) -> tuple[bool, str]:
    """(the credential decoded, what unmunge said), from its `STATUS: Success (0)` line or its error. Pure."""
    said = [line.strip() for line in lines(text) if line.strip()]
    status = next((line.split(":", 1)[1].strip() for line in said if line.startswith("STATUS:")), None)
    if status is not None:
        return status.startswith("Success"), status
    return False, said[-1].removeprefix("unmunge: ").removeprefix("Error: ") if said else "unmunge printed nothing"


# ---------------------------------------------------------------- judging

def judge_controller(host: str, answers: bool, said: str) -> Finding:
    if answers:
        return Finding(host, "slurmctld", OK, f"the controller answers: {said}")
    return Finding(host, "slurmctld", FAIL, f"the controller does not answer (scontrol ping: {said})",
                   f"`{PREPARE}` starts slurmctld on the primary; if it stops again, its log says why "
                   "(/var/log/slurm/slurmctld.log)")


def judge_node(host: str, node: SlurmNode | None, slurmd_listening: bool | None, port: int,
               known: list[str]) -> Finding:
    """One host as a Slurm node: listed, up, its slurmd running (nothing listening on slurmd's port there: it
    stopped, though Slurm shows the node as it was until its pings time out)."""
    if node is None:
        return Finding(host, "slurm node", FAIL, "no Slurm node is this host (sinfo lists "
                       f"{', '.join(known) or 'none'})", f"`{PREPARE}` with this host in hosts.txt")
    if node.state not in UP_STATES or not node.responding:
        return _node_down(host, node)
    if slurmd_listening is False:
        return Finding(host, "slurm node", FAIL, f"slurmd of node {node.name} does not run here (nothing listens on "
                       f"port {port}); Slurm still shows it {node.state} until it stops answering pings",
                       f"`{PREPARE}` starts it")
    return Finding(host, "slurm node", OK, f"node {node.name} is {node.state} ({node.address})")


def _node_down(host: str, node: SlurmNode) -> Finding:
    why = f": {node.reason}" if node.reason else ""
    if not node.responding:
        return Finding(host, "slurm node", FAIL, f"node {node.name} is {node.state} and does not answer the "
                       f"controller{why}", f"`{PREPARE}` starts its slurmd (the node comes back by itself once it "
                       "answers)")
    if node.state.startswith("drain"):
        return Finding(host, "slurm node", FAIL, f"node {node.name} is {node.state}{why}",
                       f"once that is fixed: `scontrol update nodename={node.name} state=resume` on the primary")
    if node.state in ("down", "fail", "failing", "unknown", "not_responding"):
        return Finding(host, "slurm node", FAIL, f"node {node.name} is {node.state}{why}",
                       f"`{PREPARE}` starts its slurmd; if it stays down: `scontrol update nodename={node.name} "
                       "state=resume` on the primary")
    return Finding(host, "slurm node", WARN, f"node {node.name} is {node.state}{why}",
                   f"wait a moment; if it stays so, see `scontrol show node {node.name}` on the primary")


def judge_munge(host: str, decoded: bool | None, said: str) -> Finding:
    if decoded is None:
        return Finding(host, "munge", FAIL, f"cannot check munge here: {said}",
                       "check that the host is healthy (`ssh` to it, its load), then run kit doctor again")
    if decoded:
        return Finding(host, "munge", OK, "a credential made on the primary decodes here: the munge keys agree")
    if "credential" in said.lower() and ("expired" in said.lower() or "rewound" in said.lower()):
        return Finding(host, "munge", FAIL, f"the primary's credential is refused here ({said}): the clocks differ",
                       "run NTP on every host (systemd-timesyncd or chrony) so their clocks agree")
    if "socket" in said.lower() or "not found" in said.lower():
        return Finding(host, "munge", FAIL, f"munge does not answer here ({said})", f"`{PREPARE}` installs and "
                       "starts munged")
    if "invalid credential" in said.lower():
        return Finding(host, "munge", FAIL, f"the primary's credential does not decode here ({said}): this host's "
                       "munge key differs", f"`{PREPARE}` puts the cluster's key on every host and restarts munged")
    return Finding(host, "munge", FAIL, f"the primary's credential is refused here ({said})",
                   f"see munged's log here (/var/log/munge/munged.log); `{PREPARE}` restarts munged")


# ---------------------------------------------------------------- the whole section

def examine(nodes: list[Node], readings: list[Reading], configured: bool) -> list[Finding]:
    """The Slurm section, when kit.yaml has a slurm section (`configured`) or the primary has slurm.conf; hosts that
    could not be read are left out (the doctor names them already)."""
    seen = [(n, r) for n, r in zip(nodes, readings) if not r.error]
    primary = next((n for n, _ in seen if n.host.primary), None)
    if primary is None:
        return []
    try:
        s = sections(primary.runner.run(primary_script(len(seen)), timeout=SLURM_TIMEOUT_S * 5).stdout)
    except Exception:  # noqa: BLE001 - a dropped connection: the section says so, the doctor goes on
        s = {}
    if "end" not in s:
        return [Finding(primary.name, "slurmctld", FAIL, "the Slurm checks were cut short on the primary",
                        "check that the host is healthy (its load, its disk), then run kit doctor again")]
    if not s.get("conf"):
        return [] if not configured else [Finding(
            primary.name, "slurmctld", WARN, f"kit.yaml has a slurm section, but the primary has no {SLURM_CONF}",
            f"make these hosts a Slurm cluster (`{PREPARE}`), or check the site's Slurm from its login host")]
    answers, said = parse_ping(s.get("ping", ""))
    findings = [judge_controller(primary.name, answers, said)]
    creds = lines(s.get("cred", ""))
    made = len(creds) == len(seen) and all(c.startswith("MUNGE:") for c in creds)
    read = fan_out("Slurm on the hosts", list(zip([n for n, _ in seen], creds if made else [""] * len(seen))),
                   lambda item: _read_host(*item), lambda item: item[0].name)
    listed = parse_sinfo(s.get("nodes", "")) if answers else None
    port = number(s.get("port", "").strip(), SLURMD_PORT)
    for (node, reading), (hostname, decoded, unmunged) in zip(seen, read):
        if listed is not None:
            mine = listed.get(hostname) or next((x for x in listed.values() if x.address == reading.address), None)
            findings.append(judge_node(node.name, mine, port in reading.facts.listening if reading.facts else None,
                                       port, sorted(listed)))
        findings.append(judge_munge(node.name, decoded, unmunged) if made else
                        Finding(node.name, "munge", FAIL, "the primary cannot make a munge credential "
                                f"({creds[-1] if creds else 'munge -n printed nothing'})",
                                f"`{PREPARE}` installs and starts munged on every host"))
    return findings


def _read_host(node: Node, cred: str) -> tuple[str, bool | None, str]:
    """(its short hostname, the credential decoded (None: the check itself failed), what unmunge or the failure
    said)."""
    try:
        r = node.runner.run(HOST_SCRIPT, stdin=cred.encode() + b"\n", timeout=SLURM_TIMEOUT_S * 3)
    except KitError as e:
        return "", None, e.message
    except Exception as e:  # noqa: BLE001 - a dropped connection: this host's finding, not the end
        return "", None, f"{type(e).__name__}: {e}"
    s = sections(r.stdout)
    if "end" not in s:
        return "", None, f"kit's Slurm check was cut short: {r.tail() or 'no output'}"
    return (s.get("hostname", ""), *parse_unmunge(s.get("unmunge", "")))
