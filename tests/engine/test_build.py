"""`kit build` on the real Docker engine, with kit's defaults and nothing else, as a new user runs it: the
CPU image is built from what this machine has, trains with Horovod, is reused when nothing changed; bad
bases, broken steps and silent package sources are reported."""

import base64
import http.server
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from helpers import closed_port, run_kit, silent_listener
from kit.cluster.identity import state_root
from kit.image.verify import parse_allreduce, parse_check_build

pytestmark = pytest.mark.lab
BUILD_TIMEOUT_S = 40 * 60


def tag_of(output: str) -> str:
    return re.search(r"(kit-horovod:cpu-[0-9a-f]{12})", output)[1]


@pytest.fixture(scope="session")
def built(tmp_path_factory, client) -> subprocess.CompletedProcess:
    """`kit build` in a folder without kit.yaml: the image cli/demo and the lab's clusters use."""
    r = run_kit("build", cwd=tmp_path_factory.mktemp("work"), timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def docker_run(tag: str, *argv: str, entrypoint: str | None = None,
               timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = ["docker", "run", "--rm", "--network", "none", "--hostname", "lab", "--add-host", "lab:127.0.0.1"]
    cmd += ["--entrypoint", entrypoint] if entrypoint else []
    return subprocess.run(cmd + [tag, *argv], capture_output=True, text=True, timeout=timeout)


def test_cpu_image_is_built_and_verified(built):
    out = built.stdout
    assert "✓ verified" in out
    assert re.search(r"frameworks\s+PyTorch", out)
    assert re.search(r"controllers\s+Gloo", out)
    assert re.search(r"operations\s+Gloo", out)
    assert re.search(r"allreduce\s+2 processes, sum rank 0 = 3, rank 1 = 3 \(expected 3\)", out)
    assert re.search(r"versions\s+Python 3\.\d+\.\d+, torch \S+, Horovod 0\.28\.1", out)


# ---------------------------------------------------------------- the gpu flavor, built here (no GPU, no registry)
# Right after the cpu image, which the lab needs first: the longest build runs beside the lab's first modules, which
# have no test `alone` to wait for it (tests/lab/conftest.py).

@pytest.fixture(scope="session")
def gpu_built(tmp_path_factory, client) -> subprocess.CompletedProcess:
    """kit's gpu defaults, with Horovod's kernels for sm_90 only (the suite's time; users get every GPU nvcc knows)."""
    r = run_kit("build", "--flavor", "gpu", "--cuda-arch", "90", cwd=tmp_path_factory.mktemp("gpu"),
                timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    return r


def test_gpu_image_is_built_without_a_gpu_or_a_registry_for_its_cuda_line(gpu_built):
    out = gpu_built.stdout
    tag = re.search(r"(kit-horovod:gpu-[0-9a-f]{12})", out)[1]
    assert "✓ verified" in out and re.search(r"operations\s+.*NCCL", out), out[-3000:]
    assert re.search(r"CUDA\s+13\.0 \(torch's build\), GPU architectures .*sm_90", out), out[-3000:]
    assert "the NCCL path was not verified: no GPU is visible on this machine" in out, out[-3000:]  # said, not skipped
    probe = docker_run(tag, "-c", "python -c 'import json, torch, horovod.torch as hvd; print(json.dumps("
                                  "[torch.version.cuda, torch._C._cuda_getArchFlags().split(), hvd.nccl_built()]))'; "
                       "command -v nvcc || ls /opt/venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc || echo no-nvcc",
                       entrypoint="sh")
    (cuda, archs, nccl), nvcc = json.loads(probe.stdout.splitlines()[-2]), probe.stdout.splitlines()[-1]
    assert cuda == "13.0" and "sm_90" in archs and {"sm_100", "sm_120"} & set(archs), archs
    assert nccl and nvcc == "no-nvcc"  # the compiler stayed in the builder: one CUDA, torch's, in the image


def test_the_gpu_images_horovod_is_built_by_cmake_4_and_gcc_13_or_newer(gpu_built, client, tmp_path):
    """The gpu recipe's builder (Debian trixie: GCC 14; CMake from pip: 4.x) built the image's Horovod: its torch
    library names the GCC that compiled it, and the builder installs CMake only from the build's wheelhouse (pip
    --no-index), where the one CMake wheel is 4 or newer, with which Horovod's CMake files must work."""
    from kit.image.build import resolve_sources
    from kit.config.settings import ConfigFile, build_config
    config = build_config(ConfigFile(), {"flavor": "gpu", "cuda_archs": ("90",)})
    wheelhouse = resolve_sources(client, config, tmp_path / "work").wheelhouse
    cmakes = sorted({w.name.split("-")[1] for fs in wheelhouse.files.values() for w in fs if w.name.startswith("cmake-")})
    assert len(cmakes) == 1 and int(cmakes[0].split(".")[0]) >= 4, cmakes
    image = re.search(r"(kit-horovod:gpu-[0-9a-f]{12})", gpu_built.stdout)[1]
    made = docker_run(image, "-c", "grep -a -o -h 'GCC: ([^)]*) [0-9.]*' "
                                   "/opt/venv/lib/python3*/site-packages/horovod/torch/mpi_lib_v2*.so | sort -u",
                      entrypoint="sh")
    gccs = made.stdout.split("\n")[:-1]
    assert gccs and all(int(g.rsplit(" ", 1)[1].split(".")[0]) >= 13 for g in gccs), made.stdout + made.stderr


# ---------------------------------------------------------------- the cpu image, checked

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


def test_horovods_libraries_are_built_as_release_without_debug_info(built):
    r = docker_run(tag_of(built.stdout), "-c", "import glob, horovod, os; libs = glob.glob(os.path.dirname("
                   "horovod.__file__) + '/**/*.so', recursive=True); print(len(libs), sum(b'.debug_info' in "
                   "open(f, 'rb').read() for f in libs))", entrypoint="python")
    found, with_debug_info = map(int, r.stdout.split())
    assert found >= 1 and with_debug_info == 0, r.stdout + r.stderr


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


def test_same_inputs_reuse_the_image(built, client, tmp_path):
    tag = tag_of(built.stdout)
    before = client.images.get(tag).id
    again = run_kit("build", "--no-verify", cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"✓ {tag} is up to date (built before from the same settings)" in again.stdout
    assert "building" not in again.stdout and "sources" not in again.stdout  # nothing resolved again
    assert client.images.get(tag).id == before


def sources(out: str) -> dict[str, str]:
    """The `sources` table kit prints before it builds: name -> what it says."""
    table = out[out.index("sources\n"):out.index("building ")]
    return {m[1]: m[2] for m in re.finditer(r"^  (\w+) +(.*)$", table, re.M)}


def remove_image_of(flags: list[str], client, cwd: Path, env: dict | None = None) -> None:
    """Remove the image `kit build FLAGS` would find up to date (a run killed before its cleanup left it), so that
    the build really builds."""
    plan = run_kit("build", *flags, "--dry-run", cwd=cwd, env=env)
    key = re.search(r"^  key +([0-9a-f]+)", plan.stdout, re.M)[1]
    for old in client.images.list(filters={"label": f"io.kit.key={key}"}):
        client.images.remove(old.id, force=True)


def test_changed_input_gets_a_new_tag_without_recompiling_horovod(built, client, tmp_path):
    remove_image_of(["--pip", "six"], client, tmp_path)
    r = run_kit("build", "--pip", "six", "--no-verify", cwd=tmp_path, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    new_tag = tag_of(r.stdout)
    try:
        # It says what it used: the base (a registry's, or made from this machine's mirror), pip's own sources,
        # and wheels for the image's Python whose torch is the CPU build.
        found = sources(r.stdout)
        assert re.match(r"(debian:bookworm-slim|kit-base/debian:bookworm): ", found["base"]), found
        assert found["pip"].startswith("index ") and "torch-2.13.0+cpu-cp311" in found["wheels"], found
        assert re.search(r"for CPython 3\.11, glibc 2\.\d+, x86_64", found["wheels"]), found
        assert new_tag != tag_of(built.stdout)
        steps = r.stdout.splitlines()
        copy_script = next(i for i, line in enumerate(steps) if "COPY kit/build_horovod.sh" in line)
        horovod_step = steps[copy_script + 1]  # the RUN that compiles Horovod
        assert "RUN pip install" in horovod_step and horovod_step.split()[0] == "cached", horovod_step
        assert docker_run(new_tag, "-c", "python -c 'import six, horovod.torch'", entrypoint="sh").returncode == 0
    finally:
        client.images.remove(new_tag, force=True)


def test_changed_extra_packages_keep_every_layer_below_theirs(built, client, tmp_path):
    """Built with one set of extras, then another: the stages below take the files they took for the first image
    (`pinned`, though the index may have released new versions since), so every layer below the extras' own is the
    first image's, and `kit up` sends hosts that hold it only the top ones."""
    # Kit's pins of this machine's builds (the fixture's among them, so the stages below stay as built), less those
    # that hold six: an earlier run on this machine may have pinned the second build's extras, which must be new.
    home = tmp_path / "kit-home"
    (home / ".wheels").mkdir(parents=True)
    for pin in (state_root() / ".wheels").glob("*.json"):
        if "six-" not in pin.read_text():
            shutil.copy(pin, home / ".wheels")
    env = {"KIT_HOME": str(home)}
    layers, tags = [], []
    try:
        for extras in (("tqdm",), ("tqdm", "six")):
            flags = [a for p in extras for a in ("--pip", p)]
            remove_image_of(flags, client, tmp_path, env)
            r = run_kit("build", *flags, "--no-verify", cwd=tmp_path, env=env, timeout=BUILD_TIMEOUT_S)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            tags.append(tag_of(r.stdout))
            layers.append(client.images.get(tags[-1]).attrs["RootFS"]["Layers"])
        assert sources(r.stdout)["pinned"].startswith("torch, build, tools: "), sources(r.stdout)
        shared = next(i for i, (a, b) in enumerate(zip(*layers)) if a != b)
        assert len(layers[1]) - shared <= 4, (shared, len(layers[1]))  # the extras' delta and kit's files on top
    finally:
        for tag in tags:
            client.images.remove(tag, force=True)


@pytest.mark.alone  # the engine's images before and after: the other stream's builds would count
def test_failed_step_is_named_with_the_tail_of_its_log(built, client, tmp_path):
    images_before = {i.id for i in client.images.list()}
    r = run_kit("build", "--apt", "kit-no-such-package", cwd=tmp_path, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 1
    assert re.search(r"^error: image build failed at step \d+/\d+ RUN .*apt-get install .*kit-no-such-package",
                     r.stderr, re.M), r.stderr
    assert "Unable to locate package kit-no-such-package" in r.stderr
    assert "fix:" in r.stderr
    assert {i.id for i in client.images.list()} == images_before


@pytest.mark.alone  # the engine's images before and after: the other stream's builds would count
def test_base_image_that_does_not_exist_is_bad_input(client, tmp_path):
    # A registry on a closed loopback port: the engine asks it and gets no answer, nothing leaves the machine.
    images_before = {i.id for i in client.images.list()}
    r = run_kit("build", "--base-image", "127.0.0.1:9/kit-test/missing:1", cwd=tmp_path)
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
    r = run_kit("build", "--flavor", "tf-cpu", cwd=tmp_path, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    tag = re.search(r"(kit-tensorflow:tf-cpu-[0-9a-f]{12})", out)[1]
    assert "✓ verified" in out
    assert re.search(r"versions\s+Python 3\.\d+\.\d+, TensorFlow 2\.21\.0\s*$", out, re.M), out
    assert re.search(r"allreduce\s+2 processes, sum rank 0 = 3, rank 1 = 3 \(expected 3\)", out)
    assert "frameworks" not in out
    if "is up to date" not in out:  # built here (not another's build, waited for): the base stage is the CPU image's
        assert re.search(r"^\s+cached\s+\d+/\d+ RUN \(! command -v update-ca-certificates", out, re.M), out
    probe = docker_run(tag, "-c", "python -c 'import tensorflow as tf; print(tf.keras.__name__)'; "
                                  "python -c 'import torch' 2>/dev/null || echo no-torch; "
                                  "command -v horovodrun || echo no-horovodrun", entrypoint="sh")
    assert probe.stdout.split() == ["tf_keras.api._v2.keras", "no-torch", "no-horovodrun"], probe.stdout + probe.stderr
    assert set(client.images.get(tag).attrs["RootFS"]["Layers"][:4]) <= \
           set(client.images.get(tag_of(built.stdout)).attrs["RootFS"]["Layers"])


# ---------------------------------------------------------------- package sources

class AuthIndex(http.server.BaseHTTPRequestHandler):
    """A PEP 503 index of one folder that wants a user and password (Basic), as private indexes do."""

    folder: Path
    seen: list[str] = []

    def do_GET(self):
        if self.headers.get("Authorization") != "Basic " + base64.b64encode(b"kit:s3cret").decode():
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="kit-test"')
            self.end_headers()
            return
        AuthIndex.seen.append(self.path)
        parts = [urllib.parse.unquote(p) for p in self.path.strip("/").split("/")]
        if parts[0] == "simple" and len(parts) == 2:
            files = [f.name for f in sorted(self.folder.iterdir()) if project_of(f.name) == parts[1]]
            body = "".join(f'<a href="/files/{name}">{name}</a>\n' for name in files).encode()
            self._send(200 if files else 404, body, "text/html")
        elif parts[0] == "files" and (self.folder / parts[-1]).is_file():
            self._send(200, (self.folder / parts[-1]).read_bytes(), "application/octet-stream")
        else:
            self._send(404, b"", "text/plain")

    def _send(self, code, body, kind):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def project_of(filename: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"^(.+?)-\d", filename)[1]).lower()


@pytest.fixture
def private_index(client, tmp_path):
    """What the default image and `six` need, resolved with this machine's pip, behind a password on loopback."""
    from kit.image import base as baseimage
    from kit.image import pipconfig
    from kit.image import wheels
    from kit.image.build import image_target
    from kit.config.settings import ConfigFile, build_config

    config = build_config(ConfigFile(), {"pip_packages": ("six",)})
    target = image_target(client, baseimage.ensure(client, config.base_image).ref, config.python)
    found = wheels.resolve(config, target, pipconfig.read(), tmp_path / "resolved")
    folder = tmp_path / "index"
    folder.mkdir()
    for f in (f for files in found.files.values() for f in files):
        f.rename(folder / f.name)
    AuthIndex.folder, AuthIndex.seen = folder, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AuthIndex)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://kit:s3cret@127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


def test_an_index_password_reaches_no_layer_env_or_history_of_the_image(built, client, private_index, tmp_path):
    r = run_kit("build", "--index-url", private_index, "--pip", "six", "--no-verify", cwd=tmp_path,
                timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "s3cret" not in r.stdout + r.stderr
    shown = private_index.replace("kit:s3cret", "****")
    assert sources(r.stdout)["pip"].startswith(f"index {shown}; "), sources(r.stdout)
    assert "/simple/six/" in AuthIndex.seen  # pip really resolved through the private index
    tag = tag_of(r.stdout)
    try:
        for argv in (["docker", "history", "--no-trunc", tag], ["docker", "inspect", tag]):
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            assert "s3cret" not in out and "PIP_INDEX_URL" not in out, argv
        layers = subprocess.run(f"docker save {tag} | grep -a -c s3cret", shell=True, capture_output=True, text=True)
        assert layers.stdout.strip() == "0", "an image layer holds the password"
    finally:
        client.images.remove(tag, force=True)


@pytest.fixture
def silent_port():
    sock = silent_listener()
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_a_package_source_that_does_not_answer_stops_the_build_at_once_naming_it(built, kind, silent_port, tmp_path):
    port, why = (closed_port(), "the connection was refused") if kind == "refused" else (silent_port, "no answer within 10 s")
    started = time.monotonic()
    r = run_kit("build", "--index-url", f"http://127.0.0.1:{port}/simple", "--pip", "six", cwd=tmp_path, timeout=300)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr
    assert time.monotonic() - started < 60
    assert r.stderr.splitlines() == [
        f"error: the package source http://127.0.0.1:{port}/simple does not answer: {why}",
        "fix: check the network or proxy to it, or remove it from kit.yaml's build.pip_index_urls "
        "(`pip config list` shows pip's sources)"]
    assert "building" not in r.stdout
