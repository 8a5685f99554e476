"""`kit prepare --slurm`'s Prolog and Epilog, which keep a running job's ports to its own nodes and, on them, to its
own user: rendered by Ansible from the hosts' facts, read by shellcheck, and run for real as root in network
namespaces of the test's own, where connections are made as the job's user, as another user and from a node that is
not the job's."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO
from kit.backends.slurm import sbatch
from kit.cluster.prepare import ansible_playbook

ROLE = REPO / "ansible" / "roles" / "slurm"
FACTS = {  # hosts as the inventory and Ansible's facts give them; a fabric beside hosts.txt's network, docker0 on each
    "gpu-1": {"kit_address": "10.0.0.1", "kit_slurm_node": "gpu-1",
              "ansible_all_ipv4_addresses": ["10.0.0.1", "10.9.0.1", "172.17.0.1", "169.254.1.1", "10.9.0.1"]},
    "gpu-2": {"kit_address": "10.0.0.2", "kit_slurm_node": "gpu-2",
              "ansible_all_ipv4_addresses": ["172.17.0.1", "10.0.0.2", "10.9.0.2"]},
    "cpu-3": {"kit_address": "10.0.0.3", "kit_slurm_node": "cpu-3"},  # facts not gathered: its address alone
}
PORTS = {"kit_job_port_base": sbatch.JOB_PORT_BASE, "kit_job_port_block": sbatch.JOB_PORT_BLOCK,
         "kit_job_port_blocks": sbatch.JOB_PORT_BLOCKS}


def render(tmp_path: Path, facts: dict) -> tuple[str, str]:
    """The Prolog and the Epilog as the role's own tasks write them, through ansible-playbook on this machine."""
    hosts = list(facts)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"kit_cluster": "lab", **local, **PORTS},
        "children": {"kit_primary": {"hosts": {hosts[0]: facts[hosts[0]]}},
                     "kit_workers": {"hosts": {h: facts[h] for h in hosts[1:]}}}}}, sort_keys=False))
    tasks = yaml.safe_load((ROLE / "tasks/main.yml").read_text())
    table = next(t for t in tasks if t["name"] == "Every address of each node")
    scripts = dict(next(t for t in tasks if t["name"] == "The job ports' Prolog and Epilog"), run_once=True)
    scripts["ansible.builtin.template"] = dict(scripts["ansible.builtin.template"], owner=None, group=None,
                                               src=str(ROLE / "templates/job-ports.sh.j2"))
    (tmp_path / "render.yml").write_text(yaml.safe_dump([{
        "hosts": "kit_primary:kit_workers", "gather_facts": False, "tasks": [table, scripts]}]))
    r = subprocess.run([ansible_playbook(), "-i", str(tmp_path / "inventory.yml"), "-e",
                        f"kit_slurm_conf_dir={tmp_path}", str(tmp_path / "render.yml")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "t")})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return (tmp_path / "kit-job-ports-prolog").read_text(), (tmp_path / "kit-job-ports-epilog").read_text()


