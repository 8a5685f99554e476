"""README's quickstart, played on the lab's three hosts command for command as the front page writes it: kit
installed from a copy of this repository into a venv of its own, hosts.txt written, the hosts prepared (Ansible's
check mode: the lab's hosts are namespaces of this machine, whose packages kit must not change), the cluster up
(the cpu image: the lab has no GPU), the doctor, the CIFAR-10 example, down. The same commands on GPU servers are
tests/lab/test_gpu_hosts.py's, with a stand-in nvidia-smi on every host: `kit up --hosts hosts.txt --dry-run` decides
the gpu image and plans it for driver 580, and it and `kit doctor --hosts hosts.txt` refuse driver 535, naming each
host, the driver, the minimum and the CUDA line that fits."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.lab

NAMES = ("gpu-1", "gpu-2", "gpu-3")


def quickstart() -> list[str]:
    """The commands of README's quickstart block, comments and blank lines left out."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quickstart on your servers", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)[1]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readmes_quickstart_has_the_steps_this_test_plays():
    """A change of the quickstart's commands changes this test too: what each step is, is said below."""
    steps = quickstart()
    assert [s.split()[0] for s in steps] == ["python3", "export", "printf", "kit", "kit", "kit", "kit", "kit"], steps
    assert [s.split()[1] for s in steps[3:]] == ["prepare", "up", "doctor", "run", "down"], steps
    assert steps[2] == "printf '%s\\n' gpu-1 gpu-2 gpu-3 > hosts.txt"


@pytest.fixture(scope="module")
def clone(tmp_path_factory, lab):
    """A copy of this repository (the files git knows, as a clone has them) with kit installed from it as the
    quickstart's first step says, and the lab user's SSH config naming the lab's hosts gpu-1, gpu-2, gpu-3 (each
    host's key is in the user's known_hosts by its address)."""
    folder = tmp_path_factory.mktemp("quickstart") / "kit"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (REPO / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, folder / name)
    config = lab.home / ".ssh" / "config"
    config.write_text("".join(f"Host {name}\n    HostName {h.address}\n" for name, h in zip(NAMES, lab.hosts)))
    r = play(quickstart()[0], folder, lab)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (lab.home / "kit-venv" / "bin" / "kit").exists()
    yield folder
    config.unlink()
    shutil.rmtree(lab.home / "kit-venv", ignore_errors=True)


def play(step: str, clone: Path, lab, timeout: int = 1200) -> subprocess.CompletedProcess:
    """One step of the quickstart in bash, as the lab's user in the clone, with the venv's kit first on PATH."""
    env = {**os.environ, **lab.ansible_env, "COLUMNS": "200", "PATH": f"{lab.home}/kit-venv/bin:{os.environ['PATH']}",
           # Ansible's OpenSSH reads the login's own ~/.ssh/config, not the lab user's: name it
           "ANSIBLE_SSH_ARGS": lab.ansible_env["ANSIBLE_SSH_ARGS"] + f" -F {lab.home}/.ssh/config",
           # the pip cache of the machine's own user (the suite's install filled it): the lab user's home is new
           "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))}
    return subprocess.run(["bash", "-c", step], cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_quickstart_on_three_hosts_as_readme_writes_it(project, lab, clone):
    """(Its first step, kit's install from the clone, is the clone fixture's; `export PATH` is play's.)"""
    _, _, hosts, prepare, up, doctor, run, down = quickstart()
    assert play(hosts, clone, lab).returncode == 0
    assert (clone / "hosts.txt").read_text() == "gpu-1\ngpu-2\ngpu-3\n"

    r = play(f"{prepare} --dry-run", clone, lab)  # check mode: the lab's hosts share this machine's packages
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "check mode: nothing was changed" in r.stdout

    r = play(up, clone, lab)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "flavor auto -> cpu" in r.stdout and "✓ cluster kit is up on 3 hosts" in r.stdout, r.stdout
    r = play(doctor, clone, lab)
    assert r.returncode == 0 and "✓ cluster kit is healthy" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    for name in NAMES:
        assert re.search(rf"^{name}$", r.stdout, re.M), r.stdout  # each host under the name hosts.txt gives it

    r = play(run, clone, lab)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "examples/cifar10_cnn_horovod.py --epochs 2 --samples 10000" not in r.stdout  # (the script's own path)
    assert "cifar10_cnn_horovod.py --epochs 2 --samples 10000; 3 processes on 3 hosts (gpu-1, gpu-2, gpu-3)" \
        in r.stdout, r.stdout[:2000]
    assert re.search(r"^\[gpu-1 rank 0\] epoch 2: loss [\d.]+ accuracy [\d.]+", r.stdout, re.M), r.stdout[-3000:]
    assert "✓ job" in r.stdout and "finished" in r.stdout

    r = play(down, clone, lab)
    assert r.returncode == 0 and "✓ cluster kit is down" in r.stdout, r.stdout + r.stderr
    assert not lab.leftovers("kit", strict=False)

