"""kit's Python helpers run with the workspace as their folder (the job's files): a json.py, signal.py or socket.py
there must not stand in for the standard library's in kit's own code. Each helper is run here with the real
Python, in a folder that holds such files, each raising on import."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kit.bench import net as netbench
from kit.backends.slurm import sbatch
from kit.backends.slurm import task as slurmtask
from kit.image import verify
from kit.config.settings import SlurmConfig
from kit.network import shipped as network_script
from kit.jobs.commands.horovod import EXIT_MARK, rank_command, rank_launcher
from kit.cluster.steps.check import FRAMEWORK_CHECK
from kit.cluster.steps.distribute import RELAY_COMMAND

PLANTED = ("json", "signal", "socket", "threading", "struct", "ipaddress", "fcntl", "select", "pkgutil", "platform",
           "hashlib", "hmac", "tarfile", "subprocess", "torch", "horovod", "tensorflow")
MARK = "a workspace module imported by kit's helper"


@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Path:
    """The job's folder: modules named as the standard library's (and the frameworks'), each raising on import;
    `python` and `python3` on PATH are the test's Python, as `python` is the image's in a container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        (bin_dir / name).symlink_to(PYTHON)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    folder = tmp_path / "work"
    folder.mkdir()
    for name in PLANTED:
        (folder / f"{name}.py").write_text(f"raise RuntimeError({MARK + ': ' + name!r})\n")
    return folder


def _env(**more: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "KIT_"))}, **more}


# The Python under this venv: the venv's own start-up (kit installed editable: a .pth that imports pathlib) would
# import from a PYTHONPATH that holds the workspace before any helper runs, as no image's Python does.
PYTHON = getattr(sys, "_base_executable", sys.executable)


def _real(argv: list[str]) -> list[str]:
    return [PYTHON, *argv[1:]] if argv[0] in ("python", "python3") else argv


def _run(argv: list[str], cwd: Path, stdin: str = "", **more: str) -> subprocess.CompletedProcess:
    return subprocess.run(_real(argv), cwd=cwd, env=_env(**more), capture_output=True, text=True, timeout=60,
                          input=stdin)


def test_kits_helpers_ignore_modules_in_the_workspace(workspace, tmp_path):
    """netbench's helper, the rank launcher (with the user's script), kit_task.py of the sbatch script, the image
    checks of verify and `kit up`, and the image relay: each gets past its imports as in a clean folder."""
    _netbench(workspace)
    _rank_launcher(workspace, tmp_path)
    _slurm_task(workspace)
    for argv in (verify.versions_argv("horovod"), verify.versions_argv("tensorflow"),
                 ["bash", "-c", FRAMEWORK_CHECK["tensorflow"]]):
        r = _run(argv, workspace)  # no framework here: it fails, at the framework, not at a workspace module
        assert r.returncode != 0 and MARK not in r.stderr and "ModuleNotFoundError" in r.stderr, r.stderr
    clean = tmp_path / "clean"
    clean.mkdir()
    relay = [_run(["bash", "-c", RELAY_COMMAND], folder) for folder in (workspace, clean)]
    assert MARK not in relay[0].stderr and (relay[0].returncode, relay[0].stdout) == (relay[1].returncode,
                                                                                       relay[1].stdout)


def _netbench(workspace: Path) -> None:
    lines: list[str] = []
    receiver = subprocess.Popen(_real(netbench.helper_argv("recv", "127.0.0.1", "0", "0.3")), cwd=workspace,
                                env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    receiver.stdin.write("t\n")
    receiver.stdin.close()
    reading = threading.Thread(target=lambda: lines.extend(receiver.stdout), daemon=True)
    reading.start()
    try:
        for _ in range(100):
            if lines or receiver.poll() is not None:
                break
            reading.join(0.1)
        assert lines, receiver.stderr.read()
        port = json.loads(lines[0])["port"]
        sent = _run(netbench.helper_argv("send", "127.0.0.1", str(port), "0.3"), workspace, stdin="t\n")
        assert sent.returncode == 0, sent.stderr
        assert receiver.wait(30) == 0
        reading.join(5)
        assert json.loads(lines[-1])["bytes"] > 0
    finally:
        receiver.kill()
        receiver.wait()


def _rank_launcher(workspace: Path, tmp_path: Path) -> None:
    """The user's script is run as `python script.py` would run it: its folder first on sys.path, the workspace the
    current folder and on sys.path as it was, PYTHONPATH honoured; only the launcher's own imports are immune."""
    code = workspace / "code"
    extra = tmp_path / "extra"
    code.mkdir()
    extra.mkdir()
    (code / "mine.py").write_text("WHO = 'beside the script'\n")
    (extra / "theirs.py").write_text("WHO = 'on PYTHONPATH'\n")
    (code / "train.py").write_text(
        "import os, sys, mine, theirs\n"
        "print('paths', sys.path[0] == os.path.dirname(os.path.abspath(__file__)), '' in sys.path,\n"
        "      os.getcwd() == os.environ['HERE'], mine.WHO, theirs.WHO, sys.argv[1:], flush=True)\n")
    progress = tmp_path / "progress"
    r = _run(rank_command("code/train.py", ["--epochs", "2"]), workspace, PYTHONPATH=f"{extra}:{workspace}",
             HERE=str(workspace), KIT_JOB="job-1", HOROVOD_RANK="0", KIT_PROGRESS_DIR=str(progress))
    assert r.returncode == 0 and MARK not in r.stderr, r.stderr
    assert r.stdout.splitlines()[0] == "paths True True True beside the script on PYTHONPATH ['--epochs', '2']"
    assert re.fullmatch(rf"{EXIT_MARK} 0 [\d.]+", r.stdout.splitlines()[-1])


def _slurm_task(workspace: Path) -> None:
    """kit_task.py as the sbatch script starts it (its tf mode, which then starts the rank launcher), with the job's
    PYTHONPATH holding the job's folder."""
    kit_dir = workspace / ".kit"
    kit_dir.mkdir()
    (kit_dir / "kit_task.py").write_text(Path(slurmtask.__file__).read_text())
    (kit_dir / "kit_net.py").write_text(network_script.script())
    (kit_dir / "net-key-1").write_text("0123456789abcdef0123456789abcdef")
    (kit_dir / "kit_rank.py").write_text(rank_launcher(env_dir=str(workspace / "env")))
    (workspace / "train.py").write_text("import os\nprint('worker', os.environ['TF_CONFIG'], flush=True)\n")
    script = sbatch.render(sbatch.SbatchJob("job-1", "train.py", (), "tf", sbatch.shape("tf", 1, None, None, None),
                                            SlurmConfig(python_path="/shared/envs/kit/bin/python")))
    start = re.search(r'srun [^\n]*?(\S+ -u[^\n]*?) "\$KIT_LIB/kit_task\.py" tf ', script)
    argv = ["python", *start[1].split()[1:], ".kit/kit_task.py", "tf", "train.py"]
    r = _run(argv, workspace, PYTHONPATH=".", KIT_NODES="n1=127.0.0.1", KIT_PORT="24242", KIT_SUBNET="127.0.0.0/8",
             KIT_NET_KEY=".kit/net-key-1",
             SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_NODEID="0", SLURM_JOB_ID="1")
    assert r.returncode == 0 and MARK not in r.stderr, r.stderr
    assert r.stdout.startswith('worker {"cluster":{"worker":["127.0.0.1:24242"]}'), r.stdout
