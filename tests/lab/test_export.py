"""`kit export` on the real Docker engine: kit's cpu image as an enroot squashfs whose root, unpacked, runs the
image's own allreduce check as enroot would start it (its /etc/rc, its /etc/environment, a root of its own); a second
export does nothing; an image that is not here is refused. enroot and pyxis are not packaged for this machine, so the
root is run with unshare and chroot, as enroot's runtime does with namespaces and a pivot_root."""

import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from helpers import closed_port, run_kit
from kit.image.verify import parse_allreduce

pytestmark = pytest.mark.lab


@pytest.fixture
def work():
    """A folder on disk (/tmp may be memory; the root is about 2 GB twice), removed whatever happens."""
    folder = Path(tempfile.mkdtemp(prefix="kit-export-test-", dir="/var/tmp"))
    try:
        yield folder
    finally:
        mounted = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                   if line.split()[4].startswith(str(folder))]
        for point in reversed(mounted):  # none is expected: the check's mounts die with its namespace
            subprocess.run(["umount", "-l", point], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(folder)], check=False)
        assert not mounted, f"mounts left under {folder}: {mounted}"


def image_env(root: Path) -> dict:
    """The environment enroot gives a container: the lines of the root's /etc/environment."""
    return dict(line.split("=", 1) for line in (root / "etc/environment").read_text().splitlines() if "=" in line)


# Run as enroot would: a mount, PID, UTS and network namespace of its own (loopback only, the hostname resolving to
# it for Gloo), /dev bound in, a tmpfs /dev/shm, the host's /etc/hosts replaced (enroot mounts the host's there);
# HOME as enroot's 10-home hook sets it; then the image's /etc/rc with the check as srun's command, so its entrypoint runs it.
IN_ROOT = """set -e
ip link set lo up
hostname kit-export
mount --bind /dev "$ROOT/dev"
[ -e "$ROOT/etc/hosts" ] || : > "$ROOT/etc/hosts"
mount -t tmpfs -o size=1g,mode=1777 tmpfs "$ROOT/dev/shm"
mount --bind "$HOSTS" "$ROOT/etc/hosts"
exec chroot "$ROOT" /bin/sh /etc/rc horovodrun -np 2 -H localhost:2 python /opt/kit/allreduce_check.py
"""


