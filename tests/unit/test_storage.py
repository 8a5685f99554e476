"""Shared storage: the exact exports, mounts and removals kit applies (nfs cannot run on the CI kernel;
sshfs and copy also run for real in tests/lab/test_shared_storage.py)."""

import dataclasses
import os
import subprocess
from dataclasses import dataclass, field

import pytest

from kit.cluster.lifecycle import removal_commands
from kit.config.settings import ClusterConfig
from kit.errors import BadInput
from kit.config.hosts import Host
from kit.runners.base import Result
from kit.cluster.state import ClusterState, HostState
from kit.cluster.steps import sharing, storage
from kit.cluster.steps.facts import HostFacts, parse_facts
from kit.cluster.steps.node import Node
from kit.cluster.steps.storage import Storage
from kit.cluster.steps.workspace import spread_plan, written

WS = "/var/lib/kit/lab/workspace"
PRIMARY, WORKERS = "10.0.0.1", ["10.0.0.2", "10.0.0.3"]
NFS = Storage.of(ClusterConfig(name="lab", storage="nfs"))
NAS = Storage.of(ClusterConfig(name="lab", storage="nfs", nfs_server="nas.lab:/export/kit"))
SSHFS = Storage.of(ClusterConfig(name="lab", storage="sshfs"))
COPY = Storage.of(ClusterConfig(name="lab"))
PLACE = ClusterConfig(name="lab").host_place()
EXPORT_LINE = (f"{WS} 10.0.0.2(rw,sync,no_subtree_check,no_root_squash) "
               "10.0.0.3(rw,sync,no_subtree_check,no_root_squash) # kit-lab")


def test_who_exports_and_who_mounts():
    assert (NFS.exports(True), NFS.mounts(True), NFS.mounts(False), NFS.exports(False)) == (True, False, True, False)
    assert (NAS.exports(True), NAS.mounts(True), NAS.mounts(False)) == (False, True, True)
    assert (SSHFS.exports(True), SSHFS.mounts(True), SSHFS.mounts(False)) == (False, False, True)
    assert (COPY.shared, COPY.mounts(False), COPY.exports(True)) == (False, False, False)


def test_nfs_server_export_line_and_commands():
    assert storage.export_line(NFS, WORKERS) == EXPORT_LINE
    assert storage.export_command(NFS, EXPORT_LINE) == (
        "touch /etc/exports && sed -i '/ # kit-lab$/d' /etc/exports && "
        f"printf '%s\\n' '{EXPORT_LINE}' >> /etc/exports && exportfs -ra")
    assert storage.unexport_command(NFS) == "sed -i '/ # kit-lab$/d' /etc/exports && exportfs -ra"


def test_nfs_client_mounts():
    assert storage.mount_command(NFS, PLACE, PRIMARY) == f"mount -t nfs -o rw,hard,noatime 10.0.0.1:{WS} {WS}"
    assert storage.mount_command(NAS, PLACE, PRIMARY) == f"mount -t nfs -o rw,hard,noatime nas.lab:/export/kit {WS}"
    assert storage.unmount_command(NFS) == f"umount {WS}"


def test_sshfs_mount_uses_the_cluster_key_and_pinned_host_keys():
    assert storage.mount_command(SSHFS, PLACE, PRIMARY) == (
        "sshfs -F /dev/null -p 12345 -o IdentityFile=/var/lib/kit/lab/ssh/id_ed25519 "
        "-o UserKnownHostsFile=/var/lib/kit/lab/ssh/known_hosts -o BatchMode=yes -o IdentitiesOnly=yes "
        "-o StrictHostKeyChecking=yes -o reconnect -o ServerAliveInterval=15 -o ServerAliveCountMax=3 "
        f"-o dir_cache=no root@10.0.0.1:{WS} {WS}")


