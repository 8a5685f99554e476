"""The cluster's SSH files on every host: written only where they differ.

kit's folder on each host (0700, root) holds the host's own key, the
cluster's client key, authorized_keys, known_hosts and the client config. It is
mounted read-only into the container at /etc/kit/ssh.
"""

from __future__ import annotations

import hashlib
import shlex

from kit.config.settings import ClusterConfig
from kit.cluster.identity import Identity, Owner, known_hosts_lines
from kit.cluster.place import OWNER
from kit.image.recipe import render_template
from kit.cluster.steps.node import Node

SECRET, PUBLIC = 0o600, 0o644


def names_of(node: Node) -> list[str]:
    return list(dict.fromkeys([node.name, node.address]))


def cluster_files(nodes: list[Node], cfg: ClusterConfig, identity: Identity) -> dict[str, dict[str, tuple[bytes, int]]]:
    """host name -> {file name -> (content, mode)} for every host of the cluster."""
    client = identity.client_key()
    host_keys = {n.name: identity.host_key(n.name) for n in nodes}
    known = known_hosts_lines([(names_of(n), host_keys[n.name].public) for n in nodes], cfg.ssh_port)
    config = render_template("ssh_config.j2", cluster=cfg.name, port=cfg.ssh_port,
                             hosts=[(names_of(n), n.address) for n in nodes],
                             all_names=list(dict.fromkeys(x for n in nodes for x in names_of(n))))
    shared = {"id_ed25519": (client.private, SECRET), "authorized_keys": (client.public.encode() + b"\n", SECRET),
              "known_hosts": (known.encode(), PUBLIC), "config": (config.encode(), PUBLIC)}
    # address: the host's cluster address, where its container's servers listen (sshd, Horovod's rendezvous)
    return {n.name: {**shared, "ssh_host_ed25519_key": (host_keys[n.name].private, SECRET),
                     "ssh_host_ed25519_key.pub": (host_keys[n.name].public.encode() + b"\n", PUBLIC),
                     "address": (f"{n.address}\n".encode(), PUBLIC)}
            for n in nodes}


def write_command(folder: str, name: str, mode: int) -> str:
    path, tmp = shlex.quote(f"{folder}/{name}"), shlex.quote(f"{folder}/.{name}.tmp")
    return (f"umask 077 && mkdir -p {shlex.quote(folder)} && cat > {tmp} && chmod {mode:o} {tmp} "
            f"&& mv -f {tmp} {path}")


def apply(node: Node, files: dict[str, tuple[bytes, int]], owner: Owner) -> None:
    """The owner's mark first (kit's folder is this cluster's from now on), then the files that differ."""
    if node.facts.kit_dir_owner != owner:
        node.runner.run(write_command(node.place.kit_dir, OWNER, PUBLIC), stdin=f"{owner.id} {owner.name}\n".encode(),
                        changes=True).check(f"cannot write {node.place.owner_file}",
                                            hint="check that the disk is writable and not full")
    folder = node.place.ssh_dir
    have = node.facts.kit_files
    written = []
    for name, (content, mode) in sorted(files.items()):
        if have.get(name) == hashlib.sha256(content).hexdigest():
            continue
        node.runner.run(write_command(folder, name, mode), stdin=content, changes=True).check(
            f"cannot write {folder}/{name}", hint="check that the disk is writable and not full")
        written.append(name)
    if written:
        node.changes.append(f"wrote {', '.join(written)} in {folder}")
