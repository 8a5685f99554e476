"""`kit prepare`: the inventory it writes and the playbooks it runs."""

import subprocess
from pathlib import Path

import pytest

from helpers import REPO
from kit.config import ClusterConfig
from kit.inventory import parse_hosts
from kit import shipped_folder
from kit.prepare import ansible_playbook, inventory, playbook_argv

HOSTS = parse_hosts("gpu-1\nalice@gpu-2 port=2222\n")
ADDRESSES = {"gpu-1": "10.0.0.1", "gpu-2": "10.0.0.2"}


def test_inventory_groups_logins_and_variables():
    data = inventory(HOSTS, ADDRESSES, ClusterConfig(name="lab", storage="nfs"), gpu=True)
    assert data == {"all": {
        "vars": {"kit_cluster": "lab", "kit_ssh_port": 12345, "kit_gpu": True, "kit_storage": "nfs",
                 "kit_workspace": "/var/lib/kit/lab/workspace", "kit_nfs_server": "",
                 "kit_addresses": ["10.0.0.1", "10.0.0.2"]},
        "children": {
            "kit_primary": {"hosts": {"gpu-1": {"ansible_host": "gpu-1", "kit_address": "10.0.0.1"}}},
            "kit_workers": {"hosts": {"gpu-2": {"ansible_host": "gpu-2", "kit_address": "10.0.0.2",
                                                "ansible_user": "alice", "ansible_port": 2222}}}}}}


def test_check_mode_argv():
    assert playbook_argv("ansible-playbook", Path("/tmp/i.yml"), check=True) == [
        "ansible-playbook", "-i", "/tmp/i.yml", "--check", "--diff", str(REPO / "ansible" / "prepare.yml")]
    assert "--check" not in playbook_argv("ansible-playbook", Path("/tmp/i.yml"), check=False)


@pytest.mark.parametrize("playbook", sorted(p.name for p in (REPO / "ansible").glob("*.yml")))
def test_playbook_syntax(playbook, tmp_path):
    assert shipped_folder("kit.ansible") == REPO / "ansible"
    r = subprocess.run([ansible_playbook(), "--syntax-check", "-i", "localhost,", str(REPO / "ansible" / playbook)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