def test_the_scripts_know_every_address_of_each_node_and_pass_shellcheck(tmp_path):
    prolog, epilog = render(tmp_path, FACTS)
    # the Prolog's table: each node's own addresses, none that another host has too
    assert "        cpu-3) echo 10.0.0.3 ;;\n        gpu-1) echo 10.0.0.1 10.9.0.1 ;;\n" \
           "        gpu-2) echo 10.0.0.2 10.9.0.2 ;;\n" in prolog, prolog
    for script in (prolog, epilog):
        assert "% 798 * 16" in script and "first + 16 - 1" in script
    assert "| iptables-restore" in prolog and "iptables-restore" not in epilog and "remove \"$tool\"" in epilog
    for name in ("kit-job-ports-prolog", "kit-job-ports-epilog"):
        r = subprocess.run(["shellcheck", "-s", "bash", str(tmp_path / name)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout


SERVER = """import os, socket, sys, time
os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))   # a socket is its maker's: the job user's, or another's
held = []
for port in sys.argv[2:]:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", int(port)))
    s.listen(64); held.append(s)
print("ready", flush=True)
time.sleep(300)
"""
CLIENT = """import encodings.idna, os, socket, sys
uid, address, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
os.setgid(uid); os.setuid(uid)
try:
    socket.create_connection((address, port), timeout=1).close(); print("connected")
except ConnectionRefusedError:
    print("refused")
except OSError:
    print("dropped")
"""
OWNER, OTHER = 4242, 4243


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("iptables") or not shutil.which("scontrol"),
                    reason="runs the scripts as root in network namespaces, with iptables and Slurm's scontrol")
def test_a_jobs_ports_take_no_connection_but_its_users_from_its_nodes(tmp_path):
    """Nodes gpu-1 and gpu-2 run job 5 of uid 4242 (its ports: 20080 to 20095), cpu-3 is a node of the cluster that
    is not the job's; each a network namespace of this test's, on one bridge. The Prolog runs on the job's nodes as
    slurmd would run it; the Epilog on gpu-1 at the end."""
    prolog, epilog = render(tmp_path, FACTS)
    (tmp_path / "slurm.conf").write_text("ClusterName=lab\nSlurmctldHost=gpu-1(10.0.0.1)\n")  # for scontrol alone
    tag = os.getpid()
    ns = {name: f"kit-unit-ports-{name}-{tag}" for name in ("gpu-1", "gpu-2", "cpu-3", "switch")}
    address = {"gpu-1": "10.0.0.1", "gpu-2": "10.0.0.2", "cpu-3": "10.0.0.3"}
    first = sbatch.JOB_PORT_BASE + 5 % sbatch.JOB_PORT_BLOCKS * sbatch.JOB_PORT_BLOCK
    assert first == 20080

    def sh(*argv, check=True):
        return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=60)

    def slurmd_runs(node, script, job=5, uid=OWNER, nodelist="gpu-[1-2]"):
        env = {"SLURM_JOB_ID": str(job), "SLURM_JOB_UID": str(uid), "SLURM_JOB_NODELIST": nodelist,
               "SLURMD_NODENAME": node, "SLURM_CONF": str(tmp_path / "slurm.conf")}
        return subprocess.run(["ip", "netns", "exec", ns[node], "bash", "-c", script], env=env,
                              capture_output=True, text=True, timeout=120)

    def connect(node, uid, to, port=first):
        r = sh("ip", "netns", "exec", ns[node], sys.executable, "-c", CLIENT, str(uid), address[to], str(port))
        return r.stdout.strip()

    def raw_rules(node):
        return sh("ip", "netns", "exec", ns[node], "iptables", "-t", "raw", "-S").stdout

    server, servers = None, []
    try:
        for name in ns.values():
            sh("ip", "netns", "add", name)
        sh("ip", "-n", ns["switch"], "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", ns["switch"], "link", "set", "br0", "up")
        for i, node in enumerate(("gpu-1", "gpu-2", "cpu-3")):
            sh("ip", "-n", ns[node], "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns", ns["switch"])
            sh("ip", "-n", ns["switch"], "link", "set", f"p{i}", "master", "br0", "up")
            sh("ip", "-n", ns[node], "addr", "add", f"{address[node]}/24", "dev", "eth0")
            sh("ip", "-n", ns[node], "link", "set", "eth0", "up")
            sh("ip", "-n", ns[node], "link", "set", "lo", "up")
        server = subprocess.Popen(["ip", "netns", "exec", ns["gpu-1"], sys.executable, "-c", SERVER, str(OWNER),
                                   str(first), str(first + 15), str(first + 16)], stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "ready"
        squatter = subprocess.Popen(["ip", "netns", "exec", ns["gpu-1"], sys.executable, "-c", SERVER, str(OTHER),
                                     str(first + 1)], stdout=subprocess.PIPE, text=True)   # another user's, first
        servers.append(squatter)
        assert squatter.stdout.readline().strip() == "ready"
        assert connect("cpu-3", OTHER, "gpu-1") == "connected"  # before the job: the ports are open to the cluster
        for node in ("gpu-1", "gpu-2"):
            for _ in range(2):  # a second run (slurmd's, for a requeued job) leaves the same rules
                r = slurmd_runs(node, prolog)
                assert r.returncode == 0 and r.stderr == "", r.stderr
        rules = raw_rules("gpu-1")
        assert rules.count("-A PREROUTING") == 1 and "--dport 20080:20095" in rules, rules
        assert connect("gpu-2", OWNER, "gpu-1") == "connected", rules + raw_rules("gpu-2")  # the job's user, from the job's other node
        assert connect("gpu-2", OTHER, "gpu-1") == "dropped"    # another user there
        assert connect("cpu-3", OWNER, "gpu-1") == "dropped"    # a node that is not the job's, whoever asks
        assert connect("cpu-3", OWNER, "gpu-1", first + 15) == "dropped"  # the block's last port
        assert connect("cpu-3", OTHER, "gpu-1", first + 16) == "connected"  # the next block is another job's
        assert connect("gpu-1", OTHER, "gpu-1") == "dropped"    # another user on the job's own node
        assert connect("gpu-1", OWNER, "gpu-1") == "connected"
        assert connect("gpu-1", 0, "gpu-1") == "dropped"        # root too: a kit cluster's job runs as root here
        # another user's program bound a port of the job's first: the job's own connections never reach it
        assert connect("gpu-2", OWNER, "gpu-1", first + 1) == "dropped"
        assert connect("gpu-1", OWNER, "gpu-1", first + 1) == "dropped"
        assert connect("cpu-3", OTHER, "gpu-1", first + 1) == "dropped"
        # gpu-2's Prolog knows none of the job's nodes: its other users still reach no port of the job's, anywhere
        r = slurmd_runs("gpu-2", prolog, nodelist="gpu-9")
        assert "node gpu-9 is not in kit's list of nodes" in r.stderr, r.stderr
        assert connect("gpu-2", OTHER, "gpu-1") == "dropped"
        r = slurmd_runs("gpu-2", prolog)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        # job 803 (798 after it), another user's, has the same ports: both jobs' rules hold, so on gpu-1 neither
        # user gets in (the jobs fail rather than open to each other), and job 5's rules are whole after 1271's end
        collide = 5 + sbatch.JOB_PORT_BLOCKS
        r = slurmd_runs("gpu-1", prolog, job=collide, uid=OTHER)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert f"kit-job-{collide}-in" in raw_rules("gpu-1")
        assert connect("gpu-1", OTHER, "gpu-1") == "dropped"
        assert connect("gpu-1", OWNER, "gpu-1") == "dropped"
        assert connect("cpu-3", OTHER, "gpu-1") == "dropped"
        r = slurmd_runs("gpu-1", epilog, job=collide, uid=OTHER)
        assert r.returncode == 0 and raw_rules("gpu-1") == rules
        assert connect("gpu-1", OWNER, "gpu-1") == "connected"
        r = slurmd_runs("gpu-1", epilog)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert "kit-job" not in raw_rules("gpu-1")
        assert connect("cpu-3", OTHER, "gpu-1") == "connected"  # the job has ended: its ports are free again
        assert connect("cpu-3", OTHER, "gpu-1", first + 1) == "connected"
        assert "kit-job-5-" in raw_rules("gpu-2")  # until gpu-2's own Epilog
    finally:
        for proc in [server, *servers]:
            if proc:
                proc.kill()
                proc.wait()
        for name in ns.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
