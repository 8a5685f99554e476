"""`kit run -e/--env-file`: the variables a job's ranks get, what is refused, what is shown, and how each rank
reads them (the rank launcher, run here with the file kit writes into every container)."""

import json
import os
import subprocess
import sys

import pytest

from kit.jobs import env as jobenv
from kit.jobs.commands.horovod import Slot, rank_launcher
from kit.errors import BadInput
from kit.backends.cluster.run import Job
from kit.cluster.place import Place
from kit.cluster.state import ClusterState, HostState


def parse(flags=(), files=(), environ=None):
    return dict(jobenv.parse(list(flags), list(files), environ or {}))


def test_flags_give_values_or_take_this_shells():
    assert parse(["NCCL_DEBUG=INFO", "EMPTY=", "WITH_EQ=a=b", "HOME_DIR"], environ={"HOME_DIR": "/home/u"}) == \
           {"NCCL_DEBUG": "INFO", "EMPTY": "", "WITH_EQ": "a=b", "HOME_DIR": "/home/u"}


def test_files_are_read_in_order_and_flags_win(tmp_path):
    one, two = tmp_path / "one.env", tmp_path / "two.env"
    one.write_text("# comment\n\nOMP_NUM_THREADS=4\nA=from one\n  B=  spaced value \r\nC=x\u2028y\x0cz\n")
    two.write_text("A=from two\nTOKEN\n")
    assert parse(["OMP_NUM_THREADS=2"], [one, two], environ={"TOKEN": "t0k"}) == \
           {"OMP_NUM_THREADS": "2", "A": "from two", "B": "  spaced value ", "C": "x\u2028y\x0cz", "TOKEN": "t0k"}


@pytest.mark.parametrize("line, message", [
    ("1ABC=x", "'1ABC' is not a variable name"),
    ("A-B=x", "'A-B' is not a variable name"),
    ("=x", "'' is not a variable name"),
    ("KIT_JOB=x", "KIT_JOB is kit's to set"),
    ("PATH=/bin", "PATH is kit's to set"),
    ("TF_CONFIG={}", "TF_CONFIG is kit's to set"),
    ("HOROVOD_RANK=0", "HOROVOD_RANK is kit's to set (the launcher sets it for each rank)"),
    ("HOROVOD_GLOO_RENDEZVOUS_ADDR=x", "HOROVOD_GLOO_RENDEZVOUS_ADDR is kit's to set"),
    ("LOCAL_WORLD_SIZE=1", "LOCAL_WORLD_SIZE is kit's to set"),
    ("GLOO_SOCKET_IFNAME=eth1", "GLOO_SOCKET_IFNAME is kit's to set"),
    ("HOROVOD_SECRET_KEY=x", "HOROVOD_SECRET_KEY is kit's to set"),
    ("PYTHONPATH=/src", "PYTHONPATH acts when a rank's interpreter starts"),
    ("LD_PRELOAD=x.so", "LD_PRELOAD acts when a rank's interpreter starts"),
    ("UNSET_HERE", "UNSET_HERE has no value here"),
])
def test_a_bad_line_of_a_file_is_named_with_its_line(tmp_path, line, message):
    f = tmp_path / "job.env"
    f.write_text(f"GOOD=1\n{line}\n")
    with pytest.raises(BadInput) as e:
        parse(files=[f])
    assert str(e.value).startswith(f"{f}:2: {message}"), str(e.value)
    with pytest.raises(BadInput) as e:
        parse([line])
    assert str(e.value).startswith(f"-e {line.partition('=')[0]}: {message}"), str(e.value)


def test_an_unreadable_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match=r"missing\.env: cannot read the environment file"):
        parse(files=[tmp_path / "missing.env"])


