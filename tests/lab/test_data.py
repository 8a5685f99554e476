"""Data in and out of a cluster on three lab hosts: a dataset folder of the hosts mounted into every container
(cluster.mounts), a job's .kitignore, `kit cp` both ways, and `kit exec`'s byte path with -i and -t.

The lab's hosts share one filesystem: the dataset is one folder at the same path on every host."""

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import kit, lab_cluster, local_leftovers, remove_local_clusters

pytestmark = pytest.mark.lab
NAME = "data"
WS = f"/var/lib/kit/{NAME}/workspace"
GREETING = "hello from the dataset"

JOB = '''
import hashlib, os, socket
import horovod.torch as hvd

hvd.init()
rank = hvd.rank()
with open("/data/hello.txt") as f:
    text = f.read().strip()
try:
    open(f"/data/from-rank-{rank}", "w").close()
    wrote = "written"
except OSError as e:
    wrote = f"refused ({e.strerror})"
print(f"rank {rank} on {socket.gethostname()} read {text!r}; write {wrote}", flush=True)
if rank == 0:
    os.makedirs("ckpt", exist_ok=True)
    data = os.urandom(3 << 20)
    with open("ckpt/model.pt", "wb") as f:
        f.write(data)
    print("checkpoint sha256 " + hashlib.sha256(data).hexdigest(), flush=True)
if rank == 1:  # in a folder the job's .kitignore leaves out: never copied to the other hosts
    os.makedirs("big", exist_ok=True)
    with open("big/from-rank-1.txt", "w") as f:
        f.write("rank 1")
'''


def kit_bytes(project, lab, *args, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """kit with its output as bytes, as a shell redirect would keep them."""
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=project, input=stdin, capture_output=True,
                          env={**os.environ, **lab.env}, timeout=300)


def sha256_on(host, path: str) -> str:
    return host.run_in("sha256sum", path).stdout.split()[0]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("dataset")
    (folder / "hello.txt").write_text(GREETING + "\n")
    return folder


@pytest.fixture(scope="module")
def data_project(project, dataset, tmp_path_factory) -> Path:
    """The session's project (its image built) as a cluster of its own, the dataset mounted at /data."""
    folder = tmp_path_factory.mktemp("data-project")
    config = yaml.safe_load((project / "kit.yaml").read_text())
    config["cluster"] = {"name": NAME, "mounts": [f"{dataset}:/data"]}
    (folder / "kit.yaml").write_text(yaml.safe_dump(config))
    (folder / "hosts.txt").write_text((project / "hosts.txt").read_text())
    return folder


@pytest.fixture(scope="module")
def cluster(data_project, lab):
    with lab_cluster(lab, data_project, NAME, "--hosts", "hosts.txt"):
        yield data_project


@pytest.fixture(scope="module")
def job_folder(tmp_path_factory) -> Path:
    """The job, a .kitignore'd folder of 50 MB beside it, and Python's caches (left out by default)."""
    folder = tmp_path_factory.mktemp("job")
    (folder / "data_job.py").write_text(JOB)
    (folder / "notes.txt").write_text("kept\n")
    (folder / ".kitignore").write_text("# the dataset's copy stays here\nbig/\n")
    (folder / "big").mkdir()
    with open(folder / "big" / "blob.bin", "wb") as f:
        for _ in range(50):
            f.write(os.urandom(1 << 20))
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "data_job.cpython-311.pyc").write_bytes(b"\0" * 64)
    return folder


def test_a_missing_dataset_folder_is_named_per_host_before_anything_changes(data_project, lab, tmp_path):
    config = yaml.safe_load((data_project / "kit.yaml").read_text())
    config["cluster"]["mounts"] = [f"{tmp_path}/missing:/data"]
    (tmp_path / "kit.yaml").write_text(yaml.safe_dump(config))
    r = kit(data_project, lab, "up", "--hosts", "hosts.txt", "--config", str(tmp_path / "kit.yaml"))
    assert r.returncode == 1, r.stdout + r.stderr
    for h in lab.hosts:
        assert f"{h.address}: cluster.mounts: {tmp_path}/missing does not exist (to be mounted at /data)" in r.stderr
    assert "fix: make the folder on that host" in r.stderr
    assert lab.leftovers(NAME) == {}


