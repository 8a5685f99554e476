"""The lab's hosts as a Slurm cluster, made by `kit prepare --slurm`, for tests/lab/test_slurm.py and bench/slurm.py;
the users who submit to it, and the nodes' own Python (runtime none).

The lab's hosts are namespaces of one machine: they share /etc, /var and /run, so they share one slurm.conf, one
munge key and one munged (its socket is a file); each runs its own slurmd (`slurmd -N <its hostname>`) at its own
address, and the primary runs slurmctld. Everything made here is removed afterwards, whatever happened meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness import Lab, LabHost
from helpers import run_kit

CLUSTER = "slurmlab"
PREPARE = ("prepare", "--slurm", "--hosts", "hosts.txt")
MUNGE_KEY = Path("/etc/munge/munge.key")
# What kit prepare --slurm writes on the lab's (shared) filesystem; the fixture removes what was not there before.
WRITTEN = ["/etc/slurm/slurm.conf", "/etc/slurm/gres.conf", "/etc/slurm/kit-job-ports-prolog",
           "/etc/slurm/kit-job-ports-epilog", "/run/kit-job-ports", "/var/spool/slurmctld", "/var/spool/slurmd",
           "/var/log/slurm/slurmctld.log", "/var/log/slurm/jobcomp.txt", "/run/munge", "/run/munge/munged.pid.kit",
           "/run/slurmctld.pid", "/run/slurmctld.pid.kit", "/var/log/munge/munged.log"]
RECAP = re.compile(r"^(\S+) +: ok=\d+ +changed=(\d+) +unreachable=(\d+) +failed=(\d+)", re.M)


@dataclass
class SlurmLab:
    """The lab's Slurm as tests and benches use it: the lab, the project folder (kit.yaml, hosts.txt), its hosts, their
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
    stop_all([pid], timeout)


def stop_all(pids: list[int], timeout: float = 20) -> None:
    """SIGTERM to every one at once, then wait for them together (bounded); SIGKILL to what is left."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if live_pid(pid)]
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def live_pid(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def firewall_rules(h: LabHost, comment: str) -> list[tuple[str, str]]:
    """(iptables or ip6tables, rule) of the host's INPUT chain that carry the comment."""
    return [(tool, line) for tool in ("iptables", "ip6tables")
            for line in h.run_in(tool, "-S", "INPUT", check=False).stdout.splitlines() if comment in line]


def job_port_rules(h: LabHost) -> list[tuple[str, str]]:
    """(iptables or ip6tables, rule) of the host's raw table that are a Slurm job's (kit's Prolog's)."""
    return [(tool, line) for tool in ("iptables", "ip6tables")
            for line in h.run_in(tool, "-t", "raw", "-S", check=False).stdout.splitlines() if "kit-job-" in line]


HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARK = "# kitlab-slurm"


@contextlib.contextmanager
def names_resolve(lab: Lab):
    """The lab's hosts' names resolve to their addresses, as a Slurm site's DNS makes its nodes' (Horovod's Gloo
    needs its node's own hostname to resolve): lines in the machine's /etc/hosts, which every lab host shares,
    removed afterwards."""
    text = HOSTS_FILE.read_text()
    try:
        HOSTS_FILE.write_text(text + "".join(f"{h.address} {h.name} {HOSTS_MARK}\n" for h in lab.hosts))
        yield
    finally:
        HOSTS_FILE.write_text("".join(line for line in HOSTS_FILE.read_text().splitlines(keepends=True)
                                      if not line.rstrip().endswith(HOSTS_MARK)))


