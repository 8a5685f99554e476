"""The shared workspace's steps on a host (kit.cluster.steps.storage builds their commands): the primary's NFS export, a
secondary's mount. Each is skipped when the host's facts say it is done."""

from __future__ import annotations

from kit.runners import SSHD_READY_S, run_until_ok
from kit.cluster.steps import storage
from kit.cluster.steps.node import Node
from kit.cluster.steps.storage import Storage


def export(node: Node, s: Storage, line: str) -> None:
    if node.facts.export == line:
        return
    node.runner.run(storage.export_command(s, line), changes=True).check(
        f"cannot export {s.workspace} over NFS", hint="check that nfs-kernel-server runs (systemctl status nfs-server)")
    node.changes.append(f"exported {s.workspace} to the cluster in {storage.EXPORTS}")


def mount(node: Node, s: Storage, primary_address: str) -> bool:
    """Mount the shared workspace unless it is; True when kit mounted it now."""
    if storage.mounted_here(s, node.facts.mount, primary_address):
        return False
    # sshfs: the primary's container was just started, and its sshd may need a moment.
    r = run_until_ok(node.runner, storage.mount_command(s, node.place, primary_address),
                     SSHD_READY_S if s.mode == "sshfs" else 0, changes=True)
    r.check(f"cannot mount {s.source(primary_address)} at {s.workspace}",
            hint="check that the primary is reachable on the cluster port" if s.mode == "sshfs" else
            "check that the export allows this host (showmount -e on the server)")
    node.changes.append(f"mounted {s.source(primary_address)} at {s.workspace} ({s.mode})")
    return True