def test_every_rank_reads_the_dataset_which_is_read_only_and_kitignore_keeps_a_folder_here(
        cluster, lab, job_folder, dataset):
    r = kit(cluster, lab, "run", str(job_folder / "data_job.py"), "--np", "3")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    reads = re.findall(r"^\[(\S+) rank (\d)\] rank \2 on (\S+) read '(.*)'; write (.*)$", r.stdout, re.M)
    assert sorted((host, rank, hostname) for host, rank, hostname, _, _ in reads) == \
        [(h.address, str(i), h.name) for i, h in enumerate(lab.hosts)], r.stdout[-3000:]
    assert {(text, wrote) for *_, text, wrote in reads} == {(GREETING, "refused (Read-only file system)")}
    assert sorted(p.name for p in dataset.iterdir()) == ["hello.txt"]
    # the job's first line: 3 files to each of 3 hosts; big/ (.kitignore) and __pycache__/ (the defaults) left out
    assert f"copied 9 changed files of {job_folder}; left out 2 folders (.kitignore and kit's defaults)" in r.stdout
    for h in lab.hosts:
        assert h.run_in("test", "-e", f"{WS}/big/blob.bin", check=False).returncode != 0, h.name
        assert h.run_in("test", "-e", f"{WS}/__pycache__", check=False).returncode != 0, h.name
        assert h.run_in("test", "-f", f"{WS}/notes.txt", check=False).returncode == 0, h.name
    # what rank 1 wrote in big/ stays on its host: the spread after the job leaves it out too
    assert [h.run_in("test", "-e", f"{WS}/big/from-rank-1.txt", check=False).returncode == 0 for h in lab.hosts] == \
        [False, True, False]
    written = re.search(r"^\[\S+ rank 0\] checkpoint sha256 (\w+)$", r.stdout, re.M)[1]
    assert sha256_on(lab.hosts[0], f"{WS}/ckpt/model.pt") == written


