"""The `kit` command as a user runs it: a subprocess of the installed console script."""

import re
import subprocess
from pathlib import Path

from helpers import run_kit


def kit(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """kit with DOCKER_HOST pointing at nothing: any contact with an engine would fail."""
    return run_kit(*args, cwd=cwd, env={"DOCKER_HOST": "unix:///nonexistent/kit-test.sock"})


def test_gpu_dry_run_prints_dockerfile_and_plan_without_docker(in_tmp):
    r = kit("build", "--flavor", "gpu", "--dry-run", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    assert "FROM debian:trixie-slim AS base" in r.stdout and "nvidia/cuda" not in r.stdout
    assert '"cuda-toolkit[nvcc,cccl]"' in r.stdout and "HOROVOD_GPU_OPERATIONS=NCCL" in r.stdout
    assert "no Docker engine or package index was contacted" in r.stdout
    assert re.search(r"^  key +[0-9a-f]{24} ", r.stdout, re.M)
    assert "wheels   resolved with this machine's pip for the image's Python: index " in r.stdout


def test_tf_gpu_dry_run_renders_the_tensorflow_recipe_and_its_check(in_tmp):
    r = kit("build", "--flavor", "tf-gpu", "--dry-run", cwd=in_tmp)
    assert r.returncode == 0, r.stderr
    assert ('pip install --no-cache-dir --no-index --find-links /opt/kit/wheelhouse/tf "tensorflow[and-cuda]==2.21.0" '
            '"tf-keras==2.21.*"') in r.stdout
    assert "context  kit/tf_check.py" in r.stdout and "build_horovod.sh" not in r.stdout
    assert ("verify   a 2-worker MultiWorkerMirroredStrategy allreduce sums to 3; TensorFlow is a CUDA build"
            in r.stdout)


def test_bad_input_is_one_error_line_and_one_fix_line(in_tmp):
    r = kit("build", "--flavor", "tpu", cwd=in_tmp)
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["error: --flavor: 'tpu' is not allowed",
                                     "fix: use one of: auto (the default: gpu when every host has NVIDIA GPUs, cpu "
                                     "when none has), cpu, gpu, tf (tf-gpu or tf-cpu by the same rule), tf-cpu, tf-gpu"]
    assert r.stdout == ""


def test_bad_kit_yaml_names_file_and_line(in_tmp):
    (in_tmp / "kit.yaml").write_text("build:\n  flavor: cpu\n  wheelhouse: ./wheels\n")
    r = kit("build", "--dry-run", cwd=in_tmp)
    assert r.returncode == 2
    assert r.stderr.startswith("error: kit.yaml:3: build.wheelhouse: folder wheels does not exist")


def test_missing_config_file_is_bad_input(in_tmp):
    r = kit("build", "--config", "nope.yaml", "--dry-run", cwd=in_tmp)
    assert r.returncode == 2 and "nope.yaml: cannot read the config file" in r.stderr


def test_engine_that_does_not_answer_says_how_to_start_one(in_tmp):
    r = kit("build", cwd=in_tmp)
    assert r.returncode == 1
    assert r.stderr.startswith("error: the Docker engine does not answer")
    assert "fix: start it" in r.stderr


def test_local_cluster_size_is_checked_before_docker_is_contacted(in_tmp):
    r = kit("up", "--nodes", "0", cwd=in_tmp)
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["error: --nodes: 0 is not a number of local containers from 1 to 64",
                                     "fix: use --nodes 3, or list real hosts with --hosts hosts.txt"]
    (in_tmp / "hosts.txt").write_text("node-1\n")
    r = kit("up", "--hosts", "hosts.txt", "--nodes", "2", cwd=in_tmp)
    assert r.returncode == 2 and r.stderr.startswith("error: --nodes is for a cluster on this machine")


def test_version(in_tmp):
    r = kit("--version", cwd=in_tmp)
    assert r.returncode == 0 and r.stdout.startswith("kit ")


def test_launcher_options_are_checked_before_anything_is_contacted(in_tmp):
    (in_tmp / "train.py").write_text("print('hi')\n")
    cases = {("--launcher", "mpi"): ["error: --launcher: 'mpi' is not a launcher",
                                     "fix: use one of: horovod, torchrun, tf"],
             ("--launcher", "torchrun", "--np", "3"): [
                 "error: --np is horovodrun's; torchrun runs on every host",
                 "fix: drop --np; --nproc-per-node sets the processes of each host"],
             ("--launcher", "tf", "--fusion-threshold-mb", "32", "--timeline", "t.json"): [
                 "error: --fusion-threshold-mb, --timeline: Horovod's, and --launcher tf does not start Horovod",
                 "fix: drop --fusion-threshold-mb, --timeline, or run the job with --launcher horovod"],
             ("--cycle-time-ms", "-2"): ["error: --cycle-time-ms -2: Horovod takes 0 or more",
                                         "fix: give e.g. --cycle-time-ms 1 (its default)"],
             ("--launcher", "tf", "--nproc-per-node", "2"): [
                 "error: --nproc-per-node: 2 is not for --launcher tf",
                 "fix: use it with --launcher torchrun, from 1 to 256 (default: each host's slots)"],
             ("-e", "NCCL_DEBUG=INFO", "-e", "2FAST=1"): [
                 "error: -e 2FAST: '2FAST' is not a variable name",
                 "fix: use letters, digits and _, not starting with a digit: NAME=VALUE"],
             ("--env-file", "job.env"): [
                 "error: job.env:2: KIT_JOB is kit's to set (kit finds the job's processes by it)",
                 "fix: drop KIT_JOB from the job's environment"]}
    (in_tmp / "job.env").write_text("OMP_NUM_THREADS=2\nKIT_JOB=mine\n")
    for options, lines in cases.items():
        r = kit("run", *options, "train.py", cwd=in_tmp)
        assert (r.returncode, r.stderr.splitlines()) == (2, lines), options


def test_a_launcher_the_clusters_image_cannot_run_is_refused_before_any_host_is_contacted(in_tmp):
    """A recorded cluster of the tf-cpu image on an address nothing answers on: refusing needs no host."""
    from kit.cluster import state as st
    from kit.config.settings import ClusterConfig

    home = in_tmp / "home"
    (home / "kit").mkdir(parents=True)
    (in_tmp / "train.py").write_text("print('hi')\n")
    for flavor, launcher, has, fix in (
            ("tf-cpu", "horovod", "TensorFlow, no torch or Horovod",
             "use --launcher tf on it, or bring up a cluster of a cpu or gpu image (another --name) for this launcher"),
            ("cpu", "tf", "torch and Horovod, no TensorFlow",
             "use --launcher horovod or torchrun on it, or bring up a cluster of a tf-cpu or tf-gpu image "
             "(another --name) for this launcher")):
        host = st.HostState(name="192.0.2.1", address="192.0.2.1", place=ClusterConfig().host_place(), primary=True)
        st.save(home / "kit", st.ClusterState(cluster="kit", image=f"img:{flavor}", image_id="sha256:0",
                                                           ssh_port=12345, workspace="/ws", hosts=[host], flavor=flavor))
        r = run_kit("run", "--launcher", launcher, "train.py", cwd=in_tmp,
                    env={"KIT_HOME": str(home), "DOCKER_HOST": "unix:///nonexistent/kit-test.sock"})
        assert (r.returncode, r.stderr.splitlines()) == (2, [
            f"error: --launcher {launcher}: cluster kit runs img:{flavor}, a {flavor} image ({has})", f"fix: {fix}"])


def test_a_bug_is_one_line_not_a_traceback(capsys, monkeypatch):
    """A fault kit did not foresee reads as one line that says it is a bug, credentials hidden; KIT_DEBUG=1 shows
    the traceback."""
    import pytest
    import typer

    from kit.cli.common import reports_errors

    @reports_errors
    def broken():
        raise ValueError("unexpected at https://u:s3cret@pypi.lab/simple")
    monkeypatch.delenv("KIT_DEBUG", raising=False)
    with pytest.raises(typer.Exit) as e:
        broken()
    assert e.value.exit_code == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: kit failed unexpectedly: ValueError: unexpected at https://****@pypi.lab/simple",
                   "fix: this is a bug in kit: run the command again with KIT_DEBUG=1 for the traceback, and report it"]
    monkeypatch.setenv("KIT_DEBUG", "1")
    with pytest.raises(ValueError):
        broken()


def test_doctor_and_bench_without_a_cluster_or_with_bad_input_say_so_and_change_nothing(in_tmp):
    r = kit("doctor", "--name", "nosuch", cwd=in_tmp)
    assert r.returncode == 2 and r.stderr.splitlines()[1] == "fix: check hosts before bringing them up: kit doctor " \
                                                             "--hosts hosts.txt", r.stderr
    (in_tmp / "hosts.txt").write_text("node-1\nnode-2 slots=x\n")
    r = kit("doctor", "--hosts", "hosts.txt", cwd=in_tmp)
    assert r.returncode == 2 and r.stderr.startswith("error: hosts.txt:2"), r.stderr
    r = kit("bench", "net", "--seconds", "100", cwd=in_tmp)
    assert r.returncode == 2 and "each link is measured from 0.5 to 60 s" in r.stderr
    r = kit("bench", "net", "--name", "nosuch", cwd=in_tmp)
    assert r.returncode == 2 and "no cluster nosuch is recorded here" in r.stderr
    for argv, said in ((["--backend", "mpi"], "--backend: 'mpi' is not a backend"),
                       (["--min-size", "1G", "--max-size", "1K"], "the sizes go from the first up to the second"),
                       (["--max-size", "2G"], "from 4 bytes to 1 GiB"),
                       (["--min-size", "1T"], "--min-size: '1T' is not a size"),
                       (["--cycle-time-ms", "-1"], "--cycle-time-ms -1: Horovod takes 0 or more"),
                       (["--fusion-threshold-mb", "-5"], "--fusion-threshold-mb -5: Horovod takes 0 or more"),
                       (["--seconds", "0"], "each size is timed from 0.1 to 30 s"),
                       (["--link-gbits", "0"], "a link rate is above 0"),
                       (["--backend", "torch", "--cycle-time-ms", "5"], "Horovod's, and --backend torch"),
                       (["--name", "nosuch"], "no cluster nosuch is recorded here")):
        r = kit("bench", "allreduce", *argv, cwd=in_tmp)
        assert r.returncode == 2 and said in r.stderr and "fix: " in r.stderr, (argv, r.stderr)
    for argv, said in ((["--epochs", "0"], "--epochs 0: from 1 to 100"), (["--samples", "-1"], "samples from 0"),
                       (["--samples", "60000"], "to 50,000"),
                       (["--name", "nosuch"], "no cluster nosuch is recorded here")):
        r = kit("bench", "train", *argv, cwd=in_tmp)
        assert r.returncode == 2 and said in r.stderr and "fix: " in r.stderr, (argv, r.stderr)
