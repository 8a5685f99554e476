"""`kit prepare --slurm`: the inventory's Slurm variables, the cluster's munge key, slurm.conf and gres.conf as the
slurm role renders them from hosts' facts (with Ansible's own templating), and the role's daemon starter."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import REPO
from kit.config.settings import ClusterConfig
from kit.errors import KitError
from kit.cluster.identity import Identity
from kit.config.hosts import parse_hosts
from kit.cluster.prepare import ansible_playbook, inventory

ROLE = REPO / "ansible" / "roles" / "slurm"


def test_the_inventory_asks_for_slurm_only_with_the_clusters_munge_key(tmp_path):
    hosts = parse_hosts("gpu-1\ngpu-2\n")
    addresses = {"gpu-1": "10.0.0.1", "gpu-2": "10.0.0.2"}
    plain = inventory(hosts, addresses, ClusterConfig(name="lab"), gpu=False)
    assert "kit_slurm" not in plain["all"]["vars"] and "kit_munge_key" not in plain["all"]["vars"]
    key = tmp_path / "munge.key"
    slurm = inventory(hosts, addresses, ClusterConfig(name="lab"), gpu=False, munge_key=key)
    assert slurm["all"]["vars"] == {**plain["all"]["vars"], "kit_slurm": True, "kit_munge_key": str(key),
                                    "kit_job_ports": "20000:32767",  # closed to all but the cluster
                                    "kit_job_port_base": 20000, "kit_job_port_block": 16,  # a job's: to its nodes
                                    "kit_job_port_blocks": 798}
    assert slurm["all"]["children"] == plain["all"]["children"]


def test_the_munge_key_is_made_once_per_cluster_and_kept_private(tmp_path):
    key = Identity("lab", root=tmp_path).munge_key()
    assert key == tmp_path / "lab" / "slurm" / "munge.key"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 128
    assert Identity("lab", root=tmp_path).munge_key().read_bytes() == key.read_bytes()
    assert Identity("other", root=tmp_path).munge_key().read_bytes() != key.read_bytes()
    key.chmod(0o644)
    with pytest.raises(KitError, match="can be read by others"):
        Identity("lab", root=tmp_path).munge_key()


def test_a_dry_run_makes_no_munge_key(tmp_path):
    assert not Identity("lab", root=tmp_path, persist=False).munge_key().exists()
    assert not (tmp_path / "lab").exists()


# ---------------------------------------------------------------- slurm.conf and gres.conf

FACTS = {  # three hosts as Ansible's facts and the role's set_fact see them; the first is the primary
    "gpu-1": {"kit_address": "10.0.0.1", "kit_slurm_node": "gpu-1", "ansible_processor_vcpus": 64,
              "ansible_memtotal_mb": 515000, "kit_slurm_gpus": 4},
    "gpu-2": {"kit_address": "10.0.0.2", "kit_slurm_node": "gpu-2", "ansible_processor_vcpus": 64,
              "ansible_memtotal_mb": 515000, "kit_slurm_gpus": 1},
    "cpu-3": {"kit_address": "10.0.0.3", "kit_slurm_node": "cpu-3", "ansible_processor_vcpus": 2,
              "ansible_memtotal_mb": 24105, "kit_slurm_gpus": 0},
}


def render(tmp_path: Path, facts: dict) -> dict[str, str]:
    """slurm.conf and gres.conf as the role's templates render them, through ansible-playbook on this machine."""
    hosts = list(facts)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"kit_cluster": "lab", **local},
        "children": {"kit_primary": {"hosts": {hosts[0]: facts[hosts[0]]}},
                     "kit_workers": {"hosts": {h: facts[h] for h in hosts[1:]}}}}}, sort_keys=False))
    (tmp_path / "render.yml").write_text(yaml.safe_dump([{
        "hosts": "kit_primary", "gather_facts": False, "vars_files": [str(ROLE / "defaults/main.yml")],
        "tasks": [{"ansible.builtin.template": {"src": str(ROLE / "templates" / name), "dest": str(tmp_path / name)}}
                  for name in ("slurm.conf.j2", "gres.conf.j2")]}]))
    r = subprocess.run([ansible_playbook(), "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "render.yml")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "t")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {name: (tmp_path / f"{name}.j2").read_text() for name in ("slurm.conf", "gres.conf")}


def settings(conf: str) -> list[str]:
    return [line for line in conf.splitlines() if line and not line.startswith("#")]


def test_slurm_conf_from_the_hosts_facts(tmp_path):
    conf = settings(render(tmp_path, FACTS)["slurm.conf"])
    assert conf == [
        "ClusterName=lab",
        "SlurmctldHost=gpu-1(10.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "Prolog=/etc/slurm/kit-job-ports-prolog",
        "Epilog=/etc/slurm/kit-job-ports-epilog",
        "PrologFlags=Alloc",
        "ReturnToService=2",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/filetxt",
        "JobCompLoc=/var/log/slurm/jobcomp.txt",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd/%n",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd-%n.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd-%n.log",
        "GresTypes=gpu",
        "NodeName=gpu-1 NodeAddr=10.0.0.1 CPUs=64 RealMemory=489250 Gres=gpu:4 State=UNKNOWN",
        "NodeName=gpu-2 NodeAddr=10.0.0.2 CPUs=64 RealMemory=489250 Gres=gpu:1 State=UNKNOWN",
        "NodeName=cpu-3 NodeAddr=10.0.0.3 CPUs=2 RealMemory=22899 State=UNKNOWN",
        "PartitionName=kit Nodes=gpu-1,gpu-2,cpu-3 Default=YES MaxTime=INFINITE State=UP",
    ]


def test_gres_conf_names_each_nodes_gpus(tmp_path):
    assert settings(render(tmp_path, FACTS)["gres.conf"]) == [
        "NodeName=gpu-1 Name=gpu File=/dev/nvidia[0-3]",
        "NodeName=gpu-2 Name=gpu File=/dev/nvidia0",
    ]


def test_without_gpus_there_are_no_gres(tmp_path):
    cpus = {h: {**f, "kit_slurm_gpus": 0} for h, f in FACTS.items()}
    conf = render(tmp_path, cpus)["slurm.conf"]
    assert "GresTypes" not in conf and "Gres=" not in conf


# ---------------------------------------------------------------- the daemon starter (hosts without systemd)

@pytest.fixture
def daemon(tmp_path):
    """files/daemon.sh driving a stand-in daemon (a `sleep` that writes its pid file); every one it started is
    stopped afterwards."""
    pid_file, watched = tmp_path / "sleep.pid", tmp_path / "daemon.conf"
    watched.write_text("a=1\n")
    start = f"sleep 300 > /dev/null 2>&1 & echo $! > {pid_file}"

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(["sh", str(ROLE / "files/daemon.sh"), "sleep", str(pid_file), str(tmp_path / "log"),
                               str(watched), "--", "sh", "-c", start], capture_output=True, text=True, timeout=60)
    started = []
    yield run, pid_file, watched, started
    for pid in {*started, *([int(pid_file.read_text())] if pid_file.exists() else [])}:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_the_daemon_starts_once_and_restarts_only_when_its_files_change(daemon):
    run, pid_file, watched, started = daemon
    first = run()
    assert (first.returncode, first.stdout) == (0, "started sleep\n"), first.stderr
    started.append(pid := int(pid_file.read_text()))
    again = run()
    assert (again.returncode, again.stdout) == (0, "") and int(pid_file.read_text()) == pid
    watched.write_text("a=2\n")
    changed = run()
    assert (changed.returncode, changed.stdout) == (0, "restarted sleep\n"), changed.stderr
    started.append(new := int(pid_file.read_text()))
    assert new != pid and not alive(pid) and alive(new)
    assert (pid_file.parent / "sleep.pid.kit").stat().st_mode & 0o777 == 0o600


def test_a_stale_pid_file_is_not_taken_for_the_daemon(daemon):
    run, pid_file, _, started = daemon
    pid_file.write_text(f"{os.getpid()}\n")  # a live process, but not the daemon (a pid reused since)
    r = run()
    assert (r.returncode, r.stdout) == (0, "started sleep\n"), r.stderr
    started.append(int(pid_file.read_text()))


def alive(pid: int) -> bool:
    for _ in range(50):  # a killed child of the shell that started it is reaped by init a moment later
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        if Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z":
            return True
        time.sleep(0.1)
    return False