def test_names_the_launchers_do_not_set_are_the_users(tmp_path):
    assert parse(["CUDA_VISIBLE_DEVICES=0,1", "NCCL_DEBUG=INFO", "HOROVOD_FUSION_THRESHOLD=67108864",
                  "TORCH_DISTRIBUTED_DEBUG=DETAIL"]) == {
        "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "HOROVOD_FUSION_THRESHOLD": "67108864",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}


def test_values_are_shown_for_allow_listed_names_only():
    env = (("NCCL_DEBUG", "INFO"), ("WANDB_API_KEY", "k"), ("HF_TOKEN", "t"), ("AWS_SECRET_ACCESS_KEY", "s"),
           ("DB_PASSWORD", "p"), ("MY_PASS", "p"), ("OMP_NUM_THREADS", "2"), ("PASSAGE", "x"),
           ("SENTRY_DSN", "d"), ("GITHUB_PAT", "g"), ("CREDS", "c"), ("DATABASE_URL", "postgres://u:pw@db/x"),
           ("MIRROR_URL", "https://mirror/x"), ("NCCL_SOCKET_IFNAME", "^lo,docker0"), ("CUDA_VISIBLE_DEVICES", ""))
    assert jobenv.shown(env) == ("NCCL_DEBUG=INFO, WANDB_API_KEY=(hidden), HF_TOKEN=(hidden), "
                                 "AWS_SECRET_ACCESS_KEY=(hidden), DB_PASSWORD=(hidden), MY_PASS=(hidden), "
                                 "OMP_NUM_THREADS=2, PASSAGE=(hidden), SENTRY_DSN=(hidden), GITHUB_PAT=(hidden), "
                                 "CREDS=(hidden), DATABASE_URL=(hidden), MIRROR_URL=(hidden), "
                                 "NCCL_SOCKET_IFNAME=^lo,docker0, CUDA_VISIBLE_DEVICES=")


def test_every_rank_reads_the_jobs_variables_exactly_before_its_script_runs(tmp_path):
    """The rank launcher (as every launcher starts each rank) with the file kit writes into a container."""
    env = (("PLAIN", "x"), ("SPACES", " a  b "), ("QUOTES", "it's \"q\" $HOME `id`"), ("LINES", "1\n2"),
           ("EMPTY", ""), ("OMP_NUM_THREADS", "2"))
    (tmp_path / "j1").write_bytes(jobenv.env_file(env))
    (tmp_path / "t.py").write_text("import json, os, sys\nprint(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]}))\n")
    names = [k for k, _ in env]
    def rank(job_id: str, **env_vars) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-u", "-c", rank_launcher(str(tmp_path)), str(tmp_path / "t.py"),
                               *names], capture_output=True, text=True, timeout=30,
                              env={"PATH": os.environ["PATH"], "KIT_JOB": job_id, "OMP_NUM_THREADS": "1", **env_vars})
    r = rank("j1", KIT_ENV="1")
    assert json.loads(r.stdout.splitlines()[0]) == dict(env), r.stderr
    r = rank("j1")  # a job without variables: no file is read
    assert json.loads(r.stdout.splitlines()[0]) == {**dict.fromkeys(names), "OMP_NUM_THREADS": "1"}, r.stderr
    r = rank("j2", KIT_ENV="1")  # a job with variables whose file is not there: the rank stops, saying why
    assert r.returncode == 1 and "kit: this rank cannot read the job's variables" in r.stderr
    assert "@@kit-exit 1 " in r.stdout


def job(env, fanout=()):
    state = ClusterState("lab", "img:1", "sha256:abc", 12345, "/w",
                         hosts=[HostState("a", "10.0.0.1", Place("kit-lab", "/var/lib/kit/lab"), primary=True)])
    return Job("j1", state, 1, (Slot("a", "10.0.0.1", 1),), (), ("python", "-u", "t.py"), env=env, fanout=fanout)


def test_values_go_on_no_command_line_only_into_each_containers_file():
    j = job((("NCCL_DEBUG", "INFO"), ("WANDB_API_KEY", "s3cr3t-value")))
    launch, supervisor = j.start_command(), j.supervisor_command()
    assert not {"s3cr3t-value", "INFO"} & set(f"{launch} {supervisor}".replace("=", " ").split())
    assert " -e KIT_ENV=1 " in supervisor  # each rank reads them from the file the starter writes on every host
    request = json.loads(j.request(None))
    assert json.loads(request["env_file"]) == {"NCCL_DEBUG": "INFO", "WANDB_API_KEY": "s3cr3t-value"}
    assert request["files"]["environment"] == "NCCL_DEBUG, WANDB_API_KEY"  # the record: names only
    assert "s3cr3t-value" not in request["files"]["plan.json"] + request["files"]["environment"]
    assert " -e KIT_ENV=1 " not in job(()).supervisor_command() and not job(()).plan().env
    assert j.plan().env and "s3cr3t-value" not in j.plan().dump()


def test_the_supervisor_removes_the_variables_from_every_container_and_names_where_it_could_not(tmp_path, ssh_shim):
    """supervisor.tidy_env, run here: `ssh` runs the command here for 10.0.0.2 and fails for 10.0.0.3 (down); the
    primary's own copy is removed directly, the others' over the cluster SSH."""
    from kit.backends.cluster.supervisor.launch import Plan
    from kit.backends.cluster.supervisor.supervise import tidy_env
    (ssh_shim / "down").write_text("10.0.0.3\n")
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    for name in ("j1", "other"):
        (env_dir / name).write_text("{}")
    plan = Plan("j1", str(tmp_path), str(tmp_path), "horovod", [Slot("a", "10.0.0.1", 1), Slot("b", "10.0.0.2", 1),
                Slot("c", "10.0.0.3", 1)], 3, None, 12345, [], [], [], env=True)
    assert tidy_env(plan, str(env_dir)) == "10.0.0.3"
    assert not (env_dir / "j1").exists() and (env_dir / "other").exists()
    calls = sorted((ssh_shim / "calls").read_text().splitlines())
    assert calls == [f"10.0.0.2 rm -f {env_dir}/j1", f"10.0.0.3 rm -f {env_dir}/j1"]
