"""The lab: hosts for tests/lab and bench/, and a user's project folder on them.

Images are built by kit itself from its defaults, exactly as a new user's
`kit build` does on this machine: the base from a registry or, when none
answers, from the machine's Debian mirror; the wheels with the machine's own
pip configuration (torch's CPU wheel from pip's find-links folder, never the
multi-GB CUDA build).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# ---------------------------------------------------------------- lab hosts
#
# A "host" is a network namespace (an address on a private bridge), a mount
# namespace (its own /var/lib/kit: all hosts share one filesystem) and a UTS
# namespace (its own hostname), running its own sshd (the host's login, port
# 22) and its own dockerd. The root namespace plays the user's workstation.
# Everything is named with PREFIX, so leftovers of a killed run are findable,
# and removed by the next run before it starts.
#
# Two labs can run side by side (tests/run runs two lab streams): KIT_LAB_SLOT=1
# gives a lab its own names, subnets, bridges and folders (kitlab2-*, 10.231.78,
# 10.232.1) and its hosts an /etc/slurm of their own, and each lab removes only
# what carries its own names. Slot 0 is the lab the modules that name its
# addresses, or use this machine's local clusters, Slurm or apt, run on
# (tests/lab/conftest.py).

SLOT = int(os.environ.get("KIT_LAB_SLOT", "0"))
PREFIX = "kitlab" if SLOT == 0 else f"kitlab{SLOT + 1}"
SUBNET = f"10.231.{77 + SLOT}"
BRIDGE = f"{PREFIX}-br"
FABRIC_SUBNET = f"10.232.{SLOT}"    # a second network between the hosts (Lab.fabric), which the workstation is not on
FABRIC_BRIDGE = f"{PREFIX}-fab"
FABRIC = "fabric0"                  # its interface's name in a host
DECOY = ("docker0", "172.17.0.1/16")  # what Docker makes on every host: one address, the same everywhere
RUN = Path(f"/run/{PREFIX}")
DATA = Path(f"/var/lib/{PREFIX}")
HOST_LOCAL = ("/var/lib/kit",)  # paths kit expects to be host-local
SLURM_ETC = "/etc/slurm"        # where a Slurm node keeps its configuration (slot 0's Slurm lab writes it)
FORWARD_RULE = ["-i", BRIDGE, "-o", BRIDGE, "-m", "comment", "--comment", PREFIX, "-j", "ACCEPT"]
FABRIC_RULE = ["-i", FABRIC_BRIDGE, "-o", FABRIC_BRIDGE, "-m", "comment", "--comment", PREFIX, "-j", "ACCEPT"]
CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # what sshd gives root's sessions  # cgroup v1's cpu controller, as this machine mounts it


def cpu_group(pid: str = "self") -> Path | None:
    """The cpu cgroup a process is in (the lab's hosts, as started, are in the lab's own); None on a machine without
    cgroup v1's cpu controller."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") and CPU_CGROUPS.is_dir():
            return CPU_CGROUPS / path.lstrip("/")
    return None


def sh(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=120, **kw)


