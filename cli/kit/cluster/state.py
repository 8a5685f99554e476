"""What `kit up` made on each host, so `kit down` removes exactly that."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kit.errors import BadInput
from kit.cluster.identity import write_secret
from kit.config.hosts import Host
from kit.cluster.place import Place


@dataclass
class HostState:
    name: str
    address: str
    place: Place
    user: str | None = None
    port: int | None = None
    slots: int | None = None
    given_slots: int | None = None  # as hosts.txt gave them (None: decided by the flavor): a later up keeps them
    primary: bool = False
    local: bool = False            # a container of the local cluster: reached without SSH
    sudo: bool | None = None       # the login needed sudo at up (None: not recorded, asked again)
    made_workspace: bool = False   # kit made the folder (down removes it only while empty)
    made_kit_dir: bool = False
    made_mount: bool = False       # kit mounted the shared workspace here (down unmounts it)
    made_export: bool = False      # kit added the cluster's line to /etc/exports here (down removes it)
    interfaces: list[list] = field(default_factory=list)  # [interface, address, prefix] as the container sees them

    @property
    def host(self) -> Host:
        """How to reach it again, as hosts.txt said."""
        return Host(self.name, slots=self.given_slots, user=self.user, port=self.port, primary=self.primary,
                    local=self.local)


@dataclass
class ClusterState:
    cluster: str
    image: str
    image_id: str
    ssh_port: int
    workspace: str
    hosts: list[HostState] = field(default_factory=list)
    checked_image_id: str = ""  # the framework check passed in this image: no need to run it again
    storage: str = "copy"       # cluster.storage: copy, sshfs or nfs
    nfs_server: str = ""
    flavor: str = "cpu"         # the image's flavor: which launchers it can run
    cuda: str = ""              # the image's CUDA line (GPU flavors): which NVIDIA drivers run it
    shm_size: str = ""          # cluster.shm_size the containers run with ("": the host's IPC)
    network: dict = field(default_factory=dict)  # the training network kit chose (kit.network.measure.record)

    def host(self, name: str) -> HostState | None:
        return next((h for h in self.hosts if h.name == name), None)

    @property
    def primary(self) -> HostState:
        return next(h for h in self.hosts if h.primary)

    @property
    def local(self) -> bool:
        """A cluster of containers on this machine (kit up without hosts)."""
        return all(h.local for h in self.hosts)

    @property
    def workspace_shared(self) -> bool:
        """Every container sees the primary's workspace (sshfs, nfs, or the local cluster's one folder of this
        machine): a job is copied there once, and what it writes needs no copying."""
        return self.storage != "copy" or self.local


def state_file(folder: Path) -> Path:
    return folder / "state.json"


def load(folder: Path) -> ClusterState | None:
    path = state_file(folder)
    try:
        data = json.loads(path.read_text())
        hosts = [HostState(**{**h, "place": Place(**h["place"])}) for h in data.pop("hosts")]
        return ClusterState(**data, hosts=hosts)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # empty, cut short, edited, another kit's
        raise BadInput(f"{path}: kit's record of cluster {folder.name} is damaged ({type(e).__name__}: {e})",
                       hint=f"restore it from a copy; else remove {folder} and, on each host, what kit made "
                            f"there (docker rm -f kit-{folder.name}; rm -rf /var/lib/kit/{folder.name})") from None


def save(folder: Path, state: ClusterState) -> None:
    write_secret(state_file(folder), json.dumps(asdict(state), indent=2).encode())


def all_recorded(root: Path) -> list[ClusterState]:
    """Every cluster recorded under kit's state folder (kit.cluster.identity.state_root), by name; damaged records left out."""
    found = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            state = load(folder) if not folder.name.startswith(".") and folder.is_dir() else None
        except (BadInput, OSError):
            state = None
        if state is not None:
            found.append(state)
    return found
