"""`kit push` to a real registry on loopback: Debian's docker-registry (distribution 2.8), started here with TLS (a CA
of the test's, put in the engine's /etc/docker/certs.d) and a basic-auth login (htpasswd), the credentials in a
DOCKER_CONFIG folder of the test's. The registry's own answers are the judge: the manifest digest it serves is the one
kit printed and the one the engine recorded; a second push uploads no blob (the registry's access log says so); a
wrong password is refused with exit 1 and kit shows neither password nor auth string. The image pushed is a small
two-layer one made here from scratch (nothing to pull, fast)."""

import base64
import datetime
import io
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import run_kit

pytestmark = pytest.mark.lab

USER, PASSWORD, WRONG = "kit-pusher", "right-Pw-7f3a91c2", "wrong-Pw-0b8e55d4"
REPO, TAG = "kit-test/push", "t1"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
UPLOAD = re.compile(r'"(?:POST|PUT|PATCH) /v2/[^ "]*/blobs/uploads/')


def auth_string(password: str) -> str:
    return base64.b64encode(f"{USER}:{password}".encode()).decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for IP 127.0.0.1 that is its own CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kit-test registry")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    crt, pem = folder / "registry.crt", folder / "registry.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


class Registry:
    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.folder = folder
        self.log = folder / "registry.log"
        self.cert, self.key = make_cert(folder)
        self.certs_d = Path("/etc/docker/certs.d") / self.host
        self.proc = None

    def start(self) -> None:
        line = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True, text=True, check=True,
                              timeout=60).stdout
        (self.folder / "htpasswd").write_text(line)
        config = {"version": 0.1, "log": {"level": "info", "accesslog": {"disabled": False}},
                  "storage": {"filesystem": {"rootdirectory": str(self.folder / "storage")}},
                  "http": {"addr": self.host, "secret": "kit-test-not-a-secret",
                           "tls": {"certificate": str(self.cert), "key": str(self.key)}},
                  "auth": {"htpasswd": {"realm": "kit-test", "path": str(self.folder / "htpasswd")}}}
        (self.folder / "config.yml").write_text(json.dumps(config))  # JSON is YAML
        self.certs_d.mkdir(parents=True)
        shutil.copy(self.cert, self.certs_d / "ca.crt")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([shutil.which("docker-registry"), "serve", str(self.folder / "config.yml")],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        for _ in range(100):  # up in 0.1 s as a rule: 10 s at most
            if self.proc.poll() is not None:
                pytest.fail(f"docker-registry ended: {self.log.read_text()[-2000:]}")
            try:
                self.get("/v2/", auth=False)
            except urllib.error.HTTPError as e:
                if e.code == 401:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        pytest.fail(f"docker-registry did not answer on {self.host}: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.certs_d, ignore_errors=True)

    def get(self, path: str, method: str = "GET", auth: bool = True, accept: str | None = None):
        request = urllib.request.Request(f"https://{self.host}{path}", method=method)
        if auth:
            request.add_header("Authorization", f"Basic {auth_string(PASSWORD)}")
        if accept:
            request.add_header("Accept", accept)
        context = ssl.create_default_context(cafile=str(self.cert))
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.headers, answer.read()

    def log_size(self) -> int:
        return self.log.stat().st_size

    def uploads_since(self, offset: int) -> list[str]:
        with self.log.open("rb") as log:
            log.seek(offset)
            return [line for line in log.read().decode(errors="replace").splitlines() if UPLOAD.search(line)]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    reg = Registry(tmp_path_factory.mktemp("registry"))
    try:
        reg.start()
        yield reg
    finally:
        reg.stop()
    assert not reg.certs_d.exists()


def docker_config(folder: Path, host: str, password: str) -> dict[str, str]:
    """kit's environment with a Docker config that holds a login for host."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth_string(password)}}}))
    return {"DOCKER_CONFIG": str(folder)}


@pytest.fixture(scope="module")
def small_image(client):
    """Two layers of a few random KiB on scratch: pushed in a second; removed with every tag given to it."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", b"FROM scratch\nCOPY a /a\nCOPY b /b\n"), ("a", os.urandom(48_000)),
                           ("b", os.urandom(24_000))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image, _ = client.images.build(fileobj=context, custom_context=True, tag="kit-test/push-small:t1", rm=True,
                                   labels={"io.kit.test": "push"})
    try:
        yield "kit-test/push-small:t1"
    finally:
        client.images.remove(image.id, force=True)  # the tags kit made go with it


def kit_push(tmp: Path, env: dict, ref: str, image: str):
    return run_kit("push", ref, "--image", image, cwd=tmp, env=env, timeout=120)


def said(output: str) -> tuple[str, int, int]:
    digest = re.search(r"^digest: (sha256:[0-9a-f]{64})$", output, re.M)
    counts = re.search(r": (\d+) layers? sent, (\d+) already there$", output, re.M)
    assert digest and counts, output
    return digest[1], int(counts[1]), int(counts[2])


def test_a_push_lands_the_images_own_digest_and_a_second_sends_no_layer(registry, small_image, client, tmp_path):
    env = docker_config(tmp_path / "docker", registry.host, PASSWORD)
    ref = f"{registry.host}/{REPO}:{TAG}"
    start = registry.log_size()
    first = kit_push(tmp_path, env, ref, small_image)
    assert first.returncode == 0, first.stdout + first.stderr
    digest, sent, present = said(first.stdout)
    assert (sent, present) == (2, 0)
    assert registry.uploads_since(start), "the first push uploaded no blob: the log check below could never fail"

    headers, _ = registry.get(f"/v2/{REPO}/manifests/{TAG}", method="HEAD", accept=MANIFEST_V2)
    assert headers["Docker-Content-Digest"] == digest, first.stdout
    _, body = registry.get(f"/v2/{REPO}/manifests/{TAG}", accept=MANIFEST_V2)
    manifest = json.loads(body)
    local = client.images.get(small_image)
    assert manifest["config"]["digest"] == local.id
    assert f"{registry.host}/{REPO}@{digest}" in local.attrs["RepoDigests"]
    assert f"{registry.host}/{REPO}:{TAG}" in local.tags

    start = registry.log_size()
    second = kit_push(tmp_path, env, ref, small_image)
    assert second.returncode == 0, second.stdout + second.stderr
    assert said(second.stdout) == (digest, 0, 2)
    time.sleep(0.5)  # the registry writes its access log line as it answers; give the last one time to land
    assert registry.uploads_since(start) == []


def test_a_wrong_password_is_refused_and_never_shown(registry, small_image, tmp_path):
    env = docker_config(tmp_path / "docker", registry.host, WRONG)
    r = kit_push(tmp_path, env, f"{registry.host}/{REPO}:wrong", small_image)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"error: push to {registry.host} failed: the registry refused the login: "), r.stderr
    assert lines[-1].startswith(f"fix: log in to it: docker login {registry.host} "), r.stderr
    for secret in (WRONG, PASSWORD, auth_string(WRONG), auth_string(PASSWORD)):
        assert secret not in r.stdout + r.stderr
