"""`kit prepare`: the inventory it writes and the playbooks it runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO
from kit.config.settings import ClusterConfig
from kit.config.hosts import parse_hosts
from kit import shipped_folder
from kit.cluster.prepare import ansible_playbook, inventory, playbook_argv, write_inventory

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
    assert rule["jump"] == "DROP" and rule["syn"] == "match" and "ctstate" not in rule and rule["in_interface"] == "!lo"  # not replies
    ports = next(t for t in tasks if "kit_refused_ports" in t.get("ansible.builtin.set_fact", {}))
    import jinja2
    env = jinja2.Environment()
    env.filters["product"] = lambda a, b: __import__("itertools").product(a, b)
    items = env.from_string(ports["ansible.builtin.set_fact"]["kit_refused_ports"]).render(
        kit_ssh_port=12345, kit_port_range={"stdout": "32768\t60999\n"})
    assert items == str([("ipv4", "12345"), ("ipv4", "32768:60999"), ("ipv6", "12345"), ("ipv6", "32768:60999")])
    assert refuse["loop"] == "{{ kit_refused_ports }}"


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


def iptables_args(rule: dict, port: str) -> list[str]:
    """The firewall role's ansible.builtin.iptables arguments as iptables' own, for the IPv4 rule of one port; a key this
    does not know fails the test rather than be left out."""
    args = {"chain": lambda v: ["-A" if rule.get("action") == "append" else "-I", v],
            "action": lambda v: [], "ip_version": lambda v: [], "comment": lambda v: [],
            "protocol": lambda v: ["-p", v], "destination_port": lambda v: ["--dport", port],
            "syn": lambda v: {"match": ["--syn"], "negate": ["!", "--syn"], "ignore": []}[v],
            "ctstate": lambda v: ["-m", "conntrack", "--ctstate", ",".join(v)],
            "in_interface": lambda v: ["!", "-i", v[1:]] if v.startswith("!") else ["-i", v],
            "jump": lambda v: ["-j", v]}
    unknown = set(rule) - set(args)
    assert not unknown, f"translate {unknown} too"
    order = ("chain", "protocol", *sorted(set(rule) - {"chain", "protocol", "jump"}), "jump")  # -p before --dport
    return [a for key in order if key in rule for a in args[key](rule[key])]


def host_and_outside(host: str, outside: str, host_ip: str, outside_ip: str) -> None:
    """Two network namespaces of a test's, a host and the outside, joined by a veth pair (fw0 on the host's side) on
    a /24 of the addresses given: every packet stays between them. The test removes them."""
    def sh(*argv):
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)
    sh("ip", "netns", "add", host)
    sh("ip", "netns", "add", outside)
    sh("ip", "-n", host, "link", "add", "fw0", "type", "veth", "peer", "name", "fw1", "netns", outside)
    for ns, dev, ip in ((host, "fw0", host_ip), (outside, "fw1", outside_ip)):
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


SERVER = """import socket, sys, struct
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16); print("ready", flush=True)
held = []
for line in sys.stdin:
    if line.startswith("accept"):
        held.append(s.accept()[0]); print("accepted", flush=True)
    else:  # close what it accepted with a reset, which the test keeps from conntrack
        for c in held:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close()
        held = []; print("closed", flush=True)
"""
CLIENT = """import socket, sys, struct
source, server, port, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
c = socket.socket(); c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); c.bind((source, int(sys.argv[5])))
c.settimeout(2)
try:
    c.connect((server, port))
except OSError as e:
    print("refused" if isinstance(e, ConnectionRefusedError) else "dropped", flush=True); sys.exit()
print("connected", flush=True)
if how == "stage":
    sys.stdin.readline()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close(); print("closed", flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="makes network namespaces and iptables rules: root only")
