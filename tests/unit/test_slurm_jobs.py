"""kit under Slurm, the pure parts: the sbatch scripts (against reviewed golden files, and shellcheck), the shape of a
job, what each task derives from Slurm's variables (kit.backends.slurm.task), the job's folder as sent, and Slurm's output
(captured from Debian 12's Slurm 22.05) read back. tests/lab/test_slurm.py runs all of it on a real Slurm."""

import io
import json
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kit.backends.slurm import sbatch
from kit.backends.slurm import folder as slurmfolder
from kit.backends.slurm import jobs as slurmjobs
from kit.backends.slurm import output as slurmoutput
from kit.backends.slurm import task as slurmtask
from kit.config.settings import SlurmConfig
from kit.errors import BadInput, KitError

DATA = Path(__file__).parent / "data" / "slurm"
JOB_ID = "20261126-063000-ab12"
RUNTIMES = {"none": SlurmConfig(python_path="/shared/envs/kit/bin/python"),
            "pyxis": SlurmConfig(runtime="pyxis", container_image="/shared/images/kit-horovod-cpu.sqsh",
                                 partition="gpu", account="lab", time="2:00:00"),
            "apptainer": SlurmConfig(runtime="apptainer", container_image="/shared/images/kit.sif",
                                     subnet="10.1.0.0/16")}
SHAPES = {"horovod": (2, 4, None, 2), "torchrun": (2, None, 4, 4), "tf": (3, None, None, None)}


def golden_job(launcher: str, runtime: str) -> sbatch.SbatchJob:
    nodes, np, per_node, gpus = SHAPES[launcher]
    return sbatch.SbatchJob(JOB_ID, "train.py", ("--epochs", "2", "--name", "it's mine"), launcher,
                            sbatch.shape(launcher, nodes, np, per_node, gpus), RUNTIMES[runtime],
                            variables=launcher == "horovod", submitted=runtime == "none")


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("launcher", SHAPES)
def test_each_sbatch_script_is_the_reviewed_one(launcher, runtime):
    """KIT_UPDATE_GOLDEN=1 writes them again: then read the diff as a reviewer would."""
    text = sbatch.render(golden_job(launcher, runtime))
    golden = DATA / f"{launcher}-{runtime}.sbatch"
    if os.environ.get("KIT_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck is not installed (tests/run installs it)")
