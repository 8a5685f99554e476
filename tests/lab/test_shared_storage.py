"""Storage modes on three lab hosts: what rank 2 and rank 0 write in the workspace, every rank reads
at the same path (sshfs: mounted from the primary at once; copy: spread by kit after the job), and
`kit down` removes the mounts."""

import re
from pathlib import Path

import pytest
import yaml

from harness import lab_cluster
from helpers import run_kit

pytestmark = pytest.mark.lab
JOB = "share.py"
JOBS = Path(__file__).parent / "jobs"


def kit(folder, lab, *args):
    r = run_kit(*args, cwd=folder, env=lab.env, timeout=900)
    assert r.returncode == 0, f"kit {' '.join(args)}:\n{r.stdout[-4000:]}{r.stderr[-3000:]}"
    return r.stdout


def mounted(host, path: str) -> str:
    return host.run_in("findmnt", "-n", "-o", "FSTYPE,SOURCE", "--mountpoint", path, check=False).stdout.strip()


@pytest.mark.parametrize("storage", ["sshfs", "copy"])
def test_rank_outputs_are_readable_by_every_rank_at_the_same_path(project, lab, storage, tmp_path):
    name = f"share-{storage}"
    workspace = f"/var/lib/kit/{name}/workspace"
    config = yaml.safe_load((project / "kit.yaml").read_text())
    config["cluster"] = {"name": name, "storage": storage}
    folder = tmp_path / "project"
    (folder / "job").mkdir(parents=True)
    (folder / "kit.yaml").write_text(yaml.safe_dump(config))
    (folder / "hosts.txt").write_text((project / "hosts.txt").read_text())
    (folder / "job" / JOB).write_text((JOBS / JOB).read_text())
    primary = lab.hosts[0]
    try:
        up = kit(folder, lab, "up", "--hosts", "hosts.txt")
        for h in lab.hosts[1:]:
            assert mounted(h, workspace) == (f"fuse.sshfs root@{primary.address}:{workspace}" if storage == "sshfs"
                                             else ""), up
        if storage == "sshfs":
            out = kit(folder, lab, "run", f"job/{JOB}", "--np", "3", "--", "both")
        else:
            first = kit(folder, lab, "run", f"job/{JOB}", "--np", "3", "--", "write")
            assert re.search(r"^copied 2 files the job wrote to every host's ", first, re.M), first[-3000:]
            out = kit(folder, lab, "run", f"job/{JOB}", "--np", "3", "--", "read")
        reads = re.findall(r"^\[(\S+) rank (\d)\] rank \2 on (\S+) read (\S+): '(.*)'; (\S+): step (\d+), "
                           r"weights sum (\S+)$", out, re.M)
        assert sorted((rank, hostname) for _, rank, hostname, *_ in reads) == \
               [(str(i), h.name) for i, h in enumerate(lab.hosts)], out[-3000:]
        assert {tuple(r[3:]) for r in reads} == {(f"{workspace}/shared/from-rank-2.txt",
                                                  f"written by rank 2 on {lab.hosts[2].name}",
                                                  f"{workspace}/shared/checkpoint.pt", "7", "45")}, out[-3000:]
    finally:
        down = run_kit("down", cwd=folder, env=lab.env, timeout=600)
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    if storage == "sshfs":
        assert down.stdout.count(f"unmounted root@{primary.address}:{workspace}") == 2, down.stdout
    for h in lab.hosts:
        assert mounted(h, workspace) == "" and not h.processes(r"^sshfs "), h.name
    if storage == "sshfs":  # the secondaries' mount points held nothing of their own: gone with the mounts
        for h in lab.hosts[1:]:
            assert not [f for f in h.kit_files() if f.startswith(f"/var/lib/kit/{name}")], h.name
    for h in lab.hosts:  # the workspaces that hold the job's files are kept by `kit down`, on purpose
        h.run_in("rm", "-rf", f"/var/lib/kit/{name}")


def digests(host, folder: str) -> dict[str, str]:
    out = host.run_in("sh", "-c", f"cd {folder} && sha256sum * 2>/dev/null", check=False).stdout
    return dict(reversed(line.split(None, 1)) for line in out.splitlines())


def test_a_hostile_job_writes_nothing_outside_the_workspace(project, lab, tmp_path):
    """Copy storage spreads what the ranks wrote: kit must never follow a link the job made, in either direction."""
    name, ssh_dir = "hostile", "/var/lib/kit/hostile/ssh"
    config = yaml.safe_load((project / "kit.yaml").read_text())
    config["cluster"] = {"name": name, "storage": "copy"}
    (tmp_path / "job").mkdir()
    (tmp_path / "kit.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "hosts.txt").write_text((project / "hosts.txt").read_text())
    (tmp_path / "job" / "hostile.py").write_text((JOBS / "hostile.py").read_text())
    with lab_cluster(lab, tmp_path, name, "--hosts", "hosts.txt"):
        before = {h.name: digests(h, ssh_dir) for h in lab.hosts}
        assert all(len(d) == 7 for d in before.values()), before  # keys, known_hosts, address...
        r = run_kit("run", "job/hostile.py", "--np", "3", "--", ssh_dir, cwd=tmp_path, env=lab.env, timeout=600)
        assert "Traceback" not in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
        assert r.stdout.count("planted its part") == 3, r.stdout[-3000:] + r.stderr[-3000:]
        assert {h.name: digests(h, ssh_dir) for h in lab.hosts} == before  # kit's keys untouched everywhere
        for h in lab.hosts[:1] + lab.hosts[2:]:  # the job's link to the host's /etc/shadow carried nothing over
            assert h.run_in("test", "-e", f"/var/lib/kit/{name}/workspace/shadow-copy", check=False).returncode != 0
        again = run_kit("exec", lab.hosts[1].address, "--", "true", cwd=tmp_path, env=lab.env)  # cluster SSH works
        assert again.returncode == 0, again.stderr
