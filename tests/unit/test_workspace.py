"""Copy storage's steps, run for real with a shell standing in for the containers' (and ssh for the cluster's
SSH): the workspace is only touched from inside, streamed, with bounded memory and time."""

import os
import subprocess
import tracemalloc
from pathlib import Path

from kit.runners.local import LocalRunner
from kit.cluster.steps import workspace


def test_a_big_file_is_hashed_in_blocks_not_read_whole(tmp_path):
    big = tmp_path / "checkpoint.pt"
    with open(big, "wb") as f:
        f.truncate(256 << 20)  # 256 MiB (sparse): read whole, it would take that much memory
    tracemalloc.start()
    found = workspace.manifest(tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert list(found) == ["checkpoint.pt"] and peak < 16 << 20, f"peak {peak >> 20} MiB"


def test_the_spread_script_packs_once_and_unpacks_on_every_target(tmp_path):
    """`ssh TARGET CMD` replaced by a shell that runs CMD in the target's folder: what the job wrote arrives whole,
    names with spaces included, and a target that fails is named."""
    source, targets = tmp_path / "h1", [tmp_path / "h2", tmp_path / "h3"]
    (source / "ckpt dir").mkdir(parents=True)
    (source / "ckpt dir" / "model 1.pt").write_bytes(os.urandom(1 << 20))
    (source / "log.txt").write_text("epoch 1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # ssh TARGET CMD: CMD runs with the workspace path replaced by the target's folder; target "broken" fails.
    (bin_dir / "ssh").write_text(f'#!/bin/sh\n[ "$1" = broken ] && exit 7\nt=$1; shift\n'
                                 f'exec sh -c "$(echo "$*" | sed "s#{source}#{tmp_path}/$t#g")"\n')
    (bin_dir / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    script = workspace.spread_script(str(source), ["ckpt dir/model 1.pt", "log.txt"], ["h2", "h3"])
    r = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for t in targets:
        assert (t / "ckpt dir" / "model 1.pt").read_bytes() == (source / "ckpt dir" / "model 1.pt").read_bytes()
        assert (t / "log.txt").read_text() == "epoch 1\n"
    bad = subprocess.run(["sh", "-c", workspace.spread_script(str(source), ["log.txt"], ["broken", "h2"])], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "kit: copying to broken failed" in bad.stderr


def test_every_workspace_command_runs_inside_the_container():
    assert workspace.remote_manifest_command("kit-lab", "/ws").startswith("docker exec kit-lab sh -c ")


def test_a_stream_whose_far_end_hangs_ends_within_its_bound(tmp_path):
    r = LocalRunner("here").stream_in("cat >/dev/null; sleep 30", iter([b"x" * 10]), lambda n: None, timeout=1)
    assert r.exit_code == 124 and "still running 1 s after its input" in r.stderr


def test_the_jobs_files_go_as_a_file_on_disk(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print(1)\n")
    path = workspace.tarball(tmp_path / "src", ["train.py"], tmp_path / "job.tar.gz")
    listed = subprocess.run(["tar", "-tzf", str(path)], capture_output=True, text=True).stdout.split()
    assert isinstance(path, Path) and listed == ["train.py"]