@contextlib.contextmanager
def slurm_cluster(lab: Lab, folder: Path, check: bool = True):
    """The lab's hosts made a Slurm cluster by `kit prepare --slurm` (first `--check`, with check), from a project
    folder of its own; afterwards every daemon it started is stopped and every file it wrote is gone."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kit.yaml").write_text(yaml.safe_dump({"cluster": {"name": CLUSTER}}))
    lab.hosts_file(folder / "hosts.txt")
    nodes = {h.address: h.run_in("hostname", "-s").stdout.strip() for h in lab.hosts}
    s = SlurmLab(lab, folder, lab.hosts, nodes)
    there = {p for p in WRITTEN if Path(p).exists()}
    running = {p for p in pid_files(nodes.values()) if live(p)}
    key = (MUNGE_KEY.read_bytes(), MUNGE_KEY.stat()) if MUNGE_KEY.exists() else None
    with names_resolve(lab):
        try:
            s.check = s.kit(*PREPARE, "--check") if check else None
            s.after_check = {"conf": Path("/etc/slurm/slurm.conf").exists(),
                             "daemons": [str(p) for p in pid_files(nodes.values()) if live(p) and p not in running],
                             "key": MUNGE_KEY.read_bytes() == key[0] if key else not MUNGE_KEY.exists(),
                             "kept key": (lab.home / ".kit" / CLUSTER / "slurm" / "munge.key").exists()}
            s.prepared = s.kit(*PREPARE)
            yield s
        finally:
            cancel_jobs(s)
            stop_all([pid for p in pid_files(nodes.values()) if p not in running and (pid := live(p))])
            # a job step's slurmstepd outlives its slurmd
            stop_all([pid for h in lab.hosts for pid in h.processes(r"^slurmstepd")], timeout=5)
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
                for tool, rule in job_port_rules(h):  # a job's, where its Epilog did not run
                    if rule.startswith("-A ") and " -j kit-job-" in rule:
                        h.run_in(tool, "-t", "raw", *shlex.split(rule.replace("-A", "-D", 1)), check=False)
                for tool, rule in job_port_rules(h):
                    if rule.startswith("-N "):
                        h.run_in(tool, "-t", "raw", "-F", rule.split()[1], check=False)
                        h.run_in(tool, "-t", "raw", "-X", rule.split()[1], check=False)
            shutil.rmtree(lab.home / ".kit" / CLUSTER, ignore_errors=True)


def cancel_jobs(s: SlurmLab, timeout: float = 30) -> None:
    """Every job of the tests cancelled, and gone from the queue (bounded), while the controller still runs."""
    if not live(Path("/run/slurmctld.pid")):
        return
    s.run("squeue -h -o %i | xargs -r scancel", check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and s.run("squeue -h -o %i", check=False).stdout.strip():
        time.sleep(0.5)


# ---------------------------------------------------------------- who submits, and the nodes' Python
#
# Users of the lab (Unix users of the machine, so of every lab host, whose homes are on the shared filesystem) submit
# over SSH to the primary, the login host; the nodes' own Python (runtime none) is kit's images' /opt/venv, copied
# onto storage every node sees, as a site keeps a shared environment.

USERS = ("kitlab-alice", "kitlab-bob")
SHARED = Path("/var/lib/kitlab/slurm-shared")   # the lab's filesystem: every host sees it


def image_tag(project: Path, *args: str, pattern: str) -> str:
    """The image `kit build` makes in the project folder (built already, as a rule: then it only says its tag)."""
    r = run_kit("build", "--no-verify", *args, cwd=project, timeout=40 * 60)
    if r.returncode != 0:
        raise RuntimeError(f"kit build failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return re.search(pattern, r.stdout)[1]


def _export_venv(tag: str, dest: Path, scratch: Path) -> str:
    """`kit export --to venv` of the image onto the shared filesystem, as a site's user makes the nodes' Python; the
    slurm.python_path it records (in a kit.yaml of its own folder)."""
    folder = scratch / f"export-{dest.name}"
    folder.mkdir(parents=True, exist_ok=True)
    r = run_kit("export", "--to", "venv", "-o", str(dest), "--image", tag, cwd=folder, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError(f"kit export --to venv failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return yaml.safe_load((folder / "kit.yaml").read_text())["slurm"]["python_path"]


@contextlib.contextmanager
def node_pythons(project: Path, scratch: Path, tf: bool = True):
    """launcher -> the nodes' Python for it, as `kit export --to venv` makes it: kit's cpu image's (torch, Horovod)
    and, with tf, its tf-cpu image's (a build in `scratch`, which kit's build cache makes quick after
    tests/engine/test_build.py)."""
    shutil.rmtree(SHARED, ignore_errors=True)
    SHARED.mkdir(parents=True)
    SHARED.chmod(0o755)
    try:
        torch = _export_venv(image_tag(project, pattern=r"(kit-horovod:cpu-[0-9a-f]{12})"), SHARED / "torch",
                             scratch)
        found = {"horovod": torch, "torchrun": torch}
        if tf:
            found["tf"] = _export_venv(image_tag(scratch, "--flavor", "tf-cpu",
                                                 pattern=r"(kit-tensorflow:tf-cpu-[0-9a-f]{12})"), SHARED / "tf",
                                       scratch)
        yield found
    finally:
        shutil.rmtree(SHARED, ignore_errors=True)


@contextlib.contextmanager
def lab_users(names=USERS):
    """Unix users whose homes are on the shared filesystem; the lab's sshd takes the lab user's key for any login.
    Their password is `*`: no password opens the account, yet it is not locked (`!`), which sshd without PAM would
    take as a refusal of every key."""
    made = []
    try:
        for user in names:
            subprocess.run(["userdel", "-r", user], capture_output=True)
            subprocess.run(["useradd", "-m", "-d", str(SHARED.parent / "home" / user), "-s", "/bin/bash", "-p", "*",
                            user], check=True, capture_output=True)
            made.append(user)
        yield list(names)
    finally:
        for user in made:
            subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
            # what their jobs left in the machine's /tmp, every lab host's (torchrun's and torch's caches)
            subprocess.run(["find", "/tmp", "-mindepth", "1", "-maxdepth", "1", "-user", user, "-exec", "rm", "-rf",
                            "{}", "+"], capture_output=True)
            subprocess.run(["userdel", "-r", user], capture_output=True)


def user_project(slurm: SlurmLab, folder: Path, user: str, python: str) -> Path:
    """A user's folder with kit.yaml's slurm section: the primary as login host, the nodes' Python."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kit.yaml").write_text(yaml.safe_dump({"slurm": {"login": f"{user}@{slurm.primary.address}",
                                                               "python_path": python}}))
    return folder