def wait_for(what: str, ok, timeout: float = 60, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(every)
    raise TimeoutError(f"lab: {what} not ready within {timeout:.0f} s")


def read_until(proc: subprocess.Popen, done, timeout: float) -> list[str]:
    """A running kit's stdout lines, read until done(lines) holds (bounded: its end, or timeout, fails the test with
    what it printed)."""
    seen, deadline = [], time.monotonic() + timeout
    while not done(seen):
        line = _line(proc.stdout.fileno())
        assert line and time.monotonic() < deadline, "".join(seen) + proc.stderr.read()
        seen.append(line)
    return seen


def _line(fd: int) -> str:
    """One line read from the pipe's descriptor a byte at a time: proc.stdout.readline() would buffer what follows it,
    and communicate() afterwards reads the descriptor, not that buffer, so lines that came in the same chunk were lost
    (a Slurm test's `checkpoint saved`, printed a moment after the `start` read_until waited for)."""
    line = bytearray()
    while not line.endswith(b"\n") and (byte := os.read(fd, 1)):
        line += byte
    return line.decode(errors="replace")


def interrupt(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """Ctrl-C to a running kit, and the rest of its (stdout, stderr) once it ended; one that has not ended within
    the timeout fails the test with where each of its threads is (kit started with PYTHONFAULTHANDLER=1: SIGABRT
    prints them)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"kit did not end {timeout:g} s after Ctrl-C:\n{out[-3000:]}\n{err[-8000:]}") from None


class LabHost:
    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"{PREFIX}-h{index}"
        self.address = f"{SUBNET}.{10 + index}"
        self.run = RUN / self.name
        self.data = DATA / self.name
        self.docker_sock = self.run / "docker.sock"
        self.fabric_address = f"{FABRIC_SUBNET}.{10 + index}"

    @property
    def nsenter(self) -> list[str]:
        return ["nsenter", f"--net=/var/run/netns/{self.name}", f"--mount={self.run}.mnt", f"--uts={self.run}.uts"]

    def run_in(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A command on this host, as its own processes see the world."""
        return sh(*self.nsenter, *argv, check=check)

    def docker(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh("docker", "-H", f"unix://{self.docker_sock}", *argv, check=check)

    def processes(self, pattern: str) -> list[int]:
        """PIDs of this host's processes (by network namespace) whose command line matches a regex."""
        mine = os.stat(f"/var/run/netns/{self.name}").st_ino
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if os.stat(proc / "ns/net").st_ino == mine and re.search(
                        pattern, (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")):
                    found.append(int(proc.name))
            except OSError:
                continue
        return found

    def engine_cpu(self) -> float:
        """CPU seconds its Docker engine has used so far, with the children it reaped (the processes that untar
        layers): what a `docker load` costs this host, read before and after."""
        pid = (self.run / "docker.pid").read_text().strip()
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime

    def own_kit_dir(self) -> bool:
        """Its /var/lib/kit is still its own folder (the lab's bind mount in its mount namespace), not the one
        every namespace shares. Removing /var/lib/kit anywhere detaches that mount (Linux >= 3.18)."""
        source = self.run_in("findmnt", "-n", "-o", "SOURCE", "--mountpoint", "/var/lib/kit", check=False).stdout
        return source.strip().endswith(f"[{self.data}/kit]")

    def kit_files(self) -> list[str]:
        """Everything under /var/lib/kit as this host sees it."""
        out = self.run_in("find", "/var/lib/kit", "-mindepth", "1").stdout
        return sorted(out.split())

    def listening(self, port: int) -> bool:
        tcp = self.run_in("cat", "/proc/net/tcp", "/proc/net/tcp6").stdout
        return any(len(c) > 3 and c[3] == "0A" and c[1].endswith(f":{port:04X}")
                   for c in (line.split() for line in tcp.splitlines()))


class Lab:
    """N lab hosts and a user's home whose SSH knows them. Use as a context manager."""

    def __init__(self, count: int, root: Path) -> None:
        self.hosts = [LabHost(i) for i in range(1, count + 1)]
        self.home = root / "home"
        self.made_mountpoints: list[Path] = []

    # -- lifecycle
    def __enter__(self) -> "Lab":
        cleanup_leftovers()
        try:
            self._network()
            self._user()
            for h in self.hosts:
                self._host(h)
            for h in self.hosts:
                wait_for(f"{h.name} dockerd", lambda h=h: h.docker("version", check=False).returncode == 0)
                wait_for(f"{h.name} sshd", lambda h=h: self.ssh(h, "true", check=False).returncode == 0)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        cleanup_leftovers()
        for p in self.made_mountpoints:
            with _quiet():
                p.rmdir()

    def _network(self) -> None:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        # Bridged lab traffic must not meet the workstation's firewall (dockerd's FORWARD DROP).
        sh("iptables", "-I", "FORWARD", *FORWARD_RULE)
        RUN.mkdir(parents=True, exist_ok=True)
        sh("mount", "--bind", str(RUN), str(RUN))  # namespaces persist as files on a private mount
        sh("mount", "--make-private", str(RUN))
        for path in map(Path, HOST_LOCAL):
            if not path.exists():
                path.mkdir(parents=True)
                self.made_mountpoints.append(path)

    def _user(self) -> None:
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(parents=True, mode=0o700)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lab-user", "-f", str(ssh_dir / "id_ed25519"))

    def _host(self, h: LabHost) -> None:
        veth, peer = f"{PREFIX}-v{h.index}", f"{PREFIX}-p{h.index}"
        sh("ip", "netns", "add", h.name)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        sh("ip", "link", "set", peer, "netns", h.name)
        for cmd in (["link", "set", peer, "name", "eth0"], ["addr", "add", f"{h.address}/24", "dev", "eth0"],
                    ["link", "set", "eth0", "up"], ["link", "set", "lo", "up"]):
            sh("ip", "-n", h.name, *cmd)
        h.run.mkdir(parents=True)
        for path in ("kit", "docker", "exec"):
            (h.data / path).mkdir(parents=True, exist_ok=True)
        for kind in ("mnt", "uts"):
            Path(f"{h.run}.{kind}").touch()
        # A second lab's hosts are no Slurm nodes, whatever the first lab's Slurm (tests/lab/slurmlab.py) writes in
        # the machine's /etc/slurm meanwhile: theirs is an empty folder of their own (kit's preflight reads a node of
        # the Slurm cluster kit prepared from there, and would refuse them).
        own_slurm = f" && mount -t tmpfs -o ro,size=64k,mode=755 {PREFIX}-slurm {SLURM_ETC}" \
            if SLOT and Path(SLURM_ETC).is_dir() else ""
        sh("unshare", f"--mount={h.run}.mnt", f"--uts={h.run}.uts", "--propagation", "private",
           "sh", "-c", f"hostname {h.name} && mount --bind {h.data}/kit /var/lib/kit{own_slurm}")
        self._own_sysfs(h)
        self._sshd(h)
        self._dockerd(h)

    def _own_sysfs(self, h: LabHost) -> None:
        """The host's /sys/class/net shows its own interfaces (their speed, MTU, state), as a real host's does: a sysfs
        mounted from its network namespace, whose net folders are laid over the machine's /sys in the host's mount
        namespace. (A new /sys over the old one would hide the cgroup mounts its dockerd needs.)"""
        own = h.run / "sys"
        own.mkdir()
        sh(*h.nsenter, "sh", "-c", f"mount -t sysfs kitlab-sysfs {own} && "
                                   f"mount --bind {own}/devices/virtual/net /sys/devices/virtual/net && "
                                   f"mount --bind {own}/class/net /sys/class/net")

    def _sshd(self, h: LabHost) -> None:
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(h.run / "host_key"))
        shutil.copy(self.home / ".ssh/id_ed25519.pub", h.run / "authorized_keys")
        self._sshd_config(h)
        Path("/run/sshd").mkdir(exist_ok=True)
        with open(self.home / ".ssh/known_hosts", "a") as f:
            f.write(f"{h.address} {(h.run / 'host_key.pub').read_text()}")
        self._daemon(h, "sshd", ["/usr/sbin/sshd", "-f", str(h.run / "sshd_config"), "-D", "-e"])

    def _sshd_config(self, h: LabHost, env: str = "") -> None:
        (h.run / "sshd_config").write_text(f"""\
Port 22
ListenAddress {h.address}
HostKey {h.run}/host_key
AuthorizedKeysFile {h.run}/authorized_keys
PidFile {h.run}/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
SetEnv DOCKER_HOST=unix://{h.docker_sock} {env}
Subsystem sftp /usr/lib/openssh/sftp-server
""")

    @contextlib.contextmanager
    def clock_off(self, h: LabHost, offset: str):
        """Every program a login on `h` starts sees a clock `offset` off (libfaketime, e.g. "+10m"): the hosts share
        this machine's kernel clock, which a test must not move. sshd restarts with its host key kept."""
        lib = next(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
        try:
            self._restart_sshd(h, f"LD_PRELOAD={lib} FAKETIME={offset} FAKETIME_DONT_FAKE_MONOTONIC=1")
            yield
        finally:
            self._restart_sshd(h)

    @contextlib.contextmanager
    def nvidia(self, hosts: list[LabHost], driver: str, gpus: int = 4, runtime: bool = False):
        """These hosts report `gpus` NVIDIA GPUs of driver `driver`: a stand-in `nvidia-smi` (tests/helpers.py) first on
        the PATH their sshd gives its sessions, and with `runtime`, a Docker runtime named nvidia (runc under that
        name: no GPU container can run here). Afterwards nothing of it is left: the script, the PATH, the runtime."""
        from helpers import nvidia_smi_stand_in

        given = []  # hosts whose dockerd got the runtime
        try:
            for h in hosts:
                folder = h.run / "nvidia"
                folder.mkdir(exist_ok=True)
                (folder / "nvidia-smi").write_text(nvidia_smi_stand_in(gpus, driver))
                (folder / "nvidia-smi").chmod(0o755)
                self._restart_sshd(h, f"PATH={folder}:{ROOT_PATH}")
                if runtime:
                    given.append(h)
                    self.stop_dockerd(h)
                    self.start_dockerd(h, "--add-runtime", "nvidia=runc")
            yield
        finally:
            for h in hosts:
                if h in given:
                    self.stop_dockerd(h)
                    self.start_dockerd(h)
                self._restart_sshd(h)
                shutil.rmtree(h.run / "nvidia", ignore_errors=True)

    def _restart_sshd(self, h: LabHost, env: str = "") -> None:
        _stop(h.run / "sshd.process")
        self._sshd_config(h, env)
        self._daemon(h, "sshd", ["/usr/sbin/sshd", "-f", str(h.run / "sshd_config"), "-D", "-e"])
        wait_for(f"{h.name} sshd", lambda: h.listening(22))

    def _dockerd(self, h: LabHost, *extra: str) -> None:
        self._daemon(h, "dockerd", ["dockerd", "--data-root", str(h.data / "docker"), "--exec-root",
                                    str(h.data / "exec"), "--pidfile", str(h.run / "docker.pid"), "-H",
                                    f"unix://{h.docker_sock}", "--iptables=false", "--ip-masq=false",
                                    "--bridge=none", *extra])

    def stop_dockerd(self, h: LabHost) -> None:
        """The host's Docker engine stops (its containers with it), as `systemctl stop docker` does."""
        _stop(h.run / "dockerd.process")
        wait_for(f"{h.name} dockerd to stop", lambda: h.docker("version", check=False).returncode != 0)

    def start_dockerd(self, h: LabHost, *extra: str) -> None:
        self._dockerd(h, *extra)
        wait_for(f"{h.name} dockerd", lambda: h.docker("version", check=False).returncode == 0)

    def _daemon(self, h: LabHost, name: str, argv: list[str]) -> None:
        log = open(h.data / f"{name}.log", "ab")
        proc = subprocess.Popen([*h.nsenter, *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
        (h.run / f"{name}.process").write_text(str(proc.pid))

    # -- what tests use
    def ssh(self, h: LabHost, command: str, check: bool = True) -> subprocess.CompletedProcess:
        """The user's own ssh to a lab host (strict host-key checking, the user's known_hosts)."""
        return sh("ssh", "-F", "none", "-i", str(self.home / ".ssh/id_ed25519"), "-o", "BatchMode=yes",
                  "-o", f"UserKnownHostsFile={self.home}/.ssh/known_hosts", "-o", "StrictHostKeyChecking=yes",
                  "-o", "ConnectTimeout=5", f"root@{h.address}", command, check=check)

    @property
    def env(self) -> dict[str, str]:
        """Environment for kit as this lab's user."""
        return {"HOME": str(self.home), "KIT_HOME": str(self.home / ".kit")}

    @property
    def ansible_env(self) -> dict[str, str]:
        """Also for the OpenSSH that Ansible runs: it reads the login's home, not $HOME, so name the files.
        The hosts are this machine: the Python that Ansible's discovery may find first here is pyenv's shim."""
        return {**self.env, "ANSIBLE_PRIVATE_KEY_FILE": str(self.home / ".ssh/id_ed25519"),
                "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
                "ANSIBLE_SSH_ARGS": f"-o UserKnownHostsFile={self.home}/.ssh/known_hosts -o StrictHostKeyChecking=yes"}

    def leftovers(self, cluster: str, port: int = 12345, *, strict: bool = True) -> dict[str, list[str]]:
        """What of a cluster is still on the lab: per host its containers, networks, kit's folders and processes
        (sshd on the cluster port, sshfs of its workspace); and its state folder here. Not strict: a workspace
        that holds files is not counted (kit down keeps it on purpose)."""
        found: dict[str, list[str]] = {}
        label = f"label=io.kit.cluster={cluster}"
        for h in self.hosts:
            folder = f"/var/lib/kit/{cluster}"
            kept = h.run_in("find", folder, "-mindepth", "1", "-maxdepth", "1", check=False).stdout.split()
            if not strict and h.run_in("sh", "-c", f"ls -A {folder}/workspace | grep -q .", check=False).returncode == 0:
                kept.remove(f"{folder}/workspace")
            things = [f"container {n}" for n in h.docker("ps", "-aq", "--filter", label, "--format", "{{.Names}}",
                                                            check=False).stdout.split()]
            things += [f"network {n}" for n in h.docker("network", "ls", "-q", "--filter", label, "--format",
                                                       "{{.Name}}", check=False).stdout.split()]
            things += [f"folder {f}" for f in kept]
            things += [f"process {pid}" for pid in h.processes(rf"sshd .*-p {port}\b|^sshfs .*{folder}")]
            if things:
                found[h.name] = things
        if (self.home / ".kit" / cluster).exists():
            found["control machine"] = [f"folder {self.home / '.kit' / cluster}"]
        return found

    def remove_cluster(self, cluster: str) -> None:
        """Whatever of a cluster is left on the lab hosts and in the lab user's state, removed by force."""
        label = f"label=io.kit.cluster={cluster}"
        for h in self.hosts:
            names = h.docker("ps", "-aq", "--filter", label, check=False).stdout.split()
            if names:
                h.docker("rm", "-f", *names, check=False)
            networks = h.docker("network", "ls", "-q", "--filter", label, check=False).stdout.split()
            if networks:
                h.docker("network", "rm", *networks, check=False)
            folder = f"/var/lib/kit/{cluster}"
            h.run_in("sh", "-c", f"grep -o ' {folder}[^ ]*' /proc/mounts | xargs -r -n1 umount -l; rm -rf {folder}",
                     check=False)
        shutil.rmtree(self.home / ".kit" / cluster, ignore_errors=True)

    def clusters(self) -> set[str]:
        """Every cluster that has a container, a network or a folder on a lab host."""
        names = set()
        for h in self.hosts:
            for kind in (["ps", "-a"], ["network", "ls"]):
                out = h.docker(*kind, "--filter", "label=io.kit.cluster",
                               "--format", '{{.Label "io.kit.cluster"}}', check=False).stdout
                names.update(out.split())
            names.update(Path(f).name for f in h.run_in("find", "/var/lib/kit", "-mindepth", "1", "-maxdepth", "1",
                                                        check=False).stdout.split())
        return names

    def hosts_file(self, path: Path, hosts: list[LabHost] | None = None) -> Path:
        path.write_text("".join(f"{h.address}\n" for h in hosts or self.hosts))
        return path

    def trust(self, h: LabHost) -> None:
        """The lab user's known_hosts holds the host's current key again (after a rekey)."""
        known = self.home / ".ssh" / "known_hosts"
        lines = [line for line in known.read_text().splitlines() if not line.startswith(h.address + " ")]
        known.write_text("\n".join(lines + [f"{h.address} {(h.run / 'host_key.pub').read_text().strip()}"]) + "\n")

    def rekey(self, h: LabHost) -> None:
        """Give the host's own sshd a new host key (a reinstalled host, or an impostor)."""
        (h.run / "host_key").unlink()
        (h.run / "host_key.pub").unlink()
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(h.run / "host_key"))

    def shape(self, rate: str, hosts: list[LabHost] | None = None) -> None:
        """Every host's link (or these hosts') limited to `rate` (e.g. 1gbit, 100mbit) in both directions, like a
        real LAN: a token bucket on both ends of its veth (tbf: this machine's kernel has no netem)."""
        for h in hosts or self.hosts:
            sh("tc", "qdisc", "replace", "dev", f"{PREFIX}-v{h.index}", "root", *token_bucket(rate))
            sh("tc", "-n", h.name, "qdisc", "replace", "dev", "eth0", "root", *token_bucket(rate))

    @contextlib.contextmanager
    def cpu_per_host(self, cores: float):
        """Each host runs on `cores` of a CPU of its own, as separate machines do, instead of all of them sharing this
        machine's cores as they come: every process in its namespace (its sshd and dockerd, and from then on what
        they start: a login's relay, `docker load`) goes into a cgroup of its own with that CPU quota. No limit
        after."""
        if cpu_group() is None:
            raise RuntimeError(f"lab: a CPU quota per host needs cgroup v1's cpu controller at {CPU_CGROUPS}")
        try:
            for h in self.hosts:
                group = cpu_group() / h.name
                group.mkdir()
                (group / "cpu.cfs_period_us").write_text("100000")
                (group / "cpu.cfs_quota_us").write_text(str(round(cores * 100000)))  # the kernel takes >= 1000
                for pid in sh("ip", "netns", "pids", h.name).stdout.split():
                    with _quiet():  # one that ended since
                        if cpu_group(pid) == cpu_group():  # not a container's (Docker gave it a group of its own)
                            (group / "cgroup.procs").write_text(pid)
            yield
        finally:
            release_cpu_groups()

    def forget_images(self) -> None:
        """No host holds any image: the next up sends every layer."""
        for h in self.hosts:
            for tag in h.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split():
                h.docker("image", "rm", "-f", tag, check=False)

    def shape_uplink(self, rate: str) -> None:
        """The workstation's own link to the lab limited to `rate`, what it sends: a token bucket on the bridge, whose
        qdisc holds what the root namespace sends into it (what the hosts send each other goes port to port)."""
        sh("tc", "qdisc", "replace", "dev", BRIDGE, "root", *token_bucket(rate))

    def unshape(self) -> None:
        """Every host's link (and fabric link), and the workstation's, back to the veth's own speed."""
        for h in self.hosts:
            sh("tc", "qdisc", "del", "dev", f"{PREFIX}-v{h.index}", "root", check=False)
            sh("tc", "-n", h.name, "qdisc", "del", "dev", "eth0", "root", check=False)
            sh("tc", "qdisc", "del", "dev", f"{PREFIX}-f{h.index}", "root", check=False)
            sh("tc", "-n", h.name, "qdisc", "del", "dev", FABRIC, "root", check=False)
        sh("tc", "qdisc", "del", "dev", BRIDGE, "root", check=False)

    def fabric(self, decoys: bool = True) -> None:
        """A second network between the hosts, as GPU servers have beside their management network: a bridge of its
        own with no address of the workstation's (so only the hosts reach it), each host's end named fabric0 with an
        address on FABRIC_SUBNET; with decoys, every host also gets a docker0 with the same address. Both stay until
        no_fabric() (or the lab's end)."""
        sh("ip", "link", "add", FABRIC_BRIDGE, "type", "bridge")
        sh("ip", "link", "set", FABRIC_BRIDGE, "up")
        sh("iptables", "-I", "FORWARD", *FABRIC_RULE)
        for h in self.hosts:
            veth, peer = f"{PREFIX}-f{h.index}", f"{PREFIX}-g{h.index}"
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", veth, "master", FABRIC_BRIDGE, "up")
            sh("ip", "link", "set", peer, "netns", h.name)
            for cmd in (["link", "set", peer, "name", FABRIC], ["addr", "add", f"{h.fabric_address}/24", "dev", FABRIC],
                        ["link", "set", FABRIC, "up"]):
                sh("ip", "-n", h.name, *cmd)
            if decoys:
                name, address = DECOY
                for cmd in (["link", "add", name, "type", "bridge"], ["addr", "add", address, "dev", name],
                            ["link", "set", name, "up"]):
                    sh("ip", "-n", h.name, *cmd)

    def no_fabric(self) -> None:
        """The fabric and the decoys gone again."""
        for h in self.hosts:
            sh("ip", "-n", h.name, "link", "del", FABRIC, check=False)
            sh("ip", "-n", h.name, "link", "del", DECOY[0], check=False)
        sh("ip", "link", "del", FABRIC_BRIDGE, check=False)
        sh("iptables", "-D", "FORWARD", *FABRIC_RULE, check=False)

    def fabric_link(self, h: LabHost, up: bool) -> None:
        """The host's fabric port down (a cable pulled, a port disabled) or up again."""
        sh("ip", "-n", h.name, "link", "set", FABRIC, "up" if up else "down")

    def shape_fabric(self, rate: str, hosts: list[LabHost] | None = None) -> None:
        """The fabric's links (of these hosts) limited to `rate`, both ways, as shape() does the hosts' network."""
        for h in hosts or self.hosts:
            sh("tc", "qdisc", "replace", "dev", f"{PREFIX}-f{h.index}", "root", *token_bucket(rate))
            sh("tc", "-n", h.name, "qdisc", "replace", "dev", FABRIC, "root", *token_bucket(rate))

    def cut(self, h: LabHost) -> None:
        """The host's link goes down (a pulled cable): nothing reaches it, nothing leaves it."""
        sh("ip", "-n", h.name, "link", "set", "eth0", "down")

    def mend(self, h: LabHost) -> None:
        sh("ip", "-n", h.name, "link", "set", "eth0", "up")
        wait_for(f"{h.name} sshd after its link came back", lambda: self.ssh(h, "true", check=False).returncode == 0)

    def wall_off(self, h: LabHost) -> None:
        """The host's firewall refuses new connections from the other lab hosts to its ephemeral ports (where kit's
        image relay listens), as a firewall that lets in only SSH and the cluster port would; the workstation, SSH
        and the cluster port still get through."""
        low, high = h.run_in("cat", "/proc/sys/net/ipv4/ip_local_port_range").stdout.split()
        for other in self.hosts:
            if other is not h:
                h.run_in("iptables", "-I", "INPUT", "-s", other.address, "-p", "tcp", "--syn", "--dport",
                         f"{low}:{high}", "-j", "DROP")

    def open_up(self, h: LabHost) -> None:
        """Every firewall rule of the host gone (wall_off's, block's)."""
        h.run_in("iptables", "-F", "INPUT")

    def block(self, h: LabHost) -> None:
        """The host's firewall drops every packet that comes in."""
        h.run_in("iptables", "-I", "INPUT", "-j", "DROP")

    def unblock(self, h: LabHost) -> None:
        h.run_in("iptables", "-D", "INPUT", "-j", "DROP", check=False)


IMAGE_SUMMARY = re.compile(
    r"sent (\d+) of the image's (\d+) layers \(([\d,.]+) MB compressed; the image is ([\d.]+) GB\) to (\d+) hosts? in "
    r"([\d.]+) s \(every byte was there after ([\d.]+) s\): ([\d,.]+) MB left this machine, ([\d,.]+) MB went from "
    r"host to host")


def image_summary(output: str) -> dict | None:
    """The figures of kit up's image summary line, or None when it printed none."""
    m = IMAGE_SUMMARY.search(output)
    if not m:
        return None
    mb = lambda i: float(m[i].replace(",", ""))  # noqa: E731
    return {"layers": int(m[1]), "of": int(m[2]), "stream_mb": mb(3), "image_gb": float(m[4]), "hosts": int(m[5]),
            "seconds": float(m[6]), "arrived": float(m[7]), "from_here_mb": mb(8), "between_mb": mb(9)}


def token_bucket(rate: str) -> list[str]:
    """tc's tbf arguments for `rate` (e.g. 1gbit): a bucket of 10 ms at that rate, packets queued for up to 50 ms."""
    m = re.fullmatch(r"(\d+)([kmg])bit", rate)
    if not m:
        raise ValueError(f"rate {rate!r}: expected e.g. 100mbit or 1gbit")
    bits = int(m[1]) * {"k": 10**3, "m": 10**6, "g": 10**9}[m[2]]
    return ["tbf", "rate", rate, "burst", str(max(bits // 8 // 100, 16384)), "latency", "50ms"]


class ClusterUpFailed(AssertionError):
    """`kit up` of a test's cluster failed; its output is the message."""


class LeftBehind(AssertionError):
    """`kit down` did not remove everything of a cluster from the lab hosts (the lab removed it)."""


@contextlib.contextmanager
def lab_cluster(lab: "Lab", project: Path, name: str, *up_args: str, port: int = 12345):
    """A test module's cluster: `kit up` in the project, the block, then `kit down`, also when up failed half-way or
    the block raised. What kit down leaves on a host is removed by the lab, and is a failure of its own (LeftBehind),
    so no module ever inherits another's containers, keys or ports."""
    from helpers import run_kit

    up = run_kit("up", *up_args, cwd=project, env=lab.env, timeout=900)
    try:
        if up.returncode != 0:
            raise ClusterUpFailed(f"kit up {' '.join(up_args)} failed:\n{up.stdout[-3000:]}{up.stderr[-3000:]}")
        yield up
    finally:
        down = run_kit("down", cwd=project, env=lab.env, timeout=600)
        left = lab.leftovers(name, port, strict=False)  # a workspace holding the jobs' files is kept on purpose
        lab.remove_cluster(name)
        problems = [f"kit down failed:\n{down.stdout[-2000:]}{down.stderr[-2000:]}"] if down.returncode else []
        problems += [f"left on the lab after kit down: {left}"] if left else []
        if problems:
            raise LeftBehind("\n".join(problems))


def kit(project: Path, lab: Lab, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """A kit command in a project folder, as the lab's user (its SSH config, its known hosts)."""
    from helpers import run_kit

    return run_kit(*args, cwd=project, env=lab.env, timeout=timeout)


def make_project(folder: Path, lab: Lab, cluster: str, build: dict | None = None, image: bool = True,
                 **settings) -> Path:
    """A user's project folder for the lab: kit.yaml with the cluster's settings (and `build` settings when given:
    else kit's defaults, the image cli/demo builds), hosts.txt, the image built (unless not `image`). The build runs
    as the machine's own user would run it (its home, its pip configuration); the lab's user only matters for the
    hosts."""
    import yaml
    from helpers import run_kit

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kit.yaml").write_text(yaml.safe_dump({**({"build": build} if build else {}),
                                                     "cluster": {"name": cluster, **settings}}))
    lab.hosts_file(folder / "hosts.txt")
    if not image:
        return folder
    r = run_kit("build", "--no-verify", cwd=folder, timeout=40 * 60)
    if r.returncode != 0:
        raise RuntimeError(f"kit build failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return folder


def timed_kit(lab: Lab, project: Path, *args: str) -> tuple[float, str]:
    """(seconds, output) of a kit command that must succeed: for bench/."""
    from helpers import run_kit

    started = time.monotonic()
    r = run_kit(*args, cwd=project, env=lab.env, timeout=3600)
    seconds = time.monotonic() - started
    if r.returncode != 0:
        sys.exit(f"kit {' '.join(args)} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return seconds, r.stdout


@contextlib.contextmanager
def bench_cluster(rate: str | None = None, hosts: int = 3, name: str = "bench"):
    """For bench/: a lab of `hosts` hosts with a cluster up on all of them and every link shaped to `rate` (e.g.
    1gbit) when given; yields (lab, project). The cluster and the lab are removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as work, Lab(hosts, Path(work)) as lab:
        project = make_project(Path(work) / "project", lab, name)
        timed_kit(lab, project, "up", "--hosts", "hosts.txt")
        try:
            if rate:
                lab.shape(rate)
            yield lab, project
        finally:
            lab.unshape()
            timed_kit(lab, project, "down")


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


# What the tests make on this machine's own engine: local clusters named kitlab-* and the compose project.
LOCAL_PREFIXES = (f"kit-{PREFIX}-", f"{PREFIX}-compose")


def local_leftovers() -> dict[str, list[str]]:
    """Containers, networks, volumes and folders on this machine that the tests' local clusters made."""
    def names(*argv: str) -> list[str]:
        return [n for n in sh(*argv, check=False).stdout.split() if n.startswith(LOCAL_PREFIXES)]
    return {"containers": names("docker", "ps", "-a", "--format", "{{.Names}}"),
            "networks": names("docker", "network", "ls", "--format", "{{.Name}}"),
            "volumes": names("docker", "volume", "ls", "--format", "{{.Name}}"),
            "folders": [str(d) for d in Path(HOST_LOCAL[0]).glob(f"{PREFIX}-*/local-*")]}


def remove_local_clusters() -> None:
    found = local_leftovers()
    if found["containers"]:
        sh("docker", "rm", "-f", *found["containers"], check=False)
    for kind in ("network", "volume"):
        if found[kind + "s"]:
            sh("docker", kind, "rm", *found[kind + "s"], check=False)
    for folder in Path(HOST_LOCAL[0]).glob(f"{PREFIX}-*"):
        shutil.rmtree(folder, ignore_errors=True)


def throttle(h, pattern: str, cores: float) -> None:
    """The host's processes that match `pattern` get `cores` of a CPU from now on (a cgroup of their own, as
    Lab.cpu_per_host makes one, one group a host; release_cpu_groups takes them back)."""
    group = cpu_group() / h.name
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text("100000")
    (group / "cpu.cfs_quota_us").write_text(str(round(cores * 100000)))
    for pid in h.processes(pattern):
        with contextlib.suppress(OSError):
            (group / "cgroup.procs").write_text(str(pid))


def release_cpu_groups() -> None:
    """The lab hosts' CPU quotas (Lab.cpu_per_host) removed: their processes back in the root group, the groups gone."""
    for group in cpu_group().glob(f"{PREFIX}-*") if cpu_group() else ():
        for _ in range(10):  # a process forked while they moved stays behind once: move again
            with _quiet():
                for pid in (group / "cgroup.procs").read_text().split():
                    with _quiet():
                        (group.parent / "cgroup.procs").write_text(pid)
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def cleanup_leftovers() -> None:
    """Remove every lab thing a run (this one, or one that was killed) left behind."""
    remove_local_clusters()
    release_cpu_groups()
    for proc_file in RUN.glob("*/*.process") if RUN.exists() else []:
        _stop(proc_file)
    if RUN.exists():
        for ns_file in list(RUN.glob("*.mnt")) + list(RUN.glob("*.uts")):
            sh("umount", str(ns_file), check=False)
        sh("umount", str(RUN), check=False)
    for ns in sh("ip", "netns", "list", check=False).stdout.split("\n"):
        if ns.startswith(f"{PREFIX}-"):  # what still runs there (an sshfs mount's daemon) goes with it
            for pid in sh("ip", "netns", "pids", ns.split()[0], check=False).stdout.split():
                with _quiet():
                    os.kill(int(pid), signal.SIGKILL)
            sh("ip", "netns", "del", ns.split()[0], check=False)
    # The bridge, and the two ends of a host's veth pair when a run was killed before it moved one into the host.
    for link in json.loads(sh("ip", "-j", "link", "show", check=False).stdout or "[]"):
        if link["ifname"].startswith(f"{PREFIX}-"):
            sh("ip", "link", "del", link["ifname"], check=False)
    for rule in (FORWARD_RULE, FABRIC_RULE):
        for _ in range(10):  # the lab's own firewall rules, however many runs left them
            if sh("iptables", "-D", "FORWARD", *rule, check=False).returncode != 0:
                break
    for root in (RUN, DATA):
        if root.exists():
            for d in root.glob("*/exec"):  # overlay mounts of a dockerd that died hard
                sh("sh", "-c", f"grep -o ' {d}[^ ]*' /proc/mounts | xargs -r -n1 umount -l", check=False)
            shutil.rmtree(root, ignore_errors=True)


def _stop(proc_file: Path, timeout: float = 20) -> None:
    try:
        pid = int(proc_file.read_text())
        os.killpg(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it when it is our own child, or it lingers as a zombie
        except ChildProcessError:
            pass
        try:
            os.killpg(pid, 0)
        except OSError:
            return
        time.sleep(0.2)
    with _quiet():
        os.killpg(pid, signal.SIGKILL)
