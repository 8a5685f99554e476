"""Fixtures for tests on the real engine and the lab hosts."""

from pathlib import Path

import docker
import pytest

from harness import BASE_IMAGE, Lab, make_project

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
    return make_project(tmp_path_factory.mktemp("project"), lab, "lab")