def test_kit_cp_brings_a_checkpoint_here_whole_and_nothing_that_leads_out(cluster, lab, tmp_path):
    h1, h3 = lab.hosts[0], lab.hosts[2]
    on_host = sha256_on(h1, f"{WS}/ckpt/model.pt")
    r = kit(cluster, lab, "cp", f"{h1.address}:ckpt/model.pt", str(tmp_path / "model.pt"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert hashlib.sha256((tmp_path / "model.pt").read_bytes()).hexdigest() == on_host
    # a folder, from the host the job's spread copied it to, by its absolute path; a link a rank made in it to /etc
    assert kit(cluster, lab, "exec", h3.address, "--", "ln", "-s", "/etc", "ckpt/etc").returncode == 0
    r = kit(cluster, lab, "cp", f"{h3.address}:{WS}/ckpt", str(tmp_path / "got"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (tmp_path / "got").iterdir()) == ["model.pt"]
    assert hashlib.sha256((tmp_path / "got" / "model.pt").read_bytes()).hexdigest() == on_host
    assert "left out ckpt/etc: a link out of the copy (to /etc)" in r.stderr
    through = kit(cluster, lab, "cp", f"{h3.address}:ckpt/etc/hostname", str(tmp_path / "h"))
    assert through.returncode == 1 and "ckpt/etc/hostname leads out of the workspace" in through.stderr, through.stderr
    assert not (tmp_path / "h").exists()
    outside = kit(cluster, lab, "cp", f"{h3.address}:../ssh/id_ed25519", str(tmp_path))
    assert outside.returncode == 2 and "is outside the cluster's workspace" in outside.stderr
    unknown = kit(cluster, lab, "cp", "10.9.9.9:ckpt", str(tmp_path))
    assert unknown.returncode == 2 and "10.9.9.9 is not a host of the cluster" in unknown.stderr


BLOB = b"\r\n\0\x1b[2J\xff" + bytes(range(256)) * 4096 + b"\r\r\nno trailing newline"


def test_kit_cp_sends_a_folder_and_kit_exec_gives_its_bytes_back_unchanged(cluster, lab, tmp_path):
    h2 = lab.hosts[1]
    send = tmp_path / "send"
    (send / "sub").mkdir(parents=True)
    (send / "blob.bin").write_bytes(BLOB)
    (send / "sub" / "a.txt").write_text("a\n")
    r = kit(cluster, lab, "cp", str(send), f"{h2.address}:")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sha256_on(h2, f"{WS}/send/blob.bin") == hashlib.sha256(BLOB).hexdigest()
    assert h2.run_in("cat", f"{WS}/send/sub/a.txt").stdout == "a\n"
    out = kit_bytes(cluster, lab, "exec", h2.address, "--", "cat", "send/blob.bin")  # kit exec h -- cat f > local
    assert out.returncode == 0 and out.stdout == BLOB, out.stderr
    echoed = kit_bytes(cluster, lab, "exec", "-i", h2.address, "--", "cat", stdin=BLOB)
    assert echoed.returncode == 0 and echoed.stdout == BLOB, echoed.stderr
    no_input = kit_bytes(cluster, lab, "exec", h2.address, "--", "cat", stdin=b"not passed without -i")
    assert no_input.returncode == 0 and no_input.stdout == b""
    code = kit_bytes(cluster, lab, "exec", h2.address, "--", "sh", "-c", "printf err >&2; exit 7")
    assert (code.returncode, code.stdout, code.stderr) == (7, b"", b"err")
    terminal = kit_bytes(cluster, lab, "exec", "-t", h2.address, "--", "tty")
    assert terminal.returncode == 0 and re.fullmatch(rb"/dev/pts/\d+\r\n", terminal.stdout), terminal
    assert kit_bytes(cluster, lab, "exec", h2.address, "--", "tty").returncode == 1  # not a terminal without -t


def test_a_second_up_changes_nothing_and_a_changed_mount_makes_the_containers_anew(cluster, lab, dataset):
    again = kit(cluster, lab, "up", "--hosts", "hosts.txt")
    assert again.returncode == 0 and "no change" in again.stdout, again.stdout + again.stderr
    config = yaml.safe_load((cluster / "kit.yaml").read_text())
    config["cluster"]["mounts"] = [f"{dataset}:/data", f"{dataset}:/scratch:rw"]
    (cluster / "kit.yaml").write_text(yaml.safe_dump(config))
    changed = kit(cluster, lab, "up", "--hosts", "hosts.txt")
    assert changed.returncode == 0, changed.stdout + changed.stderr
    for h in lab.hosts:
        assert f"{h.address}: removed container kit-{NAME} (its image or settings changed)" in changed.stdout
    wrote = kit(cluster, lab, "exec", lab.hosts[2].address, "--", "sh", "-c", "echo rw > /scratch/written")
    assert wrote.returncode == 0, wrote.stderr
    assert (dataset / "written").read_text() == "rw\n"
    (dataset / "written").unlink()


def test_the_local_cluster_mounts_the_dataset_too(data_project, lab, dataset, tmp_path):
    """`kit up --nodes 1`: a container of this machine, the dataset of this machine at /data, read-only."""
    config = yaml.safe_load((data_project / "kit.yaml").read_text())
    config["cluster"] = {"name": "kitlab-data", "mounts": [f"{dataset}:/data"]}
    (tmp_path / "kit.yaml").write_text(yaml.safe_dump(config))
    remove_local_clusters()
    try:
        up = kit(tmp_path, lab, "up", "--nodes", "1")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        read = kit_bytes(tmp_path, lab, "exec", "local-1", "--", "sh", "-c", "cat /data/hello.txt; touch /data/x")
        assert read.stdout == (GREETING + "\n").encode() and read.returncode == 1, read
        assert b"Read-only file system" in read.stderr
        down = kit(tmp_path, lab, "down")
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        remove_local_clusters()
    assert not any(local_leftovers().values())
