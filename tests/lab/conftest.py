"""Fixtures for tests on the real engine and the lab hosts."""

from pathlib import Path

import docker
import pytest
import yaml

from helpers import run_kit
from harness import BASE_IMAGE, Lab, cpu_build_settings

LAB_HOSTS = 3


@pytest.fixture(scope="session")
def client() -> docker.DockerClient:
    c = docker.from_env(timeout=300)
    try:
        c.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the lab base image {BASE_IMAGE} is missing: tests/run makes it")
    return c


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    with Lab(LAB_HOSTS, tmp_path_factory.mktemp("lab")) as lab:
        yield lab


@pytest.fixture(scope="session")
def project(tmp_path_factory, client, lab) -> Path:
    """A user's project folder: kit.yaml with the lab's build inputs, hosts.txt, and the image built."""
    folder = tmp_path_factory.mktemp("project")
    settings = {"build": cpu_build_settings(folder), "cluster": {"name": "lab"}}
    (folder / "kit.yaml").write_text(yaml.safe_dump(settings))
    lab.hosts_file(folder / "hosts.txt")
    r = run_kit("build", "--no-verify", cwd=folder, env=lab.env, timeout=40 * 60)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return folder