def run_in_root(root: Path, hosts: Path) -> subprocess.CompletedProcess:
    argv = ["unshare", "--mount", "--propagation", "private", "--pid", "--uts", "--net", "--fork", "--kill-child",
            f"--mount-proc={root}/proc", "sh", "-c", IN_ROOT]
    env = {**image_env(root), "HOME": "/root", "ROOT": str(root), "HOSTS": str(hosts)}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def test_enroot_export_runs_the_images_allreduce_and_a_second_export_does_nothing(project, client, work):
    out = work / "kit.sqsh"
    started = time.monotonic()
    r = run_kit("export", "--to", "enroot", "-o", str(out), cwd=project, timeout=1200)
    seconds = time.monotonic() - started
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"kit export --to enroot: {seconds:.1f} s, {out.stat().st_size / 1e9:.2f} GB\n{r.stdout}")
    assert f"srun --container-image={out} " in r.stdout
    assert f"  slurm:\n    runtime: pyxis\n    container_image: {out}\n" in r.stdout
    assert sorted(p.name for p in work.iterdir()) == ["kit.sqsh", "kit.sqsh.id"]  # its scratch folder is gone
    assert not client.containers.list(all=True, filters={"label": "io.kit.export"})
    assert out.stat().st_mode & 0o777 == 0o644

    # The kit.yaml lines it printed, and the sbatch script of a job that runs in that image under pyxis
    job = work / "job"
    job.mkdir()
    (job / "kit.yaml").write_text(r.stdout[r.stdout.index("  slurm:\n"):])
    script = run_kit("export", "--to", "slurm", "--nodes", "2", "-o", "job.sbatch", "train.py", cwd=job)
    assert script.returncode == 0, script.stdout + script.stderr
    text = (job / "job.sbatch").read_text()
    assert text.count(f"--container-image={out} ") == 1  # the ranks (rank 0's task serves the rendezvous)
    checked = subprocess.run(["shellcheck", "--shell=bash", str(job / "job.sbatch")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout

    root = work / "root"
    subprocess.run(["unsquashfs", "-no-progress", "-d", str(root), str(out)], check=True, capture_output=True,
                   timeout=600)
    assert (root / "etc/rc").read_text().startswith("# enroot-provenance: dockerd://kit-horovod:cpu-")
    assert image_env(root)["PATH"].startswith("/opt/venv/bin:")
    assert not list((root / "dev").iterdir()) and not (root / ".dockerenv").exists()
    hosts = work / "hosts"
    hosts.write_text("127.0.0.1 localhost kit-export\n")
    check = run_in_root(root, hosts)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert [(a.rank, a.size, a.total, a.ok) for a in parse_allreduce(check.stdout)] == [
        (0, 2, 3.0, True), (1, 2, 3.0, True)]

    before = out.stat().st_mtime_ns
    started = time.monotonic()
    again = run_kit("export", "--to", "enroot", "-o", str(out), cwd=project, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    skipped_in = time.monotonic() - started
    print(f"the same export again: {skipped_in:.1f} s")
    assert skipped_in < 10
    print(again.stdout)
    assert f"{out} (" in again.stdout and "already holds this image" in again.stdout and "nothing to do" in again.stdout
    assert out.stat().st_mtime_ns == before


def test_docker_archive_is_the_images_docker_save(project, client, work):
    out = work / "kit.tar"
    started = time.monotonic()
    r = run_kit("export", "--to", "docker-archive", "-o", str(out), cwd=project, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"kit export --to docker-archive: {time.monotonic() - started:.1f} s, {out.stat().st_size / 1e9:.2f} GB\n{r.stdout}")
    assert f"apptainer build {work / 'kit.sif'} docker-archive://{out}\n" in r.stdout
    assert out.stat().st_mode & 0o777 == 0o644
    names = subprocess.run(["tar", "-tf", str(out)], capture_output=True, text=True, check=True).stdout.split()
    manifest = json.loads(subprocess.run(["tar", "-xOf", str(out), "manifest.json"], capture_output=True,
                                         check=True).stdout)
    tag = manifest[0]["RepoTags"][0]
    assert tag.startswith("kit-horovod:cpu-") and all(layer in names for layer in manifest[0]["Layers"])
    assert client.images.get(tag).id.removeprefix("sha256:") in manifest[0]["Config"]
    assert sorted(p.name for p in work.iterdir()) == ["kit.tar", "kit.tar.id"]


def test_an_image_that_is_not_here_is_named_and_nothing_is_written(project, work):
    r = run_kit("export", "--to", "enroot", "--image", "kit-export-missing:none", "-o", str(work / "x.sqsh"),
                cwd=project)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines()[0] == "error: image kit-export-missing:none is not on this machine's Docker engine"
    assert r.stderr.splitlines()[1].startswith("fix: build it with `kit build`")
    assert list(work.iterdir()) == []


CHECK = """import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
# one write of the whole line: the two ranks share torchrun's stdout, and print's text and newline are two writes
os.write(1, f"ddp {dist.get_rank()} {t.item()} {sys.executable} {os.environ.get('LD_LIBRARY_PATH')}\\n".encode())
dist.barrier()
dist.destroy_process_group()  # (else Gloo's threads may outlive the interpreter: std::terminate at exit)
"""

HVD_CHECK = """import sys, torch, horovod.torch as hvd
hvd.init()
print(f"hvd {hvd.rank()} {hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()}", flush=True)
"""


def test_venv_export_runs_torchrun_and_horovodrun_from_wherever_it_is_moved(project, client, work):
    """kit's cpu image's Python as a folder for Slurm nodes without containers: recorded as slurm.python_path, moved
    elsewhere it still runs (in an environment of nothing but PATH, with -I too) a torchrun and a horovodrun job of
    two ranks over Gloo, each rank's sys.executable the folder's entry point and the job's LD_LIBRARY_PATH its own;
    a second export does nothing; no container of the export is left."""
    job = work / "job"
    job.mkdir()
    (job / "kit.yaml").write_text((project / "kit.yaml").read_text())
    out = work / "envs" / "kit"
    r = run_kit("export", "--to", "venv", "-o", str(out), cwd=job, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(r.stdout)
    assert f'  python_path: "{out}/bin/python"\n' in (job / "kit.yaml").read_text()
    assert json.loads((out / "kit-export.json").read_text())["image"].startswith("sha256:")
    assert not client.containers.list(all=True, filters={"label": "io.kit.export"})
    again = run_kit("export", "--to", "venv", "-o", str(out), cwd=job, timeout=300)
    assert again.returncode == 0 and "already: nothing to do" in again.stdout, again.stdout + again.stderr

    moved = work / "elsewhere"
    out.rename(moved)
    (work / "check.py").write_text(CHECK)
    (work / "hvd_check.py").write_text(HVD_CHECK)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "LD_LIBRARY_PATH": "/the/jobs/own"}
    imports = subprocess.run([str(moved / "bin/python"), "-I", "-c", "import torch, horovod.torch"], env=env,
                             capture_output=True, text=True, cwd="/")
    assert imports.returncode == 0, imports.stderr
    ddp = subprocess.run([str(moved / "bin/torchrun"), "--nproc-per-node", "2", "--master-port", str(closed_port()),
                          str(work / "check.py")], env=env, capture_output=True, text=True, cwd=work, timeout=300)
    assert ddp.returncode == 0, ddp.stdout[-3000:] + ddp.stderr[-3000:]
    assert sorted(line for line in ddp.stdout.splitlines() if line.startswith("ddp ")) == [
        f"ddp {rank} 3.0 {moved}/bin/python /the/jobs/own" for rank in (0, 1)]
    hvd = subprocess.run([str(moved / "bin/horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2",
                          str(moved / "bin/python"), str(work / "hvd_check.py")], env=env, capture_output=True,
                         text=True, cwd=work, timeout=300)
    assert hvd.returncode == 0, hvd.stdout[-3000:] + hvd.stderr[-3000:]
    assert sorted(re.findall(r"hvd (\d) ([0-9.]+)", hvd.stdout)) == [("0", "3.0"), ("1", "3.0")], hvd.stdout