def test_the_firewalls_refusal_holds_against_a_stale_conntrack_entry(tmp_path):
    """A connection whose end conntrack never saw (both sides reset while their packets are kept from it) leaves an
    ESTABLISHED entry with no socket. A SYN from an outside address on that entry's ports is not conntrack's NEW: the
    refusal of NEW connections lets it through, as the control shows; the firewall role's rule, run as iptables in a
    network namespace of this test's, drops it, and a fresh connection too. Two namespaces joined by a veth pair; every
    packet stays between them."""
    import yaml
    tasks = yaml.safe_load((REPO / "ansible/roles/firewall/tasks/main.yml").read_text())
    rule = {k: v for k, v in next(t for t in tasks if t["name"].startswith("Refuse"))["ansible.builtin.iptables"].items()
            if k != "rule_num"}
    port = "34567"
    weak = dict(rule, ctstate=["NEW"])
    weak.pop("syn", None)
    host, outside = f"kit-unit-fw-h-{os.getpid()}", f"kit-unit-fw-o-{os.getpid()}"
    host_ip, outside_ip = "10.251.0.1", "10.251.0.2"

    def sh(*argv):
        return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)

    def on_host(*argv):
        return sh("ip", "netns", "exec", host, *argv)

    def spawn(ns, code, *args):
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code, *map(str, args)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def said(proc, word):
        line = proc.stdout.readline().strip()
        assert line == word, (word, line)

    def connect(source_port):
        return spawn(outside, CLIENT, outside_ip, host_ip, port, "try", source_port).communicate(timeout=30)[0].strip()

    procs = []
    try:
        host_and_outside(host, outside, host_ip, outside_ip)
        on_host("iptables", "-N", "kit-ct")  # a conntrack rule from the start: the host's connections are tracked
        on_host("iptables", "-A", "INPUT", "-m", "conntrack", "--ctstate", "INVALID", "-j", "kit-ct")
        server = spawn(host, SERVER, host_ip, port)
        procs.append(server)
        said(server, "ready")
        staged = [40001, 40002]
        for source_port in staged:  # a connection each, then reset on both sides unseen by conntrack
            client = spawn(outside, CLIENT, outside_ip, host_ip, port, "stage", source_port)
            procs.append(client)
            said(client, "connected")
            server.stdin.write("accept\n"), server.stdin.flush()
            said(server, "accepted")
            on_host("iptables", "-t", "raw", "-I", "PREROUTING", "-s", outside_ip, "-j", "DROP")
            on_host("iptables", "-t", "raw", "-I", "OUTPUT", "-d", outside_ip, "-j", "DROP")
            client.stdin.write("close\n"), client.stdin.flush()
            said(client, "closed")
            server.stdin.write("close\n"), server.stdin.flush()
            said(server, "closed")
            on_host("iptables", "-t", "raw", "-D", "PREROUTING", "-s", outside_ip, "-j", "DROP")
            on_host("iptables", "-t", "raw", "-D", "OUTPUT", "-d", outside_ip, "-j", "DROP")
        on_host("iptables", *iptables_args(weak, port))
        assert connect(40010) == "dropped"  # the weaker rule keeps a fresh connection out...
        assert connect(staged[0]) == "connected"  # ...but not a SYN on a stale entry: the staging worked
        on_host("iptables", "-D", *iptables_args(weak, port)[1:])
        on_host("iptables", *iptables_args(rule, port))
        assert connect(staged[1]) == "dropped"
        assert connect(40011) == "dropped"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for ns in (host, outside):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


FIREWALL_PLAY = """- hosts: localhost
  gather_facts: true
  vars: {kit_cluster: unitfw, kit_ssh_port: 12345, kit_addresses: ["10.251.1.1"]}
  roles: [%s]
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="makes network namespaces and iptables rules: root only")
def test_the_firewall_refuses_above_the_hosts_own_rules_and_a_second_run_changes_nothing(tmp_path):
    """A host with ufw's rules (its ESTABLISHED accept, and a site's `ufw allow 30000:65000/tcp`): the refusals that
    kit appended sat below them and let an outside SYN in. The role, run by ansible-playbook in a network namespace of
    this test's, puts them right below the cluster's accepts: the outside's SYN is dropped, a second run changes
    nothing, and a refusal an older kit appended at the end is moved up."""
    host, outside = f"kit-unit-fw2-h-{os.getpid()}", f"kit-unit-fw2-o-{os.getpid()}"
    host_ip, outside_ip = "10.251.1.1", "10.251.1.2"

    def sh(*argv, check=True):
        return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=120)

    def on_host(*argv):
        return sh("ip", "netns", "exec", host, *argv)

    def rules() -> list[str]:
        return [line for line in on_host("iptables", "-S", "INPUT").stdout.splitlines() if line.startswith("-A ")]

    def play():
        book = tmp_path / "fw.yml"
        book.write_text(FIREWALL_PLAY % (REPO / "ansible/roles/firewall"))
        r = subprocess.run(["ip", "netns", "exec", host, ansible_playbook(), "-i", "localhost,", "-c", "local",
                            str(book)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                           env={**os.environ, "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
                                "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        return re.search(r"changed=(\d+)", r.stdout)[1]

    def connect(port):
        proc = subprocess.run(["ip", "netns", "exec", outside, sys.executable, "-c", CLIENT, outside_ip, host_ip,
                               str(port), "try", "0"], capture_output=True, text=True, timeout=30)
        return proc.stdout.strip()
    server = None
    try:
        host_and_outside(host, outside, host_ip, outside_ip)
        port = int(on_host("cat", "/proc/sys/net/ipv4/ip_local_port_range").stdout.split()[0]) + 7
        on_host("iptables", "-A", "INPUT", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
        on_host("iptables", "-A", "INPUT", "-p", "tcp", "--dport", "30000:65000", "-j", "ACCEPT")   # the site's own
        server = subprocess.Popen(["ip", "netns", "exec", host, sys.executable, "-c", SERVER, host_ip, str(port)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "ready"
        assert connect(port) == "connected"                      # (the site's rule lets anyone in)
        assert play() != "0"
        assert connect(port) == "dropped"
        mine = [i for i, line in enumerate(rules()) if "--comment kit-unitfw" in line]
        assert mine == list(range(len(mine))) and len(mine) >= 3   # the cluster's rules first, one block
        assert "-j ACCEPT" in rules()[0] and all("-j DROP" in rules()[i] for i in mine[1:])   # accepts, then refusals
        assert play() == "0"                                      # a second run changes nothing
        ephemeral = next(line for line in rules() if "-j DROP" in line and "--dport 12345" not in line)
        on_host("iptables", "-D", *ephemeral.split()[1:])         # as an older kit left it: at the end
        on_host("iptables", *ephemeral.split())
        assert connect(port) == "connected"
        assert play() != "0" and connect(port) == "dropped"
        assert [i for i, line in enumerate(rules()) if "--comment kit-unitfw" in line] == mine
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for ns in (host, outside):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
