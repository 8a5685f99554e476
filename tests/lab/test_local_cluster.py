"""The embedded default: a cluster of containers on this machine, and README's main job (cli/demo)."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from harness import local_leftovers, remove_local_clusters
from helpers import REPO, run_kit

pytestmark = pytest.mark.lab


@pytest.fixture
def clean():
    remove_local_clusters()
    yield
    remove_local_clusters()


def test_main_job_trains_across_three_local_containers_and_leaves_nothing(project, lab, clean):
    """README's main-job command, with the lab's build inputs instead of a registry's."""
    r = run_kit_demo(project, lab, "--config", str(project / "kit.yaml"), "--name", "kitlab-demo",
                     "--epochs", "3", "--samples", "1536")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    starts = re.findall(r"^\[(local-\d) rank (\d)\] rank \2/3 \(local 0\) on ([\d.]+) \((local-\d)\)", r.stdout, re.M)
    assert sorted((rank, host, name) for host, rank, _, name in starts) == \
           [("0", "local-1", "local-1"), ("1", "local-2", "local-2"), ("2", "local-3", "local-3")]
    assert len({address for *_, address, _ in starts}) == 3
    summary = r.stdout[r.stdout.index("summary"):]
    assert re.search(r"loss +[\d.]+ -> [\d.]+ \(fell\)", summary), summary
    checkpoint = "/var/lib/kit/kitlab-demo/workspace/checkpoints/cifar10_cnn.pt"
    assert re.search(rf"checkpoint +{checkpoint}", summary), summary
    assert Path(checkpoint).stat().st_size > 0
    assert not any(local_leftovers().values())
    assert not (lab.home / ".kit" / "kitlab-demo").exists()


def run_kit_demo(project, lab, *args):
    return subprocess.run([str(REPO / "cli" / "demo"), *args], cwd=project, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", **lab.env}, timeout=1200)


def test_local_cluster_is_idempotent_and_runs_commands_in_each_container(project, lab, clean):
    def kit(*args):
        return run_kit(*args, "--name", "kitlab-local", cwd=project, env=lab.env, timeout=600)
    first = kit("up", "--nodes", "2")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "cluster kitlab-local is up on this machine in 2 containers" in first.stdout
    assert "local-1: made network kit-kitlab-local" in first.stdout

    again = kit("up", "--nodes", "2")
    assert again.returncode == 0 and "2 containers: no change" in again.stdout, again.stdout

    status = kit("status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    hosts = json.loads(status.stdout)["hosts"]
    assert [(h["name"], h["container"], h["port_listening"], h["image_matches"]) for h in hosts] == \
           [("local-1", "running", True, True), ("local-2", "running", True, True)]

    exec_ = run_kit("exec", "--name", "kitlab-local", "local-2", "--", "sh", "-c", "hostname; exit 4",
                    cwd=project, env=lab.env)
    assert exec_.returncode == 4 and exec_.stdout.strip() == "[local-2] local-2"

    down = kit("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "local-1: removed network kit-kitlab-local" in down.stdout
    assert not any(local_leftovers().values())
