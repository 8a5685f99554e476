"""`kit prepare --slurm`: the lab's three hosts become a Slurm cluster (Debian's slurm-wlm and munge, one slurmd per
host), and `kit doctor`'s Slurm section reads it.

The lab's hosts are namespaces of one machine: they share /etc, /var and /run, so they share one slurm.conf, one
munge key and one munged (its socket is a file); each runs its own slurmd (`slurmd -N <its hostname>`) at its own
address, and the primary runs slurmctld. The fixture removes all of it afterwards, whatever the tests did."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from harness import Lab, LabHost
from helpers import run_kit

pytestmark = pytest.mark.lab

CLUSTER = "slurmlab"
PREPARE = ("prepare", "--slurm", "--hosts", "hosts.txt")
MUNGE_KEY = Path("/etc/munge/munge.key")
# What kit prepare --slurm writes on the lab's (shared) filesystem; the fixture removes what was not there before.
WRITTEN = ["/etc/slurm/slurm.conf", "/etc/slurm/gres.conf", "/var/spool/slurmctld", "/var/spool/slurmd",
           "/var/log/slurm/slurmctld.log", "/var/log/slurm/jobcomp.txt", "/run/munge", "/run/munge/munged.pid.kit",
           "/run/slurmctld.pid", "/run/slurmctld.pid.kit", "/var/log/munge/munged.log"]
RECAP = re.compile(r"^(\S+) +: ok=\d+ +changed=(\d+) +unreachable=(\d+) +failed=(\d+)", re.M)


@dataclass
class SlurmLab:
    """What the tests of this module share: the lab, the project folder (kit.yaml, hosts.txt), its hosts, their
    Slurm node names (host -> node), the outputs of the fixture's `kit prepare --slurm --check` and
    `kit prepare --slurm`, and what check mode left (`after_check`)."""

    lab: Lab
    project: Path
    hosts: list[LabHost]
    nodes: dict[str, str]
    check: object = None
    prepared: object = None
    after_check: dict = field(default_factory=dict)

    @property
    def primary(self) -> LabHost:
        return self.hosts[0]

    def run(self, command: str, check: bool = True):
        """A Slurm command (sinfo, sbatch ...) on the primary, over the lab user's ssh."""
        return self.lab.ssh(self.primary, command, check=check)

    def kit(self, *args: str, timeout: int = 600):
        return run_kit(*args, cwd=self.project, env=self.lab.ansible_env, timeout=timeout)

    def node_states(self) -> dict[str, tuple[str, str]]:
        """node -> (its address, its state) as sinfo says."""
        out = self.run("sinfo -h -N -o '%N %o %T'").stdout
        return {name: (address, state) for name, address, state in (line.split() for line in out.splitlines())}

    def wait_idle(self, timeout: float = 30) -> dict[str, tuple[str, str]]:
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(s == "idle" for _, s in states.values()) and len(states) == len(self.hosts) \
                    or time.monotonic() > deadline:
                return states
            time.sleep(0.5)


def recap(output: str) -> dict[str, tuple[int, int, int]]:
    """host -> (changed, unreachable, failed) from ansible-playbook's recap."""
    return {h: (int(c), int(u), int(f)) for h, c, u, f in RECAP.findall(output)}


def pid_files(nodes) -> list[Path]:
    return [Path("/run/munge/munged.pid"), Path("/run/slurmctld.pid"),
            *(Path(f"/run/slurmd-{n}.pid") for n in nodes)]


