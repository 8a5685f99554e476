"""How every host sees the workspace at the same path (cluster.storage in kit.yaml).

- copy (default): each host has its own folder; `kit run` sends what changed before a job and
  spreads what the job wrote afterwards (kit/jobs.py).
- sshfs: the secondaries mount the primary's workspace over SSH (FUSE), from the primary's
  container on the cluster port, with the cluster's key and its pinned host keys.
- nfs: the primary exports the workspace (one /etc/exports line, the cluster's addresses only,
  marked `# kit-<cluster>`) and the secondaries mount it; or, with nfs_server, every host
  mounts that existing export.

Mounts are made on the hosts before their containers start, so the containers' bind mount of
the workspace sees them. Every command here is built by a pure function and asserted in
tests/unit/test_storage.py (kit.cluster.steps.sharing runs them on the hosts); `kit down` undoes only what `kit up` added
(recorded in the state).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from kit.config.settings import ClusterConfig
from kit.cluster.place import Place

EXPORTS = "/etc/exports"
# Root in the containers writes checkpoints and logs, so root is not squashed; sync: a rank that
# reads right after rank 0 wrote sees the data.
EXPORT_OPTIONS = "rw,sync,no_subtree_check,no_root_squash"
NFS_MOUNT_OPTIONS = "rw,hard,noatime"
# No directory cache: a checkpoint rewritten on the primary is read whole, not at its old size.
SSHFS_OPTIONS = ("BatchMode=yes", "IdentitiesOnly=yes", "StrictHostKeyChecking=yes", "reconnect",
                 "ServerAliveInterval=15", "ServerAliveCountMax=3", "dir_cache=no")


@dataclass(frozen=True)
class Storage:
    mode: str                 # copy, sshfs or nfs
    cluster: str
    workspace: str
    ssh_port: int
    nfs_server: str = ""      # nfs: an existing export (server:/path); empty: the primary exports

    @classmethod
    def of(cls, cfg: ClusterConfig) -> "Storage":
        return cls(cfg.storage, cfg.name, cfg.workspace_path, cfg.ssh_port, cfg.nfs_server or "")

    @property
    def shared(self) -> bool:
        return self.mode != "copy"

    @property
    def marker(self) -> str:
        return marker(self.cluster)

    def exports(self, primary: bool) -> bool:
        """This host exports the workspace over NFS."""
        return primary and self.mode == "nfs" and not self.nfs_server

    def mounts(self, primary: bool) -> bool:
        """This host mounts the workspace (the primary uses its own folder unless the export is elsewhere)."""
        return self.mode == "sshfs" and not primary or self.mode == "nfs" and (not primary or bool(self.nfs_server))

    def fstypes(self) -> tuple[str, ...]:
        return ("fuse.sshfs",) if self.mode == "sshfs" else ("nfs", "nfs4")

    def source(self, primary_address: str) -> str:
        if self.mode == "sshfs":
            return f"root@{primary_address}:{self.workspace}"
        return self.nfs_server or f"{primary_address}:{self.workspace}"

    def packages(self, primary: bool) -> dict[str, str]:
        """The programs this host needs -> the Debian package of each."""
        need = {}
        if self.mounts(primary):
            need.update({"sshfs": "sshfs"} if self.mode == "sshfs" else {"mount.nfs": "nfs-common"})
        if self.exports(primary):
            need["exportfs"] = "nfs-kernel-server"
        return need


# ---------------------------------------------------------------- facts

def marker(cluster: str) -> str:
    """Ends the cluster's line in /etc/exports."""
    return f"# kit-{cluster}"


def facts_script(cluster: str, workspace: str) -> list[str]:
    """The lines of the facts script that read what is mounted and exported (see kit/steps/facts.py)."""
    q = shlex.quote
    return [
        f"echo '@@kit mount'; findmnt -n -o FSTYPE,SOURCE --mountpoint {q(workspace)} 2>/dev/null | tail -n 1",
        f"echo '@@kit exports'; grep -e {q(f' {marker(cluster)}$')} {EXPORTS} 2>/dev/null",
        "echo '@@kit tools'; for t in sshfs exportfs mount.nfs; do command -v $t >/dev/null 2>&1 && echo $t; done; "
        "test -c /dev/fuse && echo fuse",
    ]


def parse_mount(text: str) -> tuple[str, str] | None:
    fstype, _, source = text.strip().partition(" ")
    return (fstype, source.strip()) if fstype else None


# ---------------------------------------------------------------- what up applies

def export_line(s: Storage, addresses: list[str]) -> str:
    """The workspace, exported to the cluster's addresses only; the same line as ansible's nfs_server role."""
    return f"{s.workspace} {' '.join(f'{a}({EXPORT_OPTIONS})' for a in addresses)} {s.marker}"


def export_command(s: Storage, line: str, exports: str = EXPORTS) -> str:
    """Replace this cluster's line (and only it) in /etc/exports, then re-export."""
    return (f"touch {exports} && sed -i {shlex.quote(f'/ {s.marker}$/d')} {exports} && "
            f"printf '%s\\n' {shlex.quote(line)} >> {exports} && exportfs -ra")


def unexport_command(s: Storage, exports: str = EXPORTS) -> str:
    return f"sed -i {shlex.quote(f'/ {s.marker}$/d')} {exports} && exportfs -ra"


def mount_command(s: Storage, place: Place, primary_address: str) -> str:
    ws = s.workspace
    if s.mode == "sshfs":
        keys = place.ssh_dir  # written by `kit up` before: the cluster's key and known_hosts
        options = [f"IdentityFile={keys}/id_ed25519", f"UserKnownHostsFile={keys}/known_hosts", *SSHFS_OPTIONS]
        argv = ["sshfs", "-F", "/dev/null", "-p", str(s.ssh_port), *(a for o in options for a in ("-o", o)),
                s.source(primary_address), ws]
        return shlex.join(argv)
    return shlex.join(["mount", "-t", "nfs", "-o", NFS_MOUNT_OPTIONS, s.source(primary_address), ws])


def unmount_command(s: Storage) -> str:
    return f"umount {shlex.quote(s.workspace)}"


def problems(s: Storage, tools: frozenset[str], mounted: tuple[str, str] | None, primary: bool,
             primary_address: str) -> list[str]:
    """Why this host cannot share the workspace as configured, in plain words (empty: it can)."""
    found = [f"{tool} is not installed (storage {s.mode} needs it; Debian package {package})"
             for tool, package in s.packages(primary).items() if tool not in tools]
    if s.mode == "sshfs" and s.mounts(primary) and "fuse" not in tools:
        found.append("/dev/fuse is missing (sshfs needs the fuse kernel module: modprobe fuse)")
    if mounted is not None and s.mounts(primary) and not mounted_here(s, mounted, primary_address):
        found.append(f"the workspace {s.workspace} is already a mount of {mounted[1]} ({mounted[0]})")
    return found


def mounted_here(s: Storage, mounted: tuple[str, str] | None, primary_address: str) -> bool:
    """kit's mount is in place already."""
    return mounted is not None and mounted[0] in s.fstypes() and mounted[1] == s.source(primary_address)
