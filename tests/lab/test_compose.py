"""compose.yaml: a primary and two workers with nothing but Docker (Debian's docker-compose)."""

import os
import re
import subprocess

import pytest

from harness import PREFIX, local_leftovers, remove_local_clusters
from helpers import REPO, run_kit

pytestmark = pytest.mark.lab
COMPOSE_PROJECT = f"{PREFIX}-compose"


def compose(image: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["docker-compose", "-f", str(REPO / "compose.yaml"), "-p", COMPOSE_PROJECT, *args],
                          env={**os.environ, "KIT_IMAGE": image}, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def image(project) -> str:
    """The tag of the project's image (built already: kit says it is up to date)."""
    r = run_kit("build", "--no-verify", cwd=project)
    assert r.returncode == 0, r.stderr
    return re.search(r"✓ (kit-horovod:cpu-[0-9a-f]{12}) is up to date", r.stdout)[1]


def test_horovodrun_across_the_three_compose_containers(image):
    remove_local_clusters()
    try:
        up = compose(image, "up", "-d")
        assert up.returncode == 0, up.stderr[-3000:]
        hvd = ["exec", "-T", "primary", "horovodrun", "-np", "3", "-H", "primary:1,worker-1:1,worker-2:1", "-p", "12345"]
        r = compose(image, *hvd, "python", "/opt/kit/allreduce_check.py")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert sorted(re.findall(r"kit-allreduce rank=(\d) size=3 sum=6 expected=6 ok", r.stdout)) == ["0", "1", "2"]
        hosts = compose(image, *hvd, "hostname")
        assert sorted(re.findall(r"^\[\d\]<stdout>:(\S+)$", hosts.stdout, re.M)) == ["primary", "worker-1", "worker-2"]
        # Host keys are pinned: a worker that shows another key is refused.
        swap = compose(image, "exec", "-T", "worker-1", "sh", "-c",
                       "cp /etc/kit/keys/worker-2/ssh_host_ed25519_key* /etc/kit/ssh/ && kill -HUP 1")
        assert swap.returncode == 0, swap.stderr
        refused = compose(image, "exec", "-T", "primary", "ssh", "worker-1", "true")
        assert refused.returncode != 0 and "Host key verification failed" in refused.stderr, refused.stderr
    finally:
        down = compose(image, "down", "--volumes")
    assert down.returncode == 0, down.stderr[-3000:]
    assert not any(local_leftovers().values())