def live(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def stop(pid: int, timeout: float = 20) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def firewall_rules(h: LabHost, comment: str) -> list[tuple[str, str]]:
    """(iptables or ip6tables, rule) of the host's INPUT chain that carry the comment."""
    return [(tool, line) for tool in ("iptables", "ip6tables")
            for line in h.run_in(tool, "-S", "INPUT", check=False).stdout.splitlines() if comment in line]


@pytest.fixture(scope="module")
def slurm(lab, tmp_path_factory):
    folder = tmp_path_factory.mktemp("slurm")
    (folder / "kit.yaml").write_text(yaml.safe_dump({"cluster": {"name": CLUSTER}}))
    lab.hosts_file(folder / "hosts.txt")
    nodes = {h.address: h.run_in("hostname", "-s").stdout.strip() for h in lab.hosts}
    s = SlurmLab(lab, folder, lab.hosts, nodes)
    there = {p for p in WRITTEN if Path(p).exists()}
    running = {p for p in pid_files(nodes.values()) if live(p)}
    key = (MUNGE_KEY.read_bytes(), MUNGE_KEY.stat()) if MUNGE_KEY.exists() else None
    try:
        s.check = s.kit(*PREPARE, "--check")
        s.after_check = {"conf": Path("/etc/slurm/slurm.conf").exists(),
                         "daemons": [str(p) for p in pid_files(nodes.values()) if live(p) and p not in running],
                         "key": MUNGE_KEY.read_bytes() == key[0] if key else not MUNGE_KEY.exists(),
                         "kept key": (lab.home / ".kit" / CLUSTER / "slurm" / "munge.key").exists()}
        s.prepared = s.kit(*PREPARE)
        yield s
    finally:
        cancel_jobs(s)
        for p in pid_files(nodes.values()):
            if p not in running and (pid := live(p)):
                stop(pid)
        for h in lab.hosts:  # a job step's slurmstepd outlives its slurmd
            for pid in h.processes(r"^slurmstepd"):
                stop(pid, timeout=5)
        for p in WRITTEN + [f"/run/slurmd-{n}.pid{e}" for n in nodes.values() for e in ("", ".kit")] \
                + [f"/var/log/slurm/slurmd-{n}.log" for n in nodes.values()]:
            if p not in there:
                path = Path(p)
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        if key:
            MUNGE_KEY.write_bytes(key[0])
            os.chown(MUNGE_KEY, key[1].st_uid, key[1].st_gid)
            os.chmod(MUNGE_KEY, key[1].st_mode & 0o7777)
        for h in lab.hosts:  # kit prepare's firewall role: the cluster's rules on every host
            for tool, rule in firewall_rules(h, f"kit-{CLUSTER}"):
                h.run_in(tool, *shlex.split(rule.replace("-A", "-D", 1)), check=False)
        shutil.rmtree(lab.home / ".kit" / CLUSTER, ignore_errors=True)


def cancel_jobs(s: SlurmLab, timeout: float = 30) -> None:
    """Every job of the tests cancelled, and gone from the queue (bounded), while the controller still runs."""
    if not live(Path("/run/slurmctld.pid")):
        return
    s.run("scancel --user=root", check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and s.run("squeue -h -o %i", check=False).stdout.strip():
        time.sleep(0.5)


def test_check_mode_shows_the_plan_and_changes_nothing(slurm):
    r = slurm.check
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert {h: f for h, (_, u, f) in recap(r.stdout).items()} == {h.address: 0 for h in slurm.hosts}, r.stdout[-3000:]
    assert "check mode: nothing was changed" in r.stdout
    h1 = slurm.hosts[0]
    assert f"+NodeName={slurm.nodes[h1.address]} NodeAddr={h1.address} " in r.stdout, r.stdout[-5000:]  # --diff
    assert slurm.after_check == {"conf": False, "daemons": [], "key": True, "kept key": False}


def test_prepare_makes_the_three_lab_hosts_idle_slurm_nodes(slurm):
    r = slurm.prepared
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "hosts are prepared" in r.stdout
    states = slurm.wait_idle()
    assert states == {slurm.nodes[h.address]: (h.address, "idle") for h in slurm.hosts}, states
    conf = Path("/etc/slurm/slurm.conf").read_text()
    primary = slurm.primary
    assert f"SlurmctldHost={slurm.nodes[primary.address]}({primary.address})" in conf
    assert re.search(r"^PartitionName=kit Nodes=\S+ Default=YES MaxTime=INFINITE State=UP$", conf, re.M), conf
    key = slurm.lab.home / ".kit" / CLUSTER / "slurm" / "munge.key"
    assert key.stat().st_mode & 0o777 == 0o600 and MUNGE_KEY.read_bytes() == key.read_bytes()
    assert MUNGE_KEY.stat().st_mode & 0o777 == 0o400


def test_a_job_step_runs_on_every_node(slurm):
    """The nodes take work: munge credentials, slurmd on every host and the controller agree."""
    r = slurm.run("timeout 60 srun --nodes=3 --ntasks-per-node=1 hostname -s", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.split()) == sorted(slurm.nodes.values())


def test_a_second_prepare_changes_nothing(slurm):
    pids = {str(p): live(p) for p in pid_files(slurm.nodes.values())}
    r = slurm.kit(*PREPARE)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    assert recap(r.stdout) == {h.address: (0, 0, 0) for h in slurm.hosts}, r.stdout[-4000:]
    assert {str(p): live(p) for p in pid_files(slurm.nodes.values())} == pids


def test_doctor_shows_the_slurm_section_all_ok(slurm):
    r = slurm.kit("doctor", "--json", "--hosts", "hosts.txt", timeout=300)
    report = json.loads(r.stdout)
    found = {(f["host"], f["check"]): f for f in report["findings"] if f["check"] in SLURM_CHECKS}
    assert set(found) == {(h.address, c) for h in slurm.hosts for c in ("slurm node", "munge")} | \
        {(slurm.primary.address, "slurmctld")}, report
    assert [f for f in found.values() if f["level"] != "ok"] == []
    assert r.returncode == 0, [f for f in report["findings"] if f["level"] != "ok"]
    text = slurm.kit("doctor", "--hosts", "hosts.txt", timeout=300)
    assert f"{slurm.nodes[slurm.hosts[2].address]} is idle" in text.stdout, text.stdout


SLURM_CHECKS = ("slurmctld", "slurm node", "munge")


def test_doctor_names_the_host_whose_slurmd_stopped_and_prepare_brings_it_back(slurm):
    broken = slurm.hosts[2]
    node = slurm.nodes[broken.address]
    stop(live(Path(f"/run/slurmd-{node}.pid")))
    r = slurm.kit("doctor", "--json", "--hosts", "hosts.txt", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    failed = [f for f in json.loads(r.stdout)["findings"] if f["level"] == "fail"]
    assert [(f["host"], f["check"]) for f in failed] == [(broken.address, "slurm node")], failed
    assert "slurmd" in failed[0]["text"] and "kit prepare --slurm --hosts hosts.txt" in failed[0]["fix"], failed
    again = slurm.kit(*PREPARE)
    assert again.returncode == 0, again.stdout[-5000:] + again.stderr[-2000:]
    assert recap(again.stdout) == {h.address: (int(h is broken), 0, 0) for h in slurm.hosts}, again.stdout[-4000:]
    assert slurm.wait_idle()[node] == (broken.address, "idle")
    back = slurm.kit("doctor", "--json", "--hosts", "hosts.txt", timeout=300)
    assert back.returncode == 0, back.stdout
