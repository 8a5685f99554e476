"""The embedded default: a cluster of containers on this machine, and README's main job (cli/demo)."""

import json
import os
import re
import shutil
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


DEMO_STATE = Path.home() / ".kit" / "demo"
DEMO_DIR = Path("/var/lib/kit/demo")


def demo_leftovers() -> dict[str, list[str]]:
    """The demo cluster's containers, network and state on this machine, as `cli/demo` makes them for its user."""
    def names(*argv: str) -> list[str]:
        out = subprocess.run(argv, capture_output=True, text=True).stdout.split()
        return [n for n in out if n == "kit-demo" or n.startswith("kit-demo-")]
    return {"containers": names("docker", "ps", "-a", "--format", "{{.Names}}"),
            "networks": names("docker", "network", "ls", "--format", "{{.Name}}"),
            "state": [str(DEMO_STATE)] if DEMO_STATE.exists() else []}


@pytest.fixture
def new_user(tmp_path):
    """README's main job runs as this machine's user runs it: their home, their pip configuration, their engine.
    A demo cluster of theirs is never touched; what the test's own run leaves is removed."""
    if DEMO_STATE.exists() or any(demo_leftovers().values()):
        pytest.fail(f"a demo cluster of this machine's user exists ({demo_leftovers()}): `kit down --name demo` "
                    "first; this test runs cli/demo as that user and would take it over")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIT_", "PYTEST_", "COLUMNS"))}
    yield tmp_path, env
    left = demo_leftovers()
    for kind, argv in (("containers", ["docker", "rm", "-f"]), ("networks", ["docker", "network", "rm"])):
        if left[kind]:
            subprocess.run(argv + left[kind], capture_output=True)
    shutil.rmtree(DEMO_STATE, ignore_errors=True)
    shutil.rmtree(DEMO_DIR, ignore_errors=True)
    assert not any(left.values()), f"cli/demo left {left}"


def test_readme_main_job_exactly_as_written_trains_and_leaves_nothing(new_user):
    """`cli/demo`, no arguments, no kit.yaml, no variable a new user would not have: the image from what this
    machine has (no registry here), three local containers, the CIFAR-10 example across them, a summary."""
    folder, env = new_user
    r = subprocess.run([str(REPO / "cli" / "demo")], cwd=folder, capture_output=True, text=True, env=env, timeout=2400)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    starts = re.findall(r"^\[(local-\d) rank (\d)\] rank \2/3 \(local 0\) on ([\d.]+) \((local-\d)\)", r.stdout, re.M)
    assert sorted((rank, host, name) for host, rank, _, name in starts) == \
           [("0", "local-1", "local-1"), ("1", "local-2", "local-2"), ("2", "local-3", "local-3")], r.stdout[-3000:]
    assert len({address for *_, address, _ in starts}) == 3
    summary = r.stdout[r.stdout.index("summary"):]
    assert re.search(r"loss +[\d.]+ -> [\d.]+ \(fell\)", summary), summary
    checkpoint = DEMO_DIR / "workspace/checkpoints/cifar10_cnn.pt"
    assert re.search(rf"checkpoint +{checkpoint}", summary), summary
    assert checkpoint.stat().st_size > 0
    assert "the cluster is down" in summary
    assert not any(demo_leftovers().values())


def test_down_of_a_local_cluster_leaves_kits_root_folder_to_the_lab_hosts(project, lab, clean):
    """The fresh-machine failure of the lab's clusters: this machine's /var/lib/kit, empty but for a local
    cluster, was removed by its `kit down`, which detached every lab host's own /var/lib/kit; the hosts then
    shared one folder, and each container served the SSH host key written last."""
    kit_root = Path("/var/lib/kit")
    others = [p.name for p in kit_root.iterdir()]  # on a fresh machine: none, as when it failed
    assert all(h.own_kit_dir() for h in lab.hosts)
    up = run_kit("up", "--nodes", "1", "--name", "kitlab-root", cwd=project, env=lab.env, timeout=600)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    down = run_kit("down", "--name", "kitlab-root", cwd=project, env=lab.env, timeout=600)
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    assert "removed /var/lib/kit/kitlab-root/local-1" in down.stdout
    assert kit_root.is_dir() and sorted(p.name for p in kit_root.iterdir()) == sorted(others)
    assert [h.name for h in lab.hosts if not h.own_kit_dir()] == []


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
    assert exec_.returncode == 4 and exec_.stdout == "local-2\n"

    down = kit("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "local-1: removed network kit-kitlab-local" in down.stdout
    assert not any(local_leftovers().values())
