"""build.flavor auto on the lab's hosts, whose sessions get a stand-in nvidia-smi (4 GPUs of a chosen driver): the
flavor follows the hosts, each host's driver is checked against the image's CUDA line by `kit up` (also a dry run) and
`kit doctor` alike, mixed hosts are refused, and nothing changes on any host. No GPU is here: no GPU container is run,
only dry runs and checks. The pure parts (parsers on real nvidia-smi output, the driver table): tests/unit/test_flavor.py."""

import re
import shutil

import pytest

from harness import remove_local_clusters
from helpers import closed_port, run_kit

pytestmark = pytest.mark.lab

OLD, NEW = "535.183.01", "580.159.04"
REFUSAL = f"NVIDIA driver {OLD} is older than 580, the minimum for the image's CUDA 13.0; CUDA 12.8 runs on it"


@pytest.fixture
def folder(lab, tmp_path):
    """A user's folder with hosts.txt and no kit.yaml: build.flavor is auto."""
    lab.hosts_file(tmp_path / "hosts.txt")
    return tmp_path


def host_state(lab) -> dict:
    """What of the lab hosts an `up` could change: containers, images, networks, kit's folders; and kit's record."""
    seen = {h.name: (h.docker("ps", "-aq").stdout, h.docker("images", "-q", "--no-trunc").stdout,
                     h.docker("network", "ls", "-q").stdout, h.kit_files()) for h in lab.hosts}
    seen["control machine"] = sorted(p.name for p in (lab.home / ".kit").glob("*") if not p.name.startswith("."))
    return seen


def assert_no_stand_in(lab) -> None:
    for h in lab.hosts:
        assert lab.ssh(h, "command -v nvidia-smi", check=False).returncode != 0, h.name
        assert not (h.run / "nvidia").exists(), h.name
        assert "nvidia" not in h.docker("info", "--format", "{{json .Runtimes}}").stdout, h.name


