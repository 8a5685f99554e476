"""`kit prepare`: the inventory it writes and the playbooks it runs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO
from kit.config import ClusterConfig
from kit.inventory import parse_hosts
from kit import shipped_folder
from kit.prepare import ansible_playbook, inventory, playbook_argv, write_inventory

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


def test_user_strings_reach_ansible_as_unsafe_never_as_templates(tmp_path):
    """A value is data: `{{ lookup('pipe', ...) }}` in it must not run a command on this machine. (kit.yaml's
    allow-lists refuse such values already; this is the second wall, so the config is built without them.)"""
    marker = tmp_path / "ran"
    hostile = ClusterConfig.model_construct(name="lab", ssh_port=12345, storage="copy", nfs_server=None,
                                            workspace=f"/srv/{{{{ lookup('pipe', 'touch {marker}') }}}}")
    data = inventory(HOSTS, ADDRESSES, hostile, gpu=False)
    path = write_inventory(tmp_path, data)
    assert "!unsafe" in path.read_text()
    adhoc = Path(ansible_playbook()).with_name("ansible")
    r = subprocess.run([str(adhoc), "gpu-1", "-i", str(path), "-c", "local", "-m", "debug", "-a",
                        "msg={{ kit_workspace }}"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
                            "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "lookup('pipe'" in r.stdout and not marker.exists()


def test_the_fstab_line_names_the_export_whichever_server_serves_it():
    import jinja2
    import yaml
    tasks = yaml.safe_load((REPO / "ansible/roles/nfs_client/tasks/main.yml").read_text())
    line = next(t for t in tasks if "lineinfile" in str(t))["ansible.builtin.lineinfile"]["line"]
    hostvars = {"gpu-1": {"kit_address": "10.0.0.1"}}
    render = jinja2.Template(line).render
    common = {"kit_workspace": "/srv/work", "hostvars": hostvars, "groups": {"kit_primary": ["gpu-1"]}}
    assert render(kit_nfs_server="nas:/export/kit", **common) == "nas:/export/kit /srv/work nfs defaults,_netdev 0 0"
    assert render(kit_nfs_server="", **common) == "10.0.0.1:/srv/work /srv/work nfs defaults,_netdev 0 0"


def test_the_firewall_keeps_the_cluster_port_and_the_job_ports_to_the_cluster_over_ipv4_and_ipv6():
    import yaml
    tasks = yaml.safe_load((REPO / "ansible/roles/firewall/tasks/main.yml").read_text())
    refuse = next(t for t in tasks if t["name"].startswith("Refuse"))
    rule = refuse["ansible.builtin.iptables"]
    assert rule["jump"] == "DROP" and rule["ctstate"] == ["NEW"] and rule["in_interface"] == "!lo"  # not replies
    import jinja2
    env = jinja2.Environment()
    env.filters["product"] = lambda a, b: __import__("itertools").product(a, b)
    items = env.from_string(refuse["loop"]).render(kit_ssh_port=12345, kit_port_range={"stdout": "32768\t60999\n"})
    assert items == str([("ipv4", "12345"), ("ipv4", "32768:60999"), ("ipv6", "12345"), ("ipv6", "32768:60999")])


def test_the_firewall_accepts_every_network_of_the_hosts_but_an_address_they_share():
    """The training network may be a fabric beside the hosts.txt network: its addresses are the cluster's too; docker0's
    172.17.0.1, on every host, and loopback and link-local are nobody's."""
    import jinja2
    import yaml
    tasks = yaml.safe_load((REPO / "ansible/roles/firewall/tasks/main.yml").read_text())
    peers = next(t for t in tasks if "kit_peers" in str(t.get("ansible.builtin.set_fact", "")))
    template = peers["ansible.builtin.set_fact"]["kit_peers"]
    env = jinja2.Environment()
    hostvars = {f"h{i}": {"ansible_all_ipv4_addresses": [f"10.231.77.1{i}", f"10.232.0.1{i}", "172.17.0.1",
                                                          "169.254.3.3", f"10.232.0.1{i}"]} for i in (1, 2)}
    hostvars["h3"] = {}  # facts not gathered (unreachable): its hosts.txt address stays
    out = env.from_string(template).render(ansible_play_hosts_all=list(hostvars), hostvars=hostvars,
                                           kit_addresses=["10.231.77.11", "10.231.77.12", "10.231.77.13"])
    assert out.strip() == str(["10.231.77.11", "10.231.77.12", "10.231.77.13", "10.232.0.11", "10.232.0.12"])
    accept = next(t for t in tasks if t["name"].startswith("Accept"))
    assert accept["loop"] == "{{ kit_peers }}"


def run_roles_in_check_mode(tmp_path, roles, engine=False, extra=()):
    """The roles run on this machine in check mode, on a PATH of this machine's programs without its dockerd, plus one
    where `engine`. Returns the run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for program in Path(folder).iterdir():
            if program.name != "dockerd" and not (bin_dir / program.name).exists():
                (bin_dir / program.name).symlink_to(program)
    if engine:
        (bin_dir / "dockerd").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "dockerd").chmod(0o755)
    play = tmp_path / "play.yml"
    play.write_text("- hosts: localhost\n  gather_facts: true\n  roles:\n"
                    + "".join(f"    - {REPO / 'ansible/roles' / role}\n" for role in roles))
    return subprocess.run([ansible_playbook(), "-i", "localhost,", "-c", "local", "--check", *extra, str(play)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PATH": str(bin_dir), "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
                               "ANSIBLE_PYTHON_INTERPRETER": sys.executable})


def task_outcome(run, name):
    found = re.search(rf"TASK \[[^\]]*: {re.escape(name)}\] \**\n(\w+)", run.stdout)
    assert found, run.stdout + run.stderr
    return found[1]


@pytest.mark.parametrize("engine", [True, False])
def test_an_installed_engine_is_kept_not_replaced_by_the_distributions(engine, tmp_path):
    """docker-ce (Docker's own packages) conflicts with docker.io: where any dockerd is on PATH the role installs no
    engine package."""
    r = run_roles_in_check_mode(tmp_path, ["docker"], engine=engine)
    assert (task_outcome(r, "Docker engine package") == "skipping") == engine, r.stdout


def test_a_package_already_installed_is_not_asked_of_the_mirror(tmp_path):
    """A host that has a package the roles want gets no apt task for it, so no refresh of a package index older than
    a day either: a host with no way to its mirror, or three lab hosts sharing one /var/lib/apt, is prepared all the
    same. A package this machine lacks still gets its task. Each is checked against dpkg's own answer."""
    # The docker role comes last: after its package tasks it looks for a service manager, which a test machine lacks.
    r = run_roles_in_check_mode(tmp_path, ["sshfs_client", "nfs_client", "docker"],
                                extra=["-e", f"kit_workspace={tmp_path / 'workspace'} kit_nfs_server=server:/export"])
    for task, package in [("unpigz for Docker's layer loads", "pigz"), ("sshfs package", "sshfs"),
                          ("NFS client package", "nfs-common")]:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True).stdout
        installed = status.endswith(" installed")
        assert (task_outcome(r, task) == "skipping") == installed, (package, status, r.stdout)