def test_export_edits_only_the_clusters_line(tmp_path):
    """The commands run for real on a copy of /etc/exports; exportfs is a recorder on PATH."""
    exports, calls, bin_dir = tmp_path / "exports", tmp_path / "calls", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "exportfs").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "exportfs").chmod(0o755)
    theirs = "/srv/data 10.9.0.0/16(ro) # kit-lab2\n/home *(rw)\n"
    exports.write_text(theirs + f"{WS} 10.0.0.9(rw) # kit-lab\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def sh(cmd: str) -> None:
        subprocess.run(["sh", "-c", cmd], check=True, env=env)
    sh(storage.export_command(NFS, EXPORT_LINE, str(exports)))
    assert exports.read_text() == theirs + EXPORT_LINE + "\n"
    sh(storage.unexport_command(NFS, str(exports)))
    assert exports.read_text() == theirs
    assert calls.read_text() == "-ra\n-ra\n"


FACTS = (f"@@kit mount\nnfs4 10.0.0.1:{WS}\n@@kit exports\n{EXPORT_LINE}\n"
         "@@kit tools\nexportfs\nmount.nfs\nfuse\n@@kit kitdir\nyes\n")


def test_facts_read_mount_export_and_tools():
    f = parse_facts(0, FACTS)
    assert f.mount == ("nfs4", f"10.0.0.1:{WS}") and f.export == EXPORT_LINE
    assert f.tools == {"exportfs", "mount.nfs", "fuse"}
    assert parse_facts(0, "@@kit mount\n\n@@kit tools\n").mount is None


def test_problems_name_the_missing_package_and_a_foreign_mount():
    none = frozenset()
    assert storage.problems(NFS, none, None, True, PRIMARY) == [
        "exportfs is not installed (storage nfs needs it; Debian package nfs-kernel-server)"]
    assert storage.problems(SSHFS, none, None, False, PRIMARY) == [
        "sshfs is not installed (storage sshfs needs it; Debian package sshfs)",
        "/dev/fuse is missing (sshfs needs the fuse kernel module: modprobe fuse)"]
    assert storage.problems(SSHFS, none, None, True, PRIMARY) == []
    assert storage.problems(NFS, frozenset({"mount.nfs"}), ("nfs4", "other:/x"), False, PRIMARY) == [
        f"the workspace {WS} is already a mount of other:/x (nfs4)"]
    assert storage.problems(NFS, frozenset({"mount.nfs"}), ("nfs4", f"10.0.0.1:{WS}"), False, PRIMARY) == []
    assert storage.problems(COPY, none, ("nfs4", "nas:/home"), False, PRIMARY) == []


@dataclass
class Recorder:
    """Records what kit runs on a host; every command succeeds."""
    host: str = "h"
    sudo: bool = False
    commands: list[str] = field(default_factory=list)

    def run(self, command: str, **kw) -> Result:
        self.commands.append(command)
        return Result(self.host, command, 0)


def node(primary: bool, facts: HostFacts) -> Node:
    n = Node(Host("gpu-1" if primary else "gpu-2", primary=primary), Recorder(), PLACE)
    n.facts = facts
    return n


def test_up_exports_and_mounts_once():
    server, client = node(True, HostFacts(uid=0, docker_version="24.0")), node(False, HostFacts(0, "24.0"))
    sharing.export(server, NFS, EXPORT_LINE)
    assert sharing.mount(client, NFS, PRIMARY) is True
    assert server.runner.commands == [storage.export_command(NFS, EXPORT_LINE)]
    assert client.runner.commands == [f"mount -t nfs -o rw,hard,noatime 10.0.0.1:{WS} {WS}"]
    done = parse_facts(0, FACTS)  # a second `kit up` finds both in place: nothing runs
    again_server, again_client = node(True, done), node(False, done)
    sharing.export(again_server, NFS, EXPORT_LINE)
    assert sharing.mount(again_client, NFS, PRIMARY) is False
    assert again_server.runner.commands == again_client.runner.commands == []


def test_down_removes_what_up_added_and_nothing_else():
    state = ClusterState("lab", "img:1", "sha256:abc", 12345, WS, storage="nfs")
    f = parse_facts(0, FACTS)
    server = HostState("gpu-1", PRIMARY, PLACE, primary=True, made_export=True)
    client = HostState("gpu-2", "10.0.0.2", PLACE, made_mount=True)
    assert [c for c, _ in removal_commands(f, client, state)] == [
        f"umount {WS}", "rm -rf /var/lib/kit/lab/ssh /var/lib/kit/lab/jobs /var/lib/kit/lab/owner"]
    assert [c for c, _ in removal_commands(f, server, state)] == [
        "sed -i '/ # kit-lab$/d' /etc/exports && exportfs -ra", "rm -rf /var/lib/kit/lab/ssh /var/lib/kit/lab/jobs /var/lib/kit/lab/owner"]
    prepared = HostState("gpu-2", "10.0.0.2", PLACE)  # mounted by `kit prepare` (fstab): kit up did not add it
    assert [c for c, _ in removal_commands(f, prepared, state)] == ["rm -rf /var/lib/kit/lab/ssh /var/lib/kit/lab/jobs /var/lib/kit/lab/owner"]


def test_down_removes_the_workspace_it_made_under_a_dead_mount():
    """sshfs ended: `test -d` on the mount fails (transport endpoint is not connected), the folder under it is kit's."""
    state = ClusterState("lab", "img:1", "sha256:abc", 12345, WS, storage="sshfs")
    dead = dataclasses.replace(parse_facts(0, FACTS), workspace_exists=False)
    client = HostState("gpu-2", "10.0.0.2", PLACE, made_mount=True, made_workspace=True)
    assert [c for c, _ in removal_commands(dead, client, state)] == [
        f"umount {WS}", "rm -rf /var/lib/kit/lab/ssh /var/lib/kit/lab/jobs /var/lib/kit/lab/owner",
        f"rmdir {WS} 2>/dev/null || echo kept"]


def test_nfs_server_setting_is_checked():
    from kit.config.settings import ConfigFile, cluster_config
    with pytest.raises(BadInput, match="--nfs-server: is only read with storage: nfs"):
        cluster_config(ConfigFile(), {"nfs_server": "nas:/x"})
    with pytest.raises(BadInput, match="'nas' is not server:/path"):
        cluster_config(ConfigFile(), {"storage": "nfs", "nfs_server": "nas"})
    with pytest.raises(BadInput, match="--storage: 'sftp' is not allowed"):
        cluster_config(ConfigFile(), {"storage": "sftp"})


def test_copy_storage_spreads_what_each_host_wrote():
    before = {"a": {"train.py": "1"}, "b": {"train.py": "1"}, "c": {"train.py": "1", "old.txt": "7"}}
    after = {"a": {"train.py": "1", "ckpt.pt": "2", "log.txt": "a", "__pycache__/m.pyc": "9"},
             "b": {"train.py": "1", "log.txt": "b"},
             "c": {"train.py": "1", "old.txt": "7", "rank2.txt": "3", "log.txt": "c"}}
    assert written(before["a"], after["a"]) == {"ckpt.pt": "2", "log.txt": "a"}
    # log.txt was written on every host: the first host's (rank 0's) copy wins.
    assert spread_plan(before, after) == {"a": (["ckpt.pt", "log.txt"], ["b", "c"]), "c": (["rank2.txt"], ["a", "b"])}
    same = {h: dict(m, **{"ckpt.pt": "2", "log.txt": "a", "rank2.txt": "3"}) for h, m in after.items()}
    assert spread_plan(after, same) == {}