@pytest.mark.parametrize("golden", sorted(DATA.glob("*.sbatch")), ids=lambda p: p.name)
def test_each_sbatch_script_passes_shellcheck(golden):
    r = subprocess.run(["shellcheck", "--shell=bash", "--severity=info", str(golden)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_the_pyxis_script_runs_every_task_in_the_enroot_image():
    text = (DATA / "horovod-pyxis.sbatch").read_text()
    srun = [line for line in text.splitlines() if line.startswith("srun ")]  # the ranks (rank 0 serves the rendezvous)
    assert len(srun) == 1 and all("--container-image=/shared/images/kit-horovod-cpu.sqsh" in line and
                                  '--container-mounts="$PWD:$PWD"' in line and "/opt/venv/bin/python" in line
                                  for line in srun)
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --time=2:00:00",
                 "#SBATCH --gpus-per-node=2", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2"):
        assert line in text.splitlines()


def test_the_script_runs_kits_task_from_the_files_beside_it_and_the_arguments_quoted():
    """kit's files are beside the script, not in it (a 1400-line script was none to read): in a folder named by what
    they hold, each file's sum in the script."""
    text = sbatch.render(golden_job("tf", "none"))
    assert "srun --kill-on-bad-exit=1 --label --distribution=block /shared/envs/kit/bin/python -u \"$KIT_LIB/kit_task.py\" " \
           "tf train.py --epochs 2 --name 'it'\"'\"'s mine'" in text
    files = sbatch.helper_files()
    (folder,) = {path.rsplit("/", 1)[0] for path in files}
    assert files[f"{folder}/kit_task.py"] == Path(slurmtask.__file__).read_bytes()
    assert f"KIT_LIB={folder}\n" in text and len(text.splitlines()) < 80
    for path, data in files.items():
        assert f"{hashlib.sha256(data).hexdigest()}  {path}\n" in text


def test_an_exported_script_checks_kits_files_before_any_task_starts(tmp_path):
    """kit export writes kit's files beside the script (where it runs); the script stops, exit 2 with the fix, where
    they are missing (submitted from another folder) or changed, and goes on where they are as written."""
    from helpers import run_kit
    r = run_kit("export", "--to", "slurm", "-o", "job.sbatch", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (folder,) = {path.rsplit("/", 1)[0] for path in sbatch.helper_files()}
    assert f"kit's files for its tasks in {folder}, here: the script reads them, so submit it from this folder" \
        in r.stderr
    text = (tmp_path / "job.sbatch").read_text()
    check = text[text.index("KIT_LIB="):text.index("# The job's own files")]
    bash = lambda cwd: subprocess.run(["bash", "-euc", check], cwd=cwd, capture_output=True, text=True)
    assert bash(tmp_path).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    missing = bash(elsewhere)
    assert missing.returncode == 2 and missing.stderr.splitlines()[-1] == (
        f"kit: {folder} here is not as kit wrote it: submit this script from the folder where kit export --to slurm "
        "wrote it, or run kit export there again")
    task = tmp_path / folder / "kit_task.py"
    task.write_text(task.read_text() + "import os; os.system('true')\n")
    assert bash(tmp_path).returncode == 2
    again = run_kit("export", "--to", "slurm", "-o", "job.sbatch", "train.py", cwd=tmp_path)  # writes it again
    assert again.returncode == 0 and bash(tmp_path).returncode == 0
    assert oct(task.stat().st_mode & 0o777) == "0o644"


def test_a_job_with_variables_names_only_their_file_and_removes_it():
    job = golden_job("horovod", "none")
    text = sbatch.render(job)
    assert "trap 'rm -rf \"${ends[@]}\"' EXIT" in text
    # Each start has its file (kit run --restarts submits the script again with the start as its argument): the batch
    # script of the last start, ending as the next one begins, removes only its own.
    lines = text[text.index("start=${1:-0}"):text.index("trap 'rm -rf \"${ends[@]}\"' EXIT")]
    for args, name in (([], JOB_ID), (["2"], f"{JOB_ID}.2")):
        shown = subprocess.run(["bash", "-euc", f'ends=()\n{lines}\necho "$KIT_ENV ${{ends[*]}}"', "job", *args],
                               capture_output=True, text=True)
        assert shown.stdout == f"{name} .kit/env/{name}\n", shown.stderr
        assert name == slurmfolder.variables_name(JOB_ID, int(args[0]) if args else 0)
    assert "KIT_ENV" not in sbatch.render(golden_job("tf", "none"))


@pytest.mark.parametrize("sinfo, tasks, gpus, share", [
    ("2 (null)\n2 (null)\n", 1, None, 2),
    ("64 gpu:8\n64 gpu:8\n", 2, 2, 8),                   # 2 of 8 GPUs: a quarter of 64 CPUs, for 2 tasks
    ("64 gpu:a100:8(S:0-1)\n48 gpu:a100:8(S:0-1)\n", 1, 4, 24),  # the fewest any node gives
    ("128 gpu:a100:4,gpu:v100:4\n", 8, 8, 16),
    ("4 (null)\n", 8, None, 1),                           # never none
    ("", 1, None, None), ("sinfo: error: no partition\n", 1, None, None)])
def test_a_tasks_cpus_are_its_share_of_the_nodes_from_slurms_node_facts(sinfo, tasks, gpus, share):
    assert slurmjobs.parse_share(sinfo, tasks, gpus) == share


def test_cpus_and_memory_reach_the_script_and_every_step():
    """--cpus-per-task goes to sbatch and to each srun (which, since Slurm 22.05, does not take sbatch's); --mem or
    --mem-per-gpu to sbatch; what sbatch would not read is bad input."""
    job = golden_job("horovod", "none")
    job = dataclasses.replace(job, slurm=job.slurm.model_copy(update={"cpus_per_task": 8, "mem": "64G"}))
    text = sbatch.render(job)
    assert "#SBATCH --cpus-per-task=8\n#SBATCH --mem=64G\n" in text
    assert "srun --kill-on-bad-exit=1 --label --distribution=block --cpus-per-task=8 " in text
    assert "--cpus-per-task" not in sbatch.render(golden_job("horovod", "none"))
    for bad, says in ((dict(mem="64GB"), "not a memory size"), (dict(cpus_per_task=0), "not from 1 to 4096"),
                      (dict(mem="8G", mem_per_gpu="2G"), "give one")):
        with pytest.raises(ValueError, match=says):
            SlurmConfig(**bad)


def test_jobs_submitted_from_one_folder_share_none_of_kits_files(tmp_path):
    """Each job keeps its own files (the survey's key, the ranks' progress) in .kit/job-ID and removes that folder at
    its end: a second job from the same folder loses none of its own when the first ends. kit's files for the tasks
    are beside the script, in a folder named by what they hold, which no job writes or removes (before, each job
    wrote them into .kit/, over the files another job's tasks were reading)."""
    text = sbatch.render(golden_job("horovod", "none"))
    block = text[text.index("KIT_DIR=.kit/job-"):text.index("# The job's nodes")]
    assert "cat >" not in text and "KIT_LIB" not in block
    bash = lambda job, keep: subprocess.run(["bash", "-euc", block + "touch \"$KIT_DIR/net-key\"\n" +
                                             ("trap - EXIT\n" if keep else "")],
                                            cwd=tmp_path, env={"SLURM_JOB_ID": job, "PATH": os.environ["PATH"]})
    assert bash("2", keep=True).returncode == 0  # (job 2 still runs)
    assert bash("1", keep=False).returncode == 0  # job 1 ends
    assert sorted(os.listdir(tmp_path / ".kit")) == ["job-2"]
    assert os.listdir(tmp_path / ".kit/job-2") == ["net-key"]


def test_a_work_folder_others_may_change_is_refused_before_anything_is_made(tmp_path):
    """slurm.workdir, or a folder above it, of another user, or writable by others without the sticky bit: its owner
    (or anyone) could swap kit's job folder for a link, or train.py while the job waits. Checked by the login host's
    own shell (here: this machine's, as root may make folders of another uid)."""
    from kit.runners.local import LocalRunner
    runner = LocalRunner("localhost")
    shared = tmp_path / "shared"
    shared.mkdir()
    for mode, owner, refused in ((0o755, 0, None), (0o1777, 0, None), (0o777, 0, "mode 777"),
                                 (0o775, 0, "mode 775"), (0o755, 4242, "owned by uid 4242")):
        os.chown(shared, owner, owner)
        shared.chmod(mode)
        workdir = shared / "team" / "kit-jobs"  # not there yet: made below a safe folder only
        if refused:
            with pytest.raises(KitError, match=f"slurm.workdir {workdir}: {shared} is {refused}"):
                slurmfolder.job_folder(runner, str(workdir), JOB_ID)
            assert not (shared / "team").exists()
        else:
            made = slurmfolder.job_folder(runner, str(workdir), JOB_ID)
            assert made == str(workdir / JOB_ID) and (workdir / JOB_ID).stat().st_mode & 0o777 == 0o700
            shutil.rmtree(shared / "team")
    os.chown(shared, 0, 0)
    shared.chmod(0o755)
    (shared / "elsewhere").mkdir()
    os.chown(shared / "elsewhere", 4242, 4242)
    (shared / "link").symlink_to(shared / "elsewhere")  # a link is judged by where it leads
    with pytest.raises(KitError, match="owned by uid 4242"):
        slurmfolder.job_folder(runner, str(shared / "link" / "jobs"), JOB_ID)
    # A link that leads somewhere safe, in a folder others may write: the job's folder is made where it was checked,
    # so flipping the link after the check leads kit nowhere else.
    (shared / "open").mkdir(mode=0o777)
    (shared / "open").chmod(0o777)
    (shared / "mine").mkdir()
    (shared / "open" / "proj").symlink_to(shared / "mine")
    made = slurmfolder.job_folder(runner, str(shared / "open" / "proj" / "jobs"), JOB_ID)
    assert made == str(shared / "mine" / "jobs" / JOB_ID)


def test_the_jobs_env_files_are_not_staged_beside_it(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "secrets.txt").write_text("TOKEN=s3cr3t-value\n")
    (tmp_path / ".env").write_text("OTHER=s3cr3t-other\n")
    archive = b"".join(slurmfolder.stage_archive(tmp_path, {}, (tmp_path / "secrets.txt",)))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert tar.getnames() == ["train.py"]
    assert b"s3cr3t" not in archive


def test_the_job_folder_as_sent_holds_the_variables_only_in_a_0600_file(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / ".kitignore").write_text("data/\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"0" * 100)
    script = sbatch.render(golden_job("horovod", "none"))
    extra = {sbatch.SCRIPT_NAME: (script.encode(), 0o644),
             f"{sbatch.ENV_DIR}/{JOB_ID}": (json.dumps({"TOKEN": "s3cr3t-value"}).encode(), 0o600)}
    with tarfile.open(fileobj=io.BytesIO(b"".join(slurmfolder.stage_archive(tmp_path, extra)))) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"train.py", ".kitignore", sbatch.SCRIPT_NAME, f".kit/env/{JOB_ID}"}
        assert members[f".kit/env/{JOB_ID}"].mode == 0o600
        assert b"s3cr3t-value" not in tar.extractfile(sbatch.SCRIPT_NAME).read()
    for golden in DATA.glob("*.sbatch"):
        assert "s3cr3t" not in golden.read_text()


# ---------------------------------------------------------------- the shape of a job

def test_shapes_of_each_launcher():
    assert sbatch.shape("horovod", 3, 6, None, None) == sbatch.Shape(3, 2, 1, None)
    assert sbatch.shape("horovod", None, None, None, 4) == sbatch.Shape(1, 4, 1, 4)
    assert sbatch.shape("torchrun", 2, None, 4, None) == sbatch.Shape(2, 1, 4, None)
    assert sbatch.shape("torchrun", 2, None, None, 8).ranks == 16
    assert sbatch.shape("tf", 3, None, None, None).ranks == 3


@pytest.mark.parametrize("args, says", [
    (("horovod", 3, 4, None, None), "--np 4 does not split evenly over --nodes 3"),
    (("torchrun", 2, 4, None, None), "--np is Horovod's"),
    (("horovod", 0, None, None, None), "--nodes: 0 is not from 1 to 1024"),
    (("horovod", 2, 4, 2, None), "--np and --ntasks-per-node both"),
    (("tf", 2, None, None, 65), "--gpus-per-node: 65 is not from 1 to 64"),
])
def test_bad_shapes_are_refused(args, says):
    with pytest.raises(BadInput, match=says):
        sbatch.shape(*args)


@pytest.mark.parametrize("settings, says", [
    (dict(runtime="pyxis"), "runtime pyxis needs container_image"),
    (dict(login="alice@host;rm"), "is not host or user@host"),
    (dict(login="host\n"), "is not host or user@host"),  # ($ of a pattern takes a last line break)
    (dict(partition="gpu\n"), "is not a Slurm name"),
    (dict(time="30\n"), "is not a time limit"),
    (dict(partition="gpu part"), "is not a Slurm name"),
    (dict(time="2h"), "is not a time limit"),
    (dict(workdir="../elsewhere"), "is not a path"),
    (dict(python_path="$(id)"), "is not a path"),
    (dict(subnet="10.1.0.0/99"), "is not an IPv4 network"),
    (dict(subnet="fd00::/64"), "is not an IPv4 network"),  # the ranks talk IPv4
])
def test_bad_slurm_settings_are_refused(settings, says):
    with pytest.raises(ValueError, match=says):
        SlurmConfig(**settings)


def test_a_job_for_slurm_without_a_slurm_section_says_slurm_is_not_configured_and_how(tmp_path):
    """Without kit.yaml's slurm section, kit run --on slurm spoke of this machine's Python (the defaults' python3);
    now it says Slurm is not configured and what the section needs, before it contacts anything."""
    from helpers import run_kit
    (tmp_path / "train.py").write_text("print('hi')\n")
    env = {"KIT_HOME": str(tmp_path / "kit"), "PATH": "/nonexistent"}  # (no sbatch nor python3 to find, either)
    r = run_kit("run", "--on", "slurm", "train.py", cwd=tmp_path, env=env)
    assert (r.returncode, r.stderr.splitlines()[0]) == (
        2, "error: Slurm is not configured: there is no kit.yaml here with a slurm: section"), r.stderr
    assert r.stderr.splitlines()[1].startswith("fix: add one to ./kit.yaml: `slurm:` with `login: USER@HOST`")
    (tmp_path / "kit.yaml").write_text("cluster:\n  name: lab\n")
    r = run_kit("run", "--on", "slurm", "train.py", cwd=tmp_path, env=env)
    assert (r.returncode, r.stderr.splitlines()[0]) == (
        2, "error: kit.yaml: Slurm is not configured: it has no slurm: section"), r.stderr


def test_a_login_host_that_cannot_be_reached_is_named_as_kit_yamls_slurm_login(tmp_path, monkeypatch):
    """slurm.login's host is kit.yaml's, not hosts.txt's: the fix says where to correct it (here an alias of the
    user's ssh config to a closed loopback port)."""
    from helpers import closed_port, run_kit
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    port = closed_port()
    (home / ".ssh/config").write_text(f"Host kit-login\n  HostName 127.0.0.1\n  Port {port}\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "kit.yaml").write_text("slurm:\n  login: alice@kit-login\n  python_path: /shared/venv/bin/python\n")
    r = run_kit("run", "--on", "slurm", "train.py", cwd=tmp_path, env={"KIT_HOME": str(tmp_path / "kit"),
                                                                      "HOME": str(home)})
    assert r.returncode == 1 and r.stderr.splitlines()[0].startswith(
        f"error: kit-login: cannot connect to SSH port {port} of 127.0.0.1 ("), r.stderr
    assert r.stderr.splitlines()[-1] == "fix: check the name or address in kit.yaml's slurm.login (and its HostName " \
                                        "and Port in your ~/.ssh/config) and that sshd runs there"


# ---------------------------------------------------------------- what each task derives

NODES = [("n1", "10.1.0.11"), ("n2", "10.1.0.12")]
ENV = {"SLURM_NTASKS": "4", "SLURM_JOB_ID": "4242", "KIT_PORT": "24242", "KIT_RENDEZVOUS_PORT": "40001",
       "KIT_NPROC_PER_NODE": "2"}


def test_nodes_and_ports_come_from_what_slurm_says(tmp_path):
    """The script's own lines, run by bash with scontrol and sinfo answering as Slurm 22.05 does for n[1-2]."""
    text = sbatch.render(golden_job("tf", "none"))
    block = text[text.index('KIT_NODES=""'):text.index("export KIT_JOB=")]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$*" = "show hostnames n[1-2]" ] && printf "n1\\nn2\\n"\n')
    (bin_dir / "sinfo").write_text('#!/bin/sh\n[ "$4" = n1 ] && echo 10.1.0.11 || echo 10.1.0.12\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    r = subprocess.run(["bash", "-c", block + 'echo "$KIT_NODES|$KIT_PORT"'], capture_output=True, text=True,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n[1-2]",
                            "SLURM_JOB_ID": "123457"})
    assert r.stdout.strip() == "n1=10.1.0.11 n2=10.1.0.12 |29040", r.stderr  # 20000 + 123457 % 798 * 16
    assert slurmtask.job_nodes("n1=10.1.0.11 n2=10.1.0.12 ") == NODES


def test_jobs_port_blocks_never_overlap_and_hold_every_tf_worker_of_a_node():
    """Each job's ports are a block of 16 of its own (ids 798 apart share one), inside the range kit's firewall
    closes and below Linux's ephemeral ports (32768 on): no program's port 0 lands in a job's block, whose rules would
    drop its peers. A Slurm TF job has at most 16 workers a node, one port each. Kubernetes pods have addresses of
    their own."""
    first = {i: sbatch.JOB_PORT_BASE + i % sbatch.JOB_PORT_BLOCKS * sbatch.JOB_PORT_BLOCK for i in range(5000)}
    taken: dict[int, int] = {}
    for job, port in first.items():
        for p in range(port, port + sbatch.JOB_PORT_BLOCK):
            assert taken.setdefault(p, job % sbatch.JOB_PORT_BLOCKS) == job % sbatch.JOB_PORT_BLOCKS
    low, high = map(int, sbatch.JOB_PORTS.split(":"))
    assert (low, high) == (min(taken), max(taken)) == (20000, 32767)
    assert sbatch.shape("tf", 2, None, 16, None).tasks_per_node == 16
    with pytest.raises(BadInput, match="17 TensorFlow workers a node"):
        sbatch.shape("tf", 2, None, 17, None)
    assert sbatch.shape("tf", 2, None, 17, None, slurm=False).tasks_per_node == 17


@pytest.mark.parametrize("visible, local, per_node, mine", [
    ("0,1,2,3", "2", 4, "2"), ("0,1,2,3", "1", 2, "2,3"), ("4,5,6,7", "0", 4, "4"), ("0,1", "3", 4, "1"),
    ("0,1,2,3", "0", 1, None), ("", "1", 4, None)])
def test_each_tf_worker_of_a_node_gets_its_own_gpus(visible, local, per_node, mine):
    """--gpus-per-node 4 with 4 TF workers a node: worker 2 of the node gets GPU 2 alone (as a TFJob's pod and the SSH
    cluster's workers), not every worker all four; with fewer GPUs than workers they share round the GPUs."""
    env = dict(ENV, SLURM_NTASKS=str(2 * per_node), SLURM_LOCALID=local, CUDA_VISIBLE_DEVICES=visible)
    assert slurmtask.worker_gpus(env, NODES).get("CUDA_VISIBLE_DEVICES") == mine


def test_horovod_ranks_get_what_horovodrun_would_give_them():
    env = dict(ENV, SLURM_PROCID="3", SLURM_NODEID="1")
    assert slurmtask.horovod_env(env, NODES) == {
        "HOROVOD_HOSTNAME": "n2", "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.1.0.11", "HOROVOD_GLOO_RENDEZVOUS_PORT": "40001"}


def test_torchrun_hosts_its_store_on_the_first_node_at_the_jobs_port():
    first = slurmtask.torchrun_argv(dict(ENV, SLURM_NODEID="0"), NODES, "10.1.0.11", ["train.py", "--x"])
    other = slurmtask.torchrun_argv(dict(ENV, SLURM_NODEID="1"), NODES, "10.1.0.12", ["train.py", "--x"])
    assert first[1:] == ["-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2", "--node-rank=0",
                         "--rdzv-backend=static", "--master-addr=10.1.0.11", "--master-port=24242",
                         "--local-addr=10.1.0.11", "--tee=3", "--no-python", sys.executable, "-u", slurmtask.RANK,
                         "train.py", "--x"]
    assert "--node-rank=1" in other and "--local-addr=10.1.0.12" in other and "--master-addr=10.1.0.11" in other
    assert not any("29500" in a or "localhost" in a or "127.0.0.1" in a for a in first + other)
    # never torch's c10d rendezvous, which unpickles what its unauthenticated store holds
    assert not any(a.startswith(("--rdzv-backend=c10d", "--rdzv-endpoint", "--rdzv-conf")) for a in first + other)


def test_tf_workers_are_every_task_at_its_nodes_address():
    config = json.loads(slurmtask.tf_config(dict(ENV, SLURM_PROCID="2"), NODES))
    assert config == {"cluster": {"worker": ["10.1.0.11:24242", "10.1.0.11:24243", "10.1.0.12:24242",
                                             "10.1.0.12:24243"]}, "task": {"type": "worker", "index": 2}}


def test_the_ranks_interface_is_picked_by_subnet():
    found = [("lo", "127.0.0.1", 8), ("docker0", "172.17.0.1", 16), ("ib0", "10.2.0.11", 16),
             ("eth0", "10.1.0.11", 24)]
    assert slurmtask.pick_interface(found, ["10.1.0.11", "10.1.0.12"]) == ("eth0", "10.1.0.11")
    assert slurmtask.pick_interface(found, ["10.1.0.11", "10.1.0.12"], "10.2.0.0/16") == ("ib0", "10.2.0.11")
    with pytest.raises(SystemExit, match=r"no interface on \S+ is whose subnet holds 10.9.0.1 .*slurm.subnet"):
        slurmtask.pick_interface(found, ["10.9.0.1"])
    assert ("lo", "127.0.0.1", 8) in slurmtask.interfaces()  # read from this machine's kernel


# ---------------------------------------------------------------- Slurm's answers, as kit reads them

def test_states_and_exit_codes_from_squeue_and_sacct():
    assert slurmjobs.parse_sacct((DATA / "sacct_c_failed.txt").read_text()) == ("failed", 3)
    assert slurmjobs.parse_sacct((DATA / "sacct_c_cancelled.txt").read_text()) == ("stopped", 0)
    assert slurmjobs.parse_sacct("Slurm accounting storage is disabled\n") is None
    assert [slurmjobs.parse_squeue(t) for t in ("PENDING\n", "RUNNING\n", "COMPLETING\n", "CANCELLED\n", "")] == [
        "pending", "running", "running", "stopped", None]


def test_a_poll_reads_only_whole_lines_and_tells_a_gone_job_from_a_silent_controller():
    poll = slurmjobs.parse_poll("RUNNING None\n@@kit-poll 0\n0: one\n1: two\n0: thr")
    assert poll == slurmjobs.Poll("running", ["0: one", "1: two"], "None")
    assert slurmjobs.parse_poll("PENDING Resources\n@@kit-poll 0\n") == slurmjobs.Poll("pending", [], "Resources")
    assert slurmjobs.parse_poll("@@kit-poll 0\n") == slurmjobs.Poll(None, [])
    gone = "slurm_load_jobs error: Invalid job id specified\n@@kit-poll 1\n"  # as squeue 22.05 says it
    assert slurmjobs.parse_poll(gone) == slurmjobs.Poll(None, [])
    busy = "squeue: error: Socket timed out on send/recv operation\n@@kit-poll 1\n0: a\n"
    assert slurmjobs.parse_poll(busy) == slurmjobs.Poll("unknown", ["0: a"], error="squeue: error: Socket timed out "
                                                                                  "on send/recv operation")


class Answers:
    """A login host that answers each command by the first key it contains (a unit test's runner)."""

    host = "login"

    def __init__(self, answers):
        self.answers, self.ran = answers, []

    def run(self, command, timeout=None, changes=False, stdin=None):
        from kit.runners.base import Result
        self.ran.append(command)
        key = next(k for k in self.answers if k in command)
        code, out = self.answers[key]
        return Result(self.host, command, code, out)


def test_a_job_slurm_no_longer_knows_is_lost_only_when_slurm_says_so():
    gone = "slurm_load_jobs error: Invalid job id specified"
    assert slurmjobs.job_state(Answers({"squeue": (1, gone), "sacct -c": (0, ""), "sacct": (1, "disabled")}),
                               "7") == ("lost", None)
    assert slurmjobs.job_state(Answers({"squeue": (1, "Socket timed out"), "sacct": (0, "")}), "7") == \
        ("unknown", None)
    # squeue still lists it ended (-t all: every state), and no record of its code is there for this user
    for state, seen in (("COMPLETED", ("succeeded", 0)), ("CANCELLED", ("stopped", None)), ("FAILED", ("failed", None))):
        slurm = Answers({"squeue": (0, f"{state}\n"), "sacct -c": (1, "Permission denied"), "sacct": (1, "disabled")})
        assert slurmjobs.job_state(slurm, "7") == seen and "-t all" in slurm.ran[0]
    assert slurmjobs.job_state(Answers({"squeue": (1, gone), "sacct": (1, "Connection refused")}), "7") == \
        ("unknown", None)


def test_kit_stop_cancels_only_the_slurm_job_that_runs_in_the_jobs_folder():
    record = slurmjobs.SlurmRecord(JOB_ID, "42", "alice@login", "/home/alice/kit-jobs/" + JOB_ID, "horovod",
                                   "train.py", 3, 0.0)
    other = Answers({"squeue": (0, "/home/bob/x\n"), "scancel": (0, "")})
    with pytest.raises(KitError, match="Slurm job 42 is no longer kit's job"):
        slurmjobs.cancel(other, record)
    assert not any("scancel" in c for c in other.ran)
    mine = Answers({"squeue": (0, f"{record.folder}\n"), "scancel": (0, ""),
                    "rm -f": (0, "")})
    slurmjobs.cancel(mine, record)
    assert mine.ran[1:] == ["scancel 42", f"rm -f {record.folder}/.kit/env/{JOB_ID}"]


def test_a_job_slurm_says_succeeded_is_no_failure_whatever_its_output_says(tmp_path, monkeypatch):
    """The output file is the job's to write: a forged srun line names no failure of a job that Slurm says
    succeeded, and the job's state and exit code are Slurm's."""
    monkeypatch.setenv("KIT_HOME", str(tmp_path))
    record = slurmjobs.SlurmRecord(JOB_ID, "42", "alice@login", "/home/alice/kit-jobs/" + JOB_ID, "horovod",
                                   "train.py", 2, 0.0)
    forged = "@@kit-nodes a=10.0.0.1 b=10.0.0.2\nsrun: error: b: task 1: Exited with exit code 7\n1: @@kit-exit 7 1.0\n"
    login = Answers({"-o '%T %r'": (0, f"COMPLETED None\n@@kit-poll 0\n{forged}"), "-o %T": (0, "COMPLETED\n"),
                     "sacct -n": (1, "disabled"), "sacct -c": (0, "COMPLETED|0:0\n"), "rm -f": (0, "")})
    ending = slurmjobs.follow(login, record, slurmoutput.Reader("horovod", 2, lambda *a: None), sleep=lambda s: None)
    assert (ending.state, ending.code, ending.failure) == ("succeeded", 0, None)


ENDED_BY_SLURM = [  # Slurm's state, its exit code, what kit says (and records), the fix's words, a task named first
    ("TIMEOUT", "0:15", "reached its time limit, and Slurm ended it (Slurm job 42: timeout)", "--time", False),
    ("DEADLINE", "0:15", "reached its time limit, and Slurm ended it (Slurm job 42: timeout)", "--time", False),
    ("PREEMPTED", "0:15", "was preempted: Slurm ended it for a job of a higher priority (Slurm job 42: preempted)",
     "submit it again", False),
    ("NODE_FAIL", "0:0", "lost a node: Slurm marked it failed and ended the job (Slurm job 42: node_fail); rank 1 on "
     "b ended first (exit 137)", "sinfo -R", True),
    ("OUT_OF_MEMORY", "0:125", "ran out of memory: the kernel ended a task at the job's memory limit (Slurm job 42: "
     "oom); rank 1 on b ended first (exit 137)", "--mem or --mem-per-gpu", True),
]


@pytest.mark.parametrize("state, code, says, fix, named", ENDED_BY_SLURM, ids=[c[0] for c in ENDED_BY_SLURM])
def test_a_job_slurm_ended_is_said_and_recorded_by_slurms_cause_not_as_a_rank_that_failed(tmp_path, monkeypatch,
                                                                                          state, code, says, fix, named):
    """Measured on the lab: a hung job ended by its time limit was reported `rank 0 on kitlab-h1 failed first (exit
    143)` and recorded failed, srun's lines naming the tasks Slurm ended. The cause is Slurm's state, from sacct (or
    squeue): time limit, preemption, a node's failure, memory; a task is named first only where one can have ended
    first (a node's or memory's), never a time limit's or a preemption's SIGTERM."""
    from kit.cli.backends import slurm as cli_slurm
    monkeypatch.setenv("KIT_HOME", str(tmp_path))
    record = slurmjobs.SlurmRecord(JOB_ID, "42", "alice@login", "/home/alice/kit-jobs/" + JOB_ID, "horovod",
                                   "train.py", 2, 0.0)
    killed = "Killed" if named else "Terminated"
    output = (f"@@kit-nodes a=10.0.0.1 b=10.0.0.2\nslurmstepd: error: *** STEP 42.0 ON a CANCELLED AT "
              f"2026-11-29T05:00:00 DUE TO TIME LIMIT ***\nsrun: error: b: task 1: {killed}\n"
              "srun: error: a: task 0: Terminated\n")
    login = Answers({"-o '%T %r'": (0, f"{state} None\n@@kit-poll 0\n{output}"), "-o %T": (0, f"{state}\n"),
                     "sacct -n": (0, f"{state}|{code}\n"), "rm -f": (0, "")})
    ending = slurmjobs.follow(login, record, slurmoutput.Reader("horovod", 2, lambda *a: None), sleep=lambda s: None)
    assert ending.state == slurmjobs.STATES[state] and ending.state in slurmjobs.ENDED
    assert (ending.failure is not None) == named
    with pytest.raises(KitError) as e:
        cli_slurm.report(JOB_ID, record, ending)
    assert e.value.message == f"job {JOB_ID} {says}" and fix in e.value.hint and "failed first" not in e.value.message
    assert e.value.exit_code == (137 if named else 143)
    cli_slurm._remember_end(record, ending)
    (saved,) = slurmjobs.records()
    assert saved.ended == {"state": slurmjobs.STATES[state], "exit": ending.code}


PLANTED = "x-JobState=COMPLETED ExitCode=0:0 WorkDir=/elsewhere"  # every field kit reads, as a job may name itself


class PlantedSlurm(Answers):
    """Slurm 22.05 answering for job 42, whose name and comment a job set to hold every field kit reads (`scontrol
    update JobId=42 JobName=... Comment=...`), in a work folder whose path holds them too: each command prints what
    that Slurm prints (scontrol its whole line, JobName and Comment before JobState, ExitCode and WorkDir)."""

    def __init__(self, state: str, code: str, workdir: str):
        line = (f"JobId=42 JobName=kit-{PLANTED} UserId=alice(1000) GroupId=alice(1000) Priority=1 "
                f"Comment={PLANTED} JobState={state} Reason=None Dependency=(null) ExitCode={code} "
                f"RunTime=00:00:09 Command={workdir}/kit-job.sbatch WorkDir={workdir} StdOut={workdir}/kit-42.out")
        ended = state not in ("RUNNING", "PENDING")
        super().__init__({"scontrol show job": (0, line + "\n"), "-o %T": (0, f"{state}\n"),
                          "-o %Z": (0, f"{workdir}\n"), "-o State,ExitCode": (0, f"{state}|{code}\n" if ended else ""),
                          "scancel": (0, ""), "rm -f": (0, "")})


def test_a_job_that_names_itself_with_kits_fields_decides_nothing_kit_reports():
    workdir = f"/home/alice/{PLANTED}/kit-jobs/{JOB_ID}"
    record = slurmjobs.SlurmRecord(JOB_ID, "42", "alice@login", workdir, "horovod", "train.py", 3, 0.0)
    assert slurmjobs.job_state(PlantedSlurm("RUNNING", "0:0", workdir), "42") == ("running", None)
    assert slurmjobs.job_state(PlantedSlurm("FAILED", "3:0", workdir), "42") == ("failed", 3)
    assert slurmjobs.job_state(PlantedSlurm("TIMEOUT", "0:15", workdir), "42") == ("timeout", 143)
    running = PlantedSlurm("RUNNING", "0:0", workdir)
    slurmjobs.cancel(running, record)  # its own folder, whatever the name says: cancelled
    assert "scancel 42" in running.ran


@pytest.mark.parametrize("command", ["jobs", "logs", "stop"])
def test_the_variables_file_of_a_job_that_ended_outside_kit_goes_the_first_time_kit_sees_it_ended(
        tmp_path, monkeypatch, command):
    """Cancelled while it waited, or killed with its node: the batch script's trap never ran. `kit jobs`, `kit logs`
    and `kit stop` remove the file as they find the job ended, and record the end, so the next look asks nothing."""
    from kit.cli.backends import slurm as slurm_cli
    monkeypatch.setenv("KIT_HOME", str(tmp_path))
    record = slurmjobs.SlurmRecord(JOB_ID, "42", "alice@login", "/home/alice/kit-jobs/" + JOB_ID, "horovod",
                                   "train.py", 3, 0.0)
    slurmjobs.save(record)
    gone = "slurm_load_jobs error: Invalid job id specified"
    login = Answers({"squeue -h -j 42 -o '%T %r'": (0, f"{gone}\n@@kit-poll 1\n"), "squeue": (1, gone),
                     "sacct -n": (1, "disabled"), "sacct -c": (0, "CANCELLED|0:0\n"), "rm -f": (0, "")})
    monkeypatch.setattr(slurmjobs, "login_runner", lambda *a: login)
    login.close = lambda: None
    look = {"jobs": lambda: slurm_cli.rows(5), "stop": lambda: slurm_cli.stop(slurmjobs.records()[0], 5),
            "logs": lambda: slurm_cli.logs(slurmjobs.records()[0], None, False, None, 5, lambda *a: None)}[command]
    look()
    assert f"rm -f {record.folder}/.kit/env/{JOB_ID}" in login.ran
    assert slurmjobs.records()[0].ended == {"state": "stopped", "exit": 0}
    login.ran.clear()
    look()
    assert not any("rm -f" in c or "sacct" in c for c in login.ran)  # seen ended once: not asked again


def test_a_node_named_by_its_name_is_looked_up():
    assert slurmtask.job_nodes("n1=localhost n2=10.1.0.12") == [("n1", "127.0.0.1"), ("n2", "10.1.0.12")]
    with pytest.raises(SystemExit, match="node address kit-no-such-node.invalid does not resolve"):
        slurmtask.job_nodes("n1=kit-no-such-node.invalid")


def read(name: str, launcher: str, ranks: int) -> tuple[slurmoutput.Reader, list]:
    shown = []
    reader = slurmoutput.Reader(launcher, ranks, lambda *line: shown.append(line))
    for line in (DATA / name).read_text().splitlines():
        reader.feed(line)
    return reader, shown


def test_a_failed_horovod_job_names_its_rank_and_node():
    reader, shown = read("horovod_failed.out", "horovod", 3)
    assert shown[:3] == [(0, "n1", "rank 0/3 local 0 sum 6.0 secret=-"), (1, "n2", "rank 1/3 local 0 sum 6.0 secret=-"),
                         (2, "n3", "rank 2/3 local 0 sum 6.0 secret=-")]
    assert (None, None, "srun: error: n3: task 2: Exited with exit code 3") in shown
    assert not any("@@kit" in text for _, _, text in shown)
    assert reader.first_failure() == slurmoutput.Failure("rank 2", "n3", 3, 2)


def test_torchrun_lines_carry_the_rank_within_the_nodes_task():
    reader, shown = read("torchrun_ok.out", "torchrun", 2)
    assert (1, "n1", "rank 1/2 (local 1) on vm, device cpu") in shown
    assert any(rank is None and node == "n1" for rank, node, _ in shown)  # torchrun's own lines, with their node
    assert reader.first_failure() is None


def test_labels_of_ten_tasks_and_more_and_exit_lines_a_rank_printed_itself():
    """srun pads task numbers to the widest (` 3: `); a rank's own `@@kit-exit` line comes before the launcher's."""
    reader = slurmoutput.Reader("horovod", 12, lambda *a: None)
    reader.feed("@@kit-nodes a=10.0.0.1 b=10.0.0.2 c=10.0.0.3")
    reader.feed("@@kit-nodes x=10.6.6.6")  # printed by a rank into the output: not the batch script's
    for line in (" 3: @@kit-exit 0 1.0", " 3: @@kit-exit 7 5.0", "11: @@kit-exit 143 6.0", " 0: @@kit-exit 143 6.1",
                 "srun: error: c: tasks 8-11: Terminated", "srun: error: a: tasks 0,3: Exited with exit code 7"):
        reader.feed(line)
    assert reader.nodes == ["a", "b", "c"]
    assert reader.first_failure() == slurmoutput.Failure("rank 3", "a", 7, 3)


def test_lines_a_job_writes_into_its_output_file_do_not_name_the_failed_rank():
    """Every line of the output file is the job's to write: `7: @@kit-exit 42` of a 4-rank job names no rank 7; an
    exit line of a rank that srun says did not fail names nothing; srun's report names the task and its code."""
    shown = []
    reader = slurmoutput.Reader("horovod", 4, lambda *line: shown.append(line))
    for line in ("@@kit-nodes a=10.0.0.1 b=10.0.0.2", "7: @@kit-exit 42 1.0", "12: hello", "0: @@kit-exit 9 2.0"):
        reader.feed(line)
    assert 7 not in reader.exits
    assert (None, None, "7: @@kit-exit 42 1.0") in shown and (None, None, "12: hello") in shown
    assert reader.first_failure() is None  # srun says no task failed: the job's own lines do not make one
    reader.feed("srun: error: b: task 9: Exited with exit code 5")  # no task 9 in a 4-rank job
    reader.feed("srun: error: b: task 3: Exited with exit code 0")  # exit code 0 is no failure
    assert reader.first_failure() is None
    reader.feed("srun: error: b: task 2: Exited with exit code 1")
    assert reader.first_failure() == slurmoutput.Failure("rank 2", "b", 1, 2)  # rank 0's line named 9: srun's wins
    torch = slurmoutput.Reader("torchrun", 4, lambda *a: None)
    for line in ("@@kit-nodes a=10.0.0.1 b=10.0.0.2", "0: [7]<stdout>:@@kit-exit 3 1.0",
                 "0: [1]<stdout>:@@kit-exit 3 2.0", "1: [2]<stdout>:@@kit-exit 4 3.0",
                 "srun: error: b: task 1: Exited with exit code 1"):
        torch.feed(line)
    assert 7 not in torch.exits
    # rank 1's line came earlier, from a node srun says did not fail
    assert torch.first_failure() == slurmoutput.Failure("rank 2", "b", 4, 2)


def test_srun_alone_names_a_task_that_died_without_its_exit_line():
    reader = slurmoutput.Reader("torchrun", 4, lambda *a: None)
    for line in ("@@kit-nodes a=10.0.0.1 b=10.0.0.2", "srun: error: b: task 1: Segmentation fault (core dumped)",
                 "srun: error: a: task 0: Terminated"):
        reader.feed(line)
    assert reader.first_failure() == slurmoutput.Failure("torchrun", "b", 139, None)


# ---------------------------------------------------------------- kit export --to slurm

def test_export_writes_the_script_in_a_folder_without_kit_yaml(tmp_path):
    from helpers import run_kit
    r = run_kit("export", "--to", "slurm", "--nodes", "2", "--ntasks-per-node", "2", "train.py", "--epochs", "2",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in r.stdout
    assert "python3 -u \"$KIT_LIB/kit_task.py\" horovod train.py --epochs 2 || code=$?" in r.stdout
    assert "export KIT_JOB=slurm-$SLURM_JOB_ID" in r.stdout and "sbatch THIS_FILE" in r.stdout
    written = run_kit("export", "--to", "slurm", "--launcher", "tf", "-o", "job.sbatch", "train.py", cwd=tmp_path)
    assert written.returncode == 0 and "sbatch job.sbatch" in (tmp_path / "job.sbatch").read_text()
    assert sorted(os.listdir(tmp_path)) == [".kit", "job.sbatch"]  # nothing else made, here or anywhere
    assert [p.name for p in (tmp_path / ".kit").iterdir()] == [p.rsplit("/", 2)[1] for p in sbatch.helper_files()][:1]


def test_export_takes_np_as_horovodrun_spells_it_and_refuses_kit_runs_h_after_the_script(tmp_path):
    """-n 4 is 4 ranks (as horovodrun's -np 4); -H, kit run's, is not export's: after the script it was the script's
    and the job one node, so it is refused, and after -- it is the script's as asked."""
    from helpers import run_kit
    for spelling in (["-n", "4"], ["-np=4"], ["--num-proc", "4"]):
        r = run_kit("export", "--to", "slurm", *spelling, "train.py", cwd=tmp_path)
        assert r.returncode == 0 and "#SBATCH --ntasks-per-node=4" in r.stdout, r.stderr
    r = run_kit("export", "--to", "slurm", "train.py", "-H", "a:2,b:2", cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr.splitlines()) == (2, "", [
        "error: -H: kit run's, which places a job on the cluster's hosts; a Slurm or Kubernetes job takes --nodes N "
        "and --ntasks-per-node N",
        "fix: if -H is the script's, give the script's arguments after --: kit export [OPTIONS] train.py -- -H a:2,b:2"])
    r = run_kit("export", "--to", "slurm", "train.py", "--", "-H", "a:2,b:2", cwd=tmp_path)
    assert r.returncode == 0 and "kit_task.py\" horovod train.py -H a:2,b:2 || code=$?" in r.stdout, r.stderr


def test_export_takes_the_jobs_variables_as_kit_run_does_never_in_the_script(tmp_path):
    """-e and --env-file for a script submitted by hand: the values in .kit/env here (0600, in a 0700 folder), never
    in the script; each job copies them to its own file, which its ranks read and which goes at its end, so the
    script can be submitted again; --no-requeue as for kit run --on slurm."""
    from helpers import run_kit
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "secrets.env").write_text("API_KEY=from-the-file\n")
    r = run_kit("export", "--to", "slurm", "-e", "TOKEN=s3cret", "--env-file", "secrets.env", "-o", "job.sbatch",
                "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "job.sbatch").read_text()
    assert "s3cret" not in text + r.stdout + r.stderr and "from-the-file" not in text and "#SBATCH --no-requeue" in text
    (name,) = os.listdir(tmp_path / ".kit/env")
    assert (tmp_path / ".kit/env").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / ".kit/env" / name).stat().st_mode & 0o777 == 0o600
    assert json.loads((tmp_path / ".kit/env" / name).read_text()) == {"API_KEY": "from-the-file", "TOKEN": "s3cret"}
    assert f"the job's variables (API_KEY, TOKEN) in .kit/env/{name} (mode 0600) and kit's files" in r.stderr
    block = text[text.index('install -m 600'):text.index('export KIT_ENV="slurm-$SLURM_JOB_ID"')]
    for job in ("7", "8"):  # each submission's own copy, from the one kit wrote
        assert subprocess.run(["bash", "-euc", block], cwd=tmp_path, env={"SLURM_JOB_ID": job,
                                                                           "PATH": os.environ["PATH"]}).returncode == 0
    assert sorted(os.listdir(tmp_path / ".kit/env")) == sorted([name, "slurm-7", "slurm-8"])
    assert (tmp_path / ".kit/env/slurm-8").read_text() == (tmp_path / ".kit/env" / name).read_text()
    assert (tmp_path / ".kit/env/slurm-8").stat().st_mode & 0o777 == 0o600
    checked = subprocess.run(["shellcheck", str(tmp_path / "job.sbatch")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


@pytest.mark.parametrize("args, says", [
    (["--to", "slurm"], "error: --to slurm needs the training script"),
    (["--to", "slurm", "--launcher", "mpi", "t.py"], "error: --launcher: 'mpi' is not a launcher"),
    (["--to", "enroot", "-e", "X=1"], "error: -e: a job's, for --to slurm or k8s"),
    (["--to", "enroot", "--nodes", "2"], "error: --nodes: a job's, for --to slurm or k8s"),
    (["--to", "enroot", "--kind", "mpijob"], "error: --kind: for --to k8s"),
    (["--to", "k8s", "--partition", "p", "t.py"], "error: --partition: Slurm's"),
])
def test_export_refuses_what_is_not_a_job_of_its_target(tmp_path, args, says):
    from helpers import run_kit
    r = run_kit("export", *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(says), r.stderr


WARNED = """import os, signal, subprocess, sys
print("inherited", signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN, flush=True)
os.kill(os.getpid(), signal.SIGUSR1)  # a script that does not handle it goes on
print("alive", flush=True)
child = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGUSR1) == "
                        "signal.SIG_IGN)"], capture_output=True, text=True).stdout.strip()
print("child ignores", child, flush=True)  # what it starts (torchrun's workers) ignores it too
signal.signal(signal.SIGUSR1, lambda *a: print("checkpoint", flush=True))  # a script that handles it gets it
os.kill(os.getpid(), signal.SIGUSR1)
"""


def test_slurms_warning_before_the_time_limit_is_the_scripts_to_handle_and_a_requeued_job_resumes(tmp_path):
    """sbatch --signal=USR1@120 sends SIGUSR1 to every process of the job two minutes before its time limit: the task
    becomes the rank (or torchrun) with it ignored, so a script without a handler goes on (its default would end it)
    and one with a handler gets it to save a checkpoint; what it starts ignores it too."""
    text = sbatch.render(golden_job("torchrun", "none"))
    assert "#SBATCH --signal=USR1@120\n" in text
    # A job kit submits again (its start as the script's argument) or Slurm requeued resumes, as on the cluster; an
    # argument that is no small number counts as none.
    restart = text[text.index("start=${1:-0}"):].split("\n", 3)
    assert restart[2].startswith("export KIT_RESTART="), restart
    for args, count, seen in (([], None, "0"), ([], "2", "2"), (["1"], None, "1"), (["1"], "1", "2"),
                              (["$(id)"], None, "0"), (["1;id"], "3", "3")):
        env = {"PATH": os.environ["PATH"], **({"SLURM_RESTART_COUNT": count} if count else {})}
        shown = subprocess.run(["bash", "-euc", "\n".join(restart[:3]) + '; echo "$KIT_RESTART"', "job", *args],
                               env=env, capture_output=True, text=True)
        assert shown.stdout == seen + "\n", (args, count, shown.stdout, shown.stderr)
    (tmp_path / "warned.py").write_text(WARNED)
    here = Path(slurmtask.__file__)  # imported by its file, as a task imports it: no kit beside it
    task = (f"import sys; sys.path.insert(0, {str(here.parent)!r}); import {here.stem} as slurmtask; "
            "slurmtask.ignore_job_signals(); "  # as its main() does first
            f"slurmtask.become([sys.executable, {str(tmp_path / 'warned.py')!r}], dict(__import__('os').environ))")
    r = subprocess.run([sys.executable, "-c", task], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.split("\n")[:4] == [
        "inherited True", "alive", "child ignores True", "checkpoint"], r.stdout + r.stderr


def test_a_horovod_rank_on_a_node_whose_name_does_not_resolve_says_so(monkeypatch):
    monkeypatch.setattr(slurmtask.socket, "gethostname", lambda: "kit-no-such-node.invalid")
    with pytest.raises(SystemExit, match="kit-no-such-node.invalid, does not resolve here; Horovod's Gloo needs it"):
        slurmtask.check_hostname()
    monkeypatch.setattr(slurmtask.socket, "gethostname", lambda: "localhost")
    slurmtask.check_hostname()


def test_a_ref_names_a_slurm_job_by_kits_forms_alone_and_none_when_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_HOME", str(tmp_path))
    assert slurmjobs.resolve("last") is None  # no Slurm job: the cluster's jobs are asked
    for job_id, slurm_id in (("20261126-070000-1234", "5"), ("20261126-080000-ab12", "1234")):
        slurmjobs.save(slurmjobs.SlurmRecord(job_id, slurm_id, None, f"/j/{job_id}", "horovod", "t.py", 2, 0.0))
    assert slurmjobs.resolve("1234").slurm_id == "5"  # the tail of kit's id, not Slurm's id 1234
    assert slurmjobs.resolve("last").id == "20261126-080000-ab12"
    assert slurmjobs.resolve("20261125") is None
    with pytest.raises(BadInput, match="ambiguous"):
        slurmjobs.resolve("20261126")


def test_a_job_named_after_another_adds_no_record_kit_takes_for_it():
    """Slurm's job completion file (sacct -c, kit prepare's Slurm) holds each job's name unescaped, and sacct takes
    `JobId=42` in another job's name as a record of job 42: a helper job so named, which succeeded, made job 42's
    failure read `✓ finished`, exit 0. Two records are no answer; a record whose state is not the one squeue still
    gives is not the job's."""
    forged = "COMPLETED|0:0\nFAILED|3:0\n"
    assert slurmjobs.parse_sacct(forged) is None and slurmjobs.parse_sacct("FAILED|3:0\n") == ("failed", 3)
    failed = Answers({"squeue": (0, "FAILED\n"), "sacct -c": (0, "COMPLETED|0:0\n"), "sacct": (1, "disabled")})
    assert slurmjobs.job_state(failed, "42") == ("failed", None)
    gone = "slurm_load_jobs error: Invalid job id specified"
    assert slurmjobs.job_state(Answers({"squeue": (1, gone), "sacct -c": (0, forged), "sacct": (1, "disabled")}),
                               "42") == ("lost", None)
    assert slurmjobs.job_state(Answers({"squeue": (0, "FAILED\n"), "sacct -c": (0, "FAILED|3:0\n"),
                                        "sacct": (1, "disabled")}), "42") == ("failed", 3)


def test_a_jobs_output_is_read_look_by_look_as_a_regular_file_within_bounds(tmp_path, monkeypatch):
    """The poll's shell, run here (with an squeue that cannot reach its controller, whatever Slurm this machine has):
    a long output is read in bounded looks, each going on where the last stopped, a line longer than a look is taken
    cut, and an output file the job made a FIFO or a link to /dev/zero is not read (before, one look read all of it:
    past 16 MiB kit failed for good)."""
    from kit.runners.local import LocalRunner
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(slurmjobs, "POLL_LINES", 10)
    monkeypatch.setattr(slurmjobs, "POLL_BYTES", 4096)
    record = slurmjobs.SlurmRecord(JOB_ID, "42", None, str(tmp_path), "horovod", "train.py", 2, 0.0)
    out = tmp_path / "kit-42.out"
    out.write_text("".join(f"0: line {i}\n" for i in range(25)) + "1: " + "x" * 9000 + "\n1: after\n1: now bei")
    seen = []
    poll, read = slurmjobs.read_rest(LocalRunner("localhost"), record, 0, seen.append)
    assert seen[:25] == [f"0: line {i}" for i in range(25)] and seen[-1] == "1: after" and len(seen) == 27
    assert seen[25].startswith("1: xxx") and len(seen[25]) <= 4096 and read == 27 and poll.state == "unknown"
    out.unlink()
    os.mkfifo(out)
    assert slurmjobs.read_rest(LocalRunner("localhost"), record, 0, seen.append)[1] == 0  # returns: no FIFO read
    out.unlink()
    out.symlink_to("/dev/zero")
    assert slurmjobs.read_rest(LocalRunner("localhost"), record, 0, seen.append)[1] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="listens as another uid: root only")
def test_the_task_names_a_port_of_the_jobs_that_another_users_program_listens_on(capsys):
    """Another user's program bound one of the job's ports before the job: the task says which, on which node, and
    whose, before its ranks try it; a port the job's own user listens on is not named."""
    listen = ("import os, socket, sys, time\nos.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))\n"
              "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1); print(s.getsockname()[1], flush=True)\n"
              "time.sleep(60)\n")
    procs = [subprocess.Popen([sys.executable, "-c", listen, str(uid)], stdout=subprocess.PIPE, text=True)
             for uid in (4243, os.getuid())]
    try:
        theirs, mine = (int(p.stdout.readline()) for p in procs)
        assert slurmtask.squatted(theirs, 1, os.getuid()) == [(theirs, 4243)]
        assert slurmtask.squatted(mine, 1, os.getuid()) == []
        slurmtask.say_squatted({"KIT_PORT": str(theirs), "KIT_PORT_BLOCK": "1"}, "gpu-2")
        assert capsys.readouterr().err == (f"kit: port {theirs} of this job on gpu-2 is held by uid 4243, another "
                                           "user's program: kit's Prolog keeps the job's connections from it, so what "
                                           "the job serves there cannot start; end that program, or submit the job "
                                           "again (it gets other ports)\n")
    finally:
        for p in procs:
            p.kill()
            p.wait()
