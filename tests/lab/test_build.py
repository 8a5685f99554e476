"""`kit build` on the real Docker engine: the CPU image is built, trains with Horovod,
is reused when nothing changed, and bad bases or broken steps are reported."""

import re
import subprocess

import pytest

from helpers import run_kit
from harness import BASE_IMAGE, cpu_build_flags, tf_build_settings
from kit.verify import parse_allreduce, parse_check_build

pytestmark = pytest.mark.lab
BUILD_TIMEOUT_S = 40 * 60


@pytest.fixture(scope="session")
def cpu_flags(tmp_path_factory, client) -> list[str]:
    return cpu_build_flags(tmp_path_factory.mktemp("inputs"))


def tag_of(output: str) -> str:
    return re.search(r"(kit-horovod:cpu-[0-9a-f]{12})", output)[1]


@pytest.fixture(scope="session")
def built(cpu_flags, tmp_path_factory) -> subprocess.CompletedProcess:
    r = run_kit("build", *cpu_flags, cwd=tmp_path_factory.mktemp("work"), timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def docker_run(tag: str, *argv: str, entrypoint: str | None = None) -> subprocess.CompletedProcess:
    cmd = ["docker", "run", "--rm", "--network", "none", "--hostname", "lab", "--add-host", "lab:127.0.0.1"]
    cmd += ["--entrypoint", entrypoint] if entrypoint else []
    return subprocess.run(cmd + [tag, *argv], capture_output=True, text=True, timeout=300)


def test_cpu_image_is_built_and_verified(built):
    out = built.stdout
    assert "✓ verified" in out
    assert re.search(r"frameworks\s+PyTorch", out)
    assert re.search(r"controllers\s+Gloo", out)
    assert re.search(r"operations\s+Gloo", out)
    assert re.search(r"allreduce\s+2 processes, sum rank 0 = 3, rank 1 = 3 \(expected 3\)", out)
    assert re.search(r"versions\s+Python 3\.\d+\.\d+, torch \S+, Horovod 0\.28\.1", out)


def test_image_lists_pytorch_and_gloo_and_allreduces_correctly(built):
    """Checked again without kit's verifier: the image itself, run by plain `docker run`."""
    tag = tag_of(built.stdout)
    check = parse_check_build(docker_run(tag, "horovodrun", "--check-build").stdout)
    assert "PyTorch" in check.frameworks and "Gloo" in check.controllers and "Gloo" in check.operations
    r = docker_run(tag, "horovodrun", "-np", "2", "-H", "localhost:2", "python", "/opt/kit/allreduce_check.py")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [(a.rank, a.total, a.ok) for a in parse_allreduce(r.stdout)] == [(0, 3.0, True), (1, 3.0, True)]


def test_final_image_has_no_compiler_and_no_wheelhouse(built):
    r = docker_run(tag_of(built.stdout), "-c",
                   "for c in cc gcc g++ c++ clang cpp cmake; do command -v $c; done; ls /opt/kit",
                   entrypoint="sh")
    assert r.stdout.split() == ["allreduce_check.py", "entrypoint.sh"], r.stdout


def test_container_sshd_config_is_valid_and_refuses_to_start_without_keys(built):
    tag = tag_of(built.stdout)
    r = docker_run(tag)  # default command: sshd, but no keys were mounted
    assert r.returncode == 78 and "start cluster containers with 'kit up'" in r.stderr
    r = docker_run(tag, "-c", "mkdir -p /etc/kit/ssh && ssh-keygen -q -t ed25519 -N '' "
                              "-f /etc/kit/ssh/ssh_host_ed25519_key && sshd -T", entrypoint="sh")
    settings = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    assert settings["passwordauthentication"] == "no"
    assert settings["permitrootlogin"] == "without-password"
    assert settings["kbdinteractiveauthentication"] == "no"


def test_same_inputs_reuse_the_image(built, cpu_flags, client, tmp_path):
    tag = tag_of(built.stdout)
    before = client.images.get(tag).id
    again = run_kit("build", *cpu_flags, "--no-verify", cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"✓ {tag} is up to date" in again.stdout
    assert "building" not in again.stdout
    assert client.images.get(tag).id == before


def test_changed_input_gets_a_new_tag_without_recompiling_horovod(built, cpu_flags, client, tmp_path):
    r = run_kit("build", *cpu_flags, "--pip", "six", "--no-verify", cwd=tmp_path, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    new_tag = tag_of(r.stdout)
    try:
        assert new_tag != tag_of(built.stdout)
        steps = r.stdout.splitlines()
        copy_script = next(i for i, line in enumerate(steps) if "COPY kit/build_horovod.sh" in line)
        horovod_step = steps[copy_script + 1]  # the RUN that compiles Horovod
        assert "RUN pip install" in horovod_step and horovod_step.split()[0] == "cached", horovod_step
        assert docker_run(new_tag, "-c", "python -c 'import six, horovod.torch'", entrypoint="sh").returncode == 0
    finally:
        client.images.remove(new_tag, force=True)


def test_failed_step_is_named_with_the_tail_of_its_log(built, cpu_flags, client, tmp_path):
    images_before = {i.id for i in client.images.list()}
    r = run_kit("build", *cpu_flags, "--apt", "kit-no-such-package", cwd=tmp_path, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 1
    assert re.search(r"^error: image build failed at step \d+/\d+ RUN .*apt-get install .*kit-no-such-package",
                     r.stderr, re.M), r.stderr
    assert "Unable to locate package kit-no-such-package" in r.stderr
    assert "fix:" in r.stderr
    assert {i.id for i in client.images.list()} == images_before


def test_base_image_that_does_not_exist_is_bad_input(cpu_flags, client, tmp_path):
    # A registry on a closed loopback port: the engine asks it and gets no answer, nothing leaves the machine.
    flags = [f if f != BASE_IMAGE else "127.0.0.1:9/kit-test/missing:1" for f in cpu_flags]
    images_before = {i.id for i in client.images.list()}
    r = run_kit("build", *flags, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("error: base image '127.0.0.1:9/kit-test/missing:1' is not on this machine")
    assert "fix: check the name" in r.stderr
    assert {i.id for i in client.images.list()} == images_before


def test_horovodrun_in_the_image_checks_host_keys(built):
    r = docker_run(tag_of(built.stdout), "-c", "grep -rh 'StrictHostKeyChecking' /opt/venv/lib/python3*/site-packages/"
                                               "horovod/runner/", entrypoint="sh")
    assert "StrictHostKeyChecking=yes" in r.stdout and "StrictHostKeyChecking=no" not in r.stdout


def test_tf_cpu_image_is_built_on_the_same_base_and_verified_with_tensorflow_workers(built, client, tmp_path):
    """The tf-cpu flavor: TensorFlow (Keras 2 as tf.keras), no torch or Horovod, verified by two
    MultiWorkerMirroredStrategy workers; its base stage is the CPU image's, so Docker reuses it."""
    flags = [arg for key, value in tf_build_settings().items() for arg in ("--" + key.replace("_", "-"), value)]
    r = run_kit("build", *flags, cwd=tmp_path, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    tag = re.search(r"(kit-tensorflow:tf-cpu-[0-9a-f]{12})", out)[1]
    assert "✓ verified" in out
    assert re.search(r"versions\s+Python 3\.\d+\.\d+, TensorFlow 2\.21\.0\s*$", out, re.M), out
    assert re.search(r"allreduce\s+2 processes, sum rank 0 = 3, rank 1 = 3 \(expected 3\)", out)
    assert "frameworks" not in out
    if "building" in out:  # a fresh build: the base stage came from the CPU image's
        assert re.search(r"^\s+cached\s+\d+/\d+ RUN \(! command -v update-ca-certificates", out, re.M), out
    probe = docker_run(tag, "-c", "python -c 'import tensorflow as tf; print(tf.keras.__name__)'; "
                                  "python -c 'import torch' 2>/dev/null || echo no-torch; "
                                  "command -v horovodrun || echo no-horovodrun", entrypoint="sh")
    assert probe.stdout.split() == ["tf_keras.api._v2.keras", "no-torch", "no-horovodrun"], probe.stdout + probe.stderr
    assert set(client.images.get(tag).attrs["RootFS"]["Layers"][:4]) <= \
           set(client.images.get(tag_of(built.stdout)).attrs["RootFS"]["Layers"])
