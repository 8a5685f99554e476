"""`kit prepare`: the Ansible playbooks in ansible/, run with ansible-core on the hosts of hosts.txt.

kit writes the inventory (the primary's group, the workers' group, each host's
login and address) and the variables the roles read; ansible-playbook does the
rest over the user's own SSH, host keys checked as always.
"""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import yaml

from kit import shipped_folder
from kit.config.settings import ClusterConfig
from kit.errors import BadInput
from kit.config.hosts import Host
from kit.backends.slurm.sbatch import JOB_PORT_BASE, JOB_PORT_BLOCK, JOB_PORT_BLOCKS, JOB_PORTS

PLAYBOOK = "prepare.yml"


def resolve(host: Host, ssh_hostname: str) -> str:
    """The host's IPv4 address as seen from here (ssh_hostname: its HostName in the user's ssh config)."""
    try:
        return socket.getaddrinfo(ssh_hostname, None, socket.AF_INET)[0][4][0]
    except socket.gaierror:
        raise BadInput(f"hosts.txt:{host.line}: {host.name} does not resolve to an IPv4 address",
                       hint="use the host's address, or a name that DNS, /etc/hosts or ~/.ssh/config knows") from None


def inventory(hosts: list[Host], addresses: dict[str, str], cfg: ClusterConfig, *, gpu: bool,
              munge_key: Path | None = None) -> dict:
    """The YAML inventory ansible-playbook reads. Pure. With munge_key (the cluster's key on this machine), the
    hosts become a Slurm cluster too (the slurm role)."""
    def entry(h: Host) -> dict:
        e = {"ansible_host": h.name, "kit_address": addresses[h.name]}
        if h.user:
            e["ansible_user"] = h.user
        if h.port:
            e["ansible_port"] = h.port
        return e
    return {"all": {
        "vars": {"kit_cluster": cfg.name, "kit_ssh_port": cfg.ssh_port, "kit_gpu": gpu, "kit_storage": cfg.storage,
                 "kit_workspace": cfg.workspace_path, "kit_nfs_server": cfg.nfs_server or "",
                 "kit_addresses": [addresses[h.name] for h in hosts],
                 **({"kit_slurm": True, "kit_munge_key": str(munge_key), "kit_job_ports": JOB_PORTS,
                     "kit_job_port_base": JOB_PORT_BASE, "kit_job_port_block": JOB_PORT_BLOCK,
                     "kit_job_port_blocks": JOB_PORT_BLOCKS} if munge_key else {})},
        "children": {
            "kit_primary": {"hosts": {h.name: entry(h) for h in hosts if h.primary}},
            "kit_workers": {"hosts": {h.name: entry(h) for h in hosts if not h.primary}},
        }}}


class _Inventory(yaml.SafeDumper):
    """Every string goes to Ansible as `!unsafe`: a value (a path, a user name) is never a template that Ansible
    would expand (`{{ lookup('pipe', ...) }}` runs a command here)."""


_Inventory.add_representer(str, lambda dumper, value: dumper.represent_scalar("!unsafe", value))


def write_inventory(folder: Path, data: dict) -> Path:
    path = folder / "inventory.yml"
    path.write_text(yaml.dump(data, Dumper=_Inventory, sort_keys=False))
    return path


def ansible_playbook() -> str:
    """ansible-playbook next to this Python (kit's venv), else on PATH."""
    here = Path(sys.executable).parent / "ansible-playbook"
    found = str(here) if here.exists() else shutil.which("ansible-playbook")
    if not found:
        raise BadInput("ansible-playbook is not installed", hint="pip install ansible-core (kit depends on it)")
    return found


def playbook_argv(program: str, inventory_path: Path, *, check: bool) -> list[str]:
    return [program, "-i", str(inventory_path), *(["--check", "--diff"] if check else []),
            str(shipped_folder("kit.ansible") / PLAYBOOK)]