def test_driver_535_is_refused_by_up_and_by_the_doctor_naming_each_host_and_the_cuda_line_that_fits(lab, folder):
    """...and the fix works as printed: the kit.yaml it gives makes the next `kit up` plan the CUDA 12.8 image
    (before, its `kit build --cuda 12.8` built an image that kit up, which reads kit.yaml alone, did not take)."""
    before = host_state(lab)
    with lab.nvidia(lab.hosts, OLD, runtime=True):  # (a toolkit there: the fixed plan goes on past that check)
        for h in lab.hosts:  # what the hosts' own sessions see, as kit does over SSH
            assert lab.ssh(h, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout == f"{OLD}\n" * 4
        up = run_kit("up", "--hosts", "hosts.txt", "--dry-run", cwd=folder, env=lab.env, timeout=300)
        doctor = run_kit("doctor", "--hosts", "hosts.txt", cwd=folder, env=lab.env, timeout=300)
        fix = re.search(r"\(a new kit\.yaml: `([^`]+)`\)", up.stderr)
        assert fix, up.stderr
        (folder / "kit.yaml").write_text(fix[1] + "\n")  # the fix, as printed
        fixed = run_kit("up", "--hosts", "hosts.txt", "--dry-run", cwd=folder, env=lab.env, timeout=300)
    assert_no_stand_in(lab)
    assert host_state(lab) == before
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert re.search(r"^would build kit-horovod:gpu-… \(flavor gpu, CUDA 12\.8, key ", fixed.stdout, re.M), fixed.stdout

    assert up.returncode == 1, up.stdout + up.stderr
    every = ", ".join(f"{h.address}: 4" for h in lab.hosts)
    assert f"flavor auto -> gpu: every host has NVIDIA GPUs ({every})" in up.stdout, up.stdout
    assert up.stderr.startswith("error: preflight failed on 3 hosts: "), up.stderr
    for h in lab.hosts:
        assert f"  {h.address}: {REFUSAL}\n" in up.stderr, up.stderr
    assert ('fix: build for CUDA 12.8: put `cuda: "12.8"` in the build section of kit.yaml (a new kit.yaml: `build: '
            '{cuda: "12.8"}`), which kit build and kit up both read, and run kit up again; or install NVIDIA driver 580 '
            "or newer on the host") in up.stderr
    assert "would build" not in up.stdout and "plan" not in up.stdout  # refused before an image is even looked for

    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    for h in lab.hosts:
        section = doctor.stdout.split(h.address + "\n", 1)[1]
        assert re.search(rf"^  fail cuda +{re.escape(REFUSAL)}\n +fix: build for CUDA 12\.8", section, re.M), section


@pytest.mark.alone  # the engine's images before and after: the other stream's builds would count
def test_driver_580_decides_gpu_and_plans_the_image_it_would_build_changing_nothing(lab, folder, client):
    images = sorted(i.id for i in client.images.list())
    before = host_state(lab)
    with lab.nvidia(lab.hosts, NEW, runtime=True):
        up = run_kit("up", "--hosts", "hosts.txt", "--dry-run", cwd=folder, env=lab.env, timeout=300)
        build = run_kit("build", "--hosts", "hosts.txt", "--dry-run", cwd=folder, env=lab.env, timeout=300)
        doctor = run_kit("doctor", "--hosts", "hosts.txt", cwd=folder, env=lab.env, timeout=300)
    assert_no_stand_in(lab)
    assert host_state(lab) == before
    assert sorted(i.id for i in client.images.list()) == images  # nothing was built here either

    assert up.returncode == 0, up.stdout + up.stderr
    every = ", ".join(f"{h.address}: 4" for h in lab.hosts)
    assert f"flavor auto -> gpu: every host has NVIDIA GPUs ({every})" in up.stdout
    said = re.search(r"^would build (kit-horovod:gpu-…) \(flavor gpu, CUDA 13\.0, key [0-9a-f]{24}\): no image of these "
                     r"settings is here; kit up builds it first", up.stdout, re.M)
    assert said, up.stdout
    assert "plan (dry run: nothing was changed)" in up.stdout
    for h in lab.hosts:
        assert re.search(rf"^  {re.escape(h.address)}: docker load .*kit-horovod:gpu-", up.stdout, re.M), up.stdout
        assert re.search(rf"^  {re.escape(h.address)}: docker run .*--gpus all", up.stdout, re.M), up.stdout

    assert build.returncode == 0, build.stdout + build.stderr
    assert build.stdout.splitlines()[0] == f"flavor auto -> gpu: every host has NVIDIA GPUs ({every})"
    assert 'io.kit.flavor="gpu" io.kit.cuda="13.0"' in build.stdout

    for h in lab.hosts:
        section = doctor.stdout.split(h.address + "\n", 1)[1]
        assert re.search(rf"^  ok   cuda +NVIDIA driver {NEW} runs CUDA 13\.0 \(it needs 580 or newer\)", section,
                         re.M), doctor.stdout


def test_gpus_on_one_host_only_are_refused_as_mixed_naming_the_hosts(lab, folder):
    before = host_state(lab)
    h1, h2, h3 = lab.hosts
    with lab.nvidia([h1], NEW):
        up = run_kit("up", "--hosts", "hosts.txt", "--dry-run", cwd=folder, env=lab.env, timeout=300)
        real = run_kit("up", "--hosts", "hosts.txt", cwd=folder, env=lab.env, timeout=300)
    assert_no_stand_in(lab)
    assert host_state(lab) == before
    for r in (up, real):
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.splitlines() == [
            f"error: build.flavor (default auto): {h1.address} has NVIDIA GPUs and {h2.address} and {h3.address} have "
            "none; one image cannot serve both",
            "fix: list only one kind of host in hosts.txt, or set build.flavor: cpu in kit.yaml to use CPUs everywhere"]


def test_prepare_with_a_gpu_flavor_names_every_host_without_a_gpu_and_changes_nothing(lab, folder):
    (folder / "kit.yaml").write_text("build:\n  flavor: gpu\n")
    before = host_state(lab)
    r = run_kit("prepare", "--hosts", "hosts.txt", "--check", cwd=folder, env=lab.ansible_env, timeout=600)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    for h in lab.hosts:
        assert (f"{h.address} has no NVIDIA GPU (none on its PCI bus, nvidia-smi lists none), but build.flavor is a GPU "
                "flavor") in r.stdout, r.stdout[-3000:]
    assert host_state(lab) == before


# ---------------------------------------------------------------- kit up builds the image of the decided flavor

def test_up_builds_the_missing_image_as_kit_build_does_and_stops_with_its_error(lab, folder):
    """The image of these settings is not here: up builds it (the same build, the same error) after reading the
    hosts, and a failed build leaves every host as it was."""
    port = closed_port()
    (folder / "kit.yaml").write_text(f"build:\n  pip_packages: [six]\n  pip_index_urls: [http://127.0.0.1:{port}/simple]\n")
    before = host_state(lab)
    up = run_kit("up", "--hosts", "hosts.txt", cwd=folder, env=lab.env, timeout=300)
    build = run_kit("build", cwd=folder, env=lab.env, timeout=300)
    assert host_state(lab) == before
    assert up.returncode == build.returncode == 1, up.stdout + up.stderr
    assert up.stderr == build.stderr and up.stderr.startswith(f"error: the package source http://127.0.0.1:{port}/simple "
                                                               "does not answer"), up.stderr
    assert "flavor auto -> cpu: no host has an NVIDIA GPU" in up.stdout
    assert "no cpu image of these settings is built here yet: building it (as kit build does)" in up.stdout


@pytest.mark.alone  # removes the images of the default settings with six, which tests/engine/test_build.py builds too
def test_up_of_a_local_cluster_builds_the_missing_image_then_brings_the_cluster_up(lab, client, tmp_path):
    """This machine has no GPU: cpu; the default image with six on top is built by `kit up` (as this machine's user
    builds: its pins keep every layer below six's), then the cluster of one container comes up on it."""
    from kit.cluster.identity import state_root
    name = "kitlab-upbuild"
    (tmp_path / "kit.yaml").write_text(f"build:\n  pip_packages: [six]\ncluster:\n  name: {name}\n")
    key = re.search(r"^  key +([0-9a-f]+)", run_kit("build", "--dry-run", cwd=tmp_path).stdout, re.M)[1]
    for old in client.images.list(filters={"label": f"io.kit.key={key}"}):
        client.images.remove(old.id, force=True)
    remove_local_clusters()
    try:
        up = run_kit("up", "--nodes", "1", cwd=tmp_path, timeout=40 * 60)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert "flavor auto -> cpu: this machine has no NVIDIA GPU\n" in up.stdout
        assert "no cpu image of these settings is built here yet: building it (as kit build does)" in up.stdout
        assert "sources\n" in up.stdout and re.search(r"^✓ built kit-horovod:cpu-[0-9a-f]+$", up.stdout, re.M)
        assert f"✓ cluster {name} is up on this machine in 1 containers" in up.stdout
        assert client.images.list(filters={"label": f"io.kit.key={key}"}), "the image was not kept"
        again = run_kit("up", "--nodes", "1", cwd=tmp_path, timeout=600)
        assert again.returncode == 0 and "building" not in again.stdout, again.stdout[-2000:] + again.stderr
    finally:
        down = run_kit("down", cwd=tmp_path, timeout=600)
        remove_local_clusters()
        shutil.rmtree(state_root() / name, ignore_errors=True)
        for old in client.images.list(filters={"label": f"io.kit.key={key}"}):
            client.images.remove(old.id, force=True)
    assert down.returncode == 0, down.stdout + down.stderr
