"""`kit run`, `kit logs`, `kit exec` on three lab hosts: horovodrun and torchrun on a cluster of the CPU image,
TensorFlow workers on a cluster of the tf-cpu image brought up from the same hosts.txt."""

import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import (interrupt, kit, lab_cluster, make_project, read_until, release_cpu_groups, throttle,
                     wait_for)
from helpers import REPO

pytestmark = pytest.mark.lab
JOBS = Path(__file__).parent / "jobs"
LOOP = str(JOBS / "allreduce_loop.py")


@pytest.fixture(scope="module")
def cluster(project, lab):
    with lab_cluster(lab, project, "lab", "--hosts", "hosts.txt"):
        yield project


@pytest.fixture(scope="module")
def tf_cluster(project, lab, tmp_path_factory):
    """The TF image's cluster, on the same hosts at once: the Horovod project's hosts.txt, its own name and port."""
    tf_project = make_project(tmp_path_factory.mktemp("tf-project"), lab, "tf", {"flavor": "tf-cpu"},
                              ssh_port=12346)
    with lab_cluster(lab, tf_project, "tf", "--hosts", str(project / "hosts.txt"), port=12346):
        yield tf_project


def cluster_for(request, launcher: str) -> Path:
    """The project whose cluster runs the launcher: the TF image's for tf, the Horovod image's for the others."""
    return request.getfixturevalue("tf_cluster" if launcher == "tf" else "cluster")


def job_processes(lab, pattern: str) -> dict[str, list[int]]:
    return {h.name: pids for h in lab.hosts if (pids := h.processes(pattern))}


def left_after(lab, pattern: str, seconds: float = 10) -> dict[str, list[str]]:
    """The processes of a stopped job still there after a few seconds (a shell whose command was killed, or whose
    SSH connection was cut, ends on its own a moment later), each as `pid command (ppid, KIT_JOB or not)`."""
    deadline = time.monotonic() + seconds
    while (left := job_processes(lab, pattern)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return {host: [describe(pid) for pid in pids] for host, pids in left.items()}


def describe(pid: int) -> str:
    proc = Path(f"/proc/{pid}")
    try:
        ppid = next(l.split()[1] for l in (proc / "status").read_text().splitlines() if l.startswith("PPid:"))
        job = any(v.startswith(b"KIT_JOB=") for v in (proc / "environ").read_bytes().split(b"\0"))
        line = (proc / "cmdline").read_bytes().replace(b"\0", b" ")[:160].decode(errors="replace")
        return f"{pid} {line} (ppid {ppid}, {'with' if job else 'without'} KIT_JOB)"
    except OSError:
        return f"{pid} (gone)"


def test_cifar_example_trains_on_three_hosts(project, lab, cluster):
    r = kit(project, lab, "run", str(REPO / "examples" / "cifar10_cnn_horovod.py"), "--np", "3", "--",
            "--epochs", "3", "--samples", "1536")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    starts = re.findall(r"^\[(\S+) rank (\d)\] rank \2/3 \(local 0\) on (\S+) \((\S+)\)", r.stdout, re.M)
    assert sorted((rank, host, hostname) for _, rank, host, hostname in starts) == \
           [(str(i), h.address, h.name) for i, h in enumerate(lab.hosts)]
    losses = [float(x) for x in re.findall(r"^\[\S+ rank 0\] epoch \d: loss ([\d.]+)", r.stdout, re.M)]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    assert lab.hosts[0].run_in("test", "-s", "/var/lib/kit/lab/workspace/checkpoints/cifar10_cnn.pt",
                               check=False).returncode == 0
    assert re.search(r"✓ job \S+ finished", r.stdout)

    log = kit(project, lab, "logs", "--rank", "1")
    assert log.returncode == 0, log.stderr
    lines = log.stdout.splitlines()
    assert lines and all(line.startswith(f"[{lab.hosts[1].address} rank 1] ") for line in lines), lines[:5]
    assert any("rank 1/3" in line for line in lines)


def rank_starts(out: str) -> list[tuple[str, str, str]]:
    """(rank, host of its prefix, hostname it printed) of each `rank N/3 ... on HOSTNAME` line."""
    found = re.findall(r"^\[(\S+) rank (\d)\] rank \2/3 (?:\(local 0\) )?on ([\w.-]+)", out, re.M)
    return sorted((rank, host, hostname) for host, rank, hostname in found)


def rank0_losses(out: str) -> list[float]:
    return [float(x) for x in re.findall(r"^\[\S+ rank 0\] epoch \d: loss ([\d.]+)", out, re.M)]


@pytest.mark.parametrize("example, launcher, options", [
    ("mnist_horovod.py", "horovod", ["--np", "3"]),
    ("ddp_train.py", "torchrun", ["--launcher", "torchrun"]),
    ("tf_multiworker.py", "tf", ["--launcher", "tf"]),
])
def test_examples_train_on_three_hosts(request, lab, example, launcher, options):
    project = cluster_for(request, launcher)
    r = kit(project, lab, "run", *options, str(REPO / "examples" / example), "--", "--epochs", "3", "--samples", "1920")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert rank_starts(r.stdout) == [(str(i), h.address, h.name) for i, h in enumerate(lab.hosts)], r.stdout[-3000:]
    losses = rank0_losses(r.stdout)
    assert len(losses) == 3 and losses[-1] < losses[0], r.stdout[-3000:]
    checkpoint = re.search(r"^\[\S+ rank 0\] saved checkpoint (\S+)$", r.stdout, re.M)
    assert checkpoint and lab.hosts[0].run_in("test", "-s", checkpoint[1], check=False).returncode == 0


def test_exec_runs_in_the_named_hosts_container(project, lab, cluster):
    r = kit(project, lab, "exec", lab.hosts[1].address, "--", "sh", "-c", "hostname; test -d /etc/kit/ssh; exit 7")
    assert r.returncode == 7
    assert r.stdout == f"{lab.hosts[1].name}\n"  # as docker exec prints it: no prefix (tests/lab/test_data.py)


def test_a_horovod_job_on_one_host_of_the_cluster_runs(project, lab, cluster):
    """horovodrun runs a job on one host as a local one, its ranks sent to a rendezvous on 127.0.0.1: the patched
    rendezvous listens there, not on the cluster address (it did, and such a job could not start)."""
    r = kit(project, lab, "run", str(JOBS / "noop.py"), "--np", "1")
    assert r.returncode == 0 and f"[{lab.hosts[0].address} rank 0] rank 0 of 1 up" in r.stdout, r.stdout + r.stderr


# The same job through horovodrun, through torchrun (torch.distributed over Gloo) and as TensorFlow workers.
LAUNCHES = {"horovod": (["--np", "3"], []), "torchrun": (["--launcher", "torchrun"], ["--ddp"]),
            "tf": (["--launcher", "tf"], ["--tf"])}


@pytest.mark.parametrize("launcher", LAUNCHES)
def test_a_failing_rank_ends_the_job_everywhere_naming_its_host(request, lab, launcher):
    project = cluster_for(request, launcher)
    run_options, job_options = LAUNCHES[launcher]
    started = time.monotonic()
    r = kit(project, lab, "run", LOOP, *run_options, "--", *job_options, "--fail-rank", "2", "--exit-code", "3",
            timeout=120)
    elapsed = time.monotonic() - started
    assert r.returncode == 3, r.stdout[-3000:] + r.stderr[-3000:]
    assert elapsed < 60, f"kit run took {elapsed:.0f} s to end a failed job"
    assert f"error: rank 2 on {lab.hosts[2].address} failed first (exit 3)" in r.stderr
    assert left_after(lab, "allreduce_loop") == {}


@pytest.mark.parametrize("launcher", LAUNCHES)
def test_every_rank_gets_the_jobs_variables_and_no_secret_value_is_shown_or_kept(request, lab, launcher, tmp_path):
    project = cluster_for(request, launcher)
    folder = tmp_path / "job"  # the variables' file beside the script, as users keep it: never copied to a host
    folder.mkdir()
    shutil.copy(JOBS / "print_env.py", folder)
    env_file = folder / "vars.txt"
    env_file.write_text("# the tracker's key\nWANDB_API_KEY=s3cr3t-42\nSPACED= a  'b' $HOME\nOMP_NUM_THREADS=8\n")
    (folder / ".env").write_text("ANOTHER_KEY=s3cr3t-43\n")
    r = kit(project, lab, "run", str(folder / "print_env.py"), *LAUNCHES[launcher][0], "-e", "NCCL_DEBUG=INFO",
            "-e", "OMP_NUM_THREADS=2", "-e", "EMPTY=", "--env-file", str(env_file), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    printed = re.findall(r"^\[(\S+) rank (\d)\] env (.*)$", r.stdout, re.M)
    assert sorted((rank, host) for host, rank, _ in printed) == [(str(i), h.address) for i, h in enumerate(lab.hosts)]
    want = {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "2", "SPACED": " a  'b' $HOME", "EMPTY": "",
            "key_sha256": hashlib.sha256(b"s3cr3t-42").hexdigest()}
    assert all(json.loads(values) == want for _, _, values in printed), printed
    shown = "WANDB_API_KEY=(hidden), SPACED=(hidden), OMP_NUM_THREADS=2, NCCL_DEBUG=INFO, EMPTY=(hidden)"
    assert f"environment: {shown}" in r.stdout
    assert "s3cr3t-42" not in r.stdout + r.stderr
    # The job's record keeps the names alone; the values left the primary with the job.
    job = re.search(r"^kit: job (\S+):", r.stdout, re.M)[1]
    cluster = "tf" if launcher == "tf" else "lab"
    folder = f"/var/lib/kit/{cluster}/jobs/{job}"
    record = lab.hosts[0].docker("exec", f"kit-{cluster}", "sh", "-c", f"ls {folder}; cat {folder}/environment")
    *files, kept = record.stdout.splitlines()
    assert "environment" in files and kept == "WANDB_API_KEY, SPACED, OMP_NUM_THREADS, NCCL_DEBUG, EMPTY", record.stdout
    for h in lab.hosts:  # the values left every container with the job
        left = h.docker("exec", f"kit-{cluster}", "ls", "-A", "/run/kit/env", check=False).stdout.split()
        assert job not in left, (h.name, left)
        copied = h.run_in("ls", "-A", f"/var/lib/kit/{cluster}/workspace").stdout.split()
        assert "print_env.py" in copied and "vars.txt" not in copied and ".env" not in copied, (h.name, copied)


def start_loop(project, lab, launcher: str = "horovod") -> subprocess.Popen:
    run_options, job_options = LAUNCHES[launcher]
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", LOOP, *run_options, "--", *job_options,
                             "--seconds", "300"],
                            cwd=project, env={**__import__("os").environ, **lab.env, "COLUMNS": "200"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # As in a terminal, whatever started the tests: a shell's background job ignores
                            # SIGINT, and its children would inherit that.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    read_until(proc, lambda seen: len([line for line in seen if "started rank" in line]) >= 3, 120)
    return proc


@pytest.mark.alone  # ends within 60 s: 8 s alone, 63 s once with the other stream building images beside it
def test_a_killed_worker_container_ends_the_job_everywhere(project, lab, cluster):
    proc = start_loop(project, lab)
    h2 = lab.hosts[1]
    started = time.monotonic()
    h2.docker("kill", "kit-lab")
    try:
        out, err = proc.communicate(timeout=90)
        elapsed = time.monotonic() - started
        assert proc.returncode not in (0, None)
        assert elapsed < 60, f"kit run took {elapsed:.0f} s to end the job"
        assert f"rank 1 on {h2.address} failed first" in err, out[-2000:] + err
        assert left_after(lab, "allreduce_loop") == {}
    finally:
        proc.kill()
        h2.docker("start", "kit-lab")
        # the cluster whole again before the next test counts what listens: its sshd up, not only started
        wait_for(f"the restarted container's sshd on {h2.name}", lambda: h2.listening(12345), timeout=60)


def last_job(project, lab) -> dict:
    listed = kit(project, lab, "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout.splitlines()[-1])


def test_a_job_outlives_a_killed_kit_and_kit_stop_ends_it_on_every_host(project, lab, cluster):
    before = {h.name: listeners(h) for h in lab.hosts}  # sshd, and whatever the host had
    proc = start_loop(project, lab)
    assert any(listeners(h) - before[h.name] for h in lab.hosts)  # the job's own servers (Gloo, horovodrun's)
    proc.kill()  # SIGKILL: the way a closed laptop or a dropped VPN ends kit's SSH session
    proc.communicate(timeout=30)
    time.sleep(3)
    assert len(job_processes(lab, "allreduce_loop")) == 3  # the job goes on without kit
    job = last_job(project, lab)
    assert (job["state"], job["launcher"], job["np"], job["exit"]) == ("running", "horovod", 3, None), job
    table = kit(project, lab, "jobs")
    assert re.search(rf"^{job['id']}\s+horovod\s+3\s+.*running", table.stdout, re.M), table.stdout

    started = time.monotonic()
    stopped = kit(project, lab, "stop", job["id"], timeout=120)
    elapsed = time.monotonic() - started
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"job {job['id']} stopped on every host" in stopped.stdout
    assert elapsed < 30, (elapsed, stopped.stdout)
    assert left_after(lab, "allreduce_loop") == {}, stopped.stdout
    assert {h.name: listeners(h) - before[h.name] for h in lab.hosts} == {h.name: set() for h in lab.hosts}
    after = last_job(project, lab)
    assert (after["id"], after["state"]) == (job["id"], "stopped") and after["exit"] is not None, after
    again = kit(project, lab, "stop", job["id"])
    assert again.returncode == 0 and f"job {job['id']} is not running (stopped)" in again.stdout


def test_a_detached_job_is_listed_followed_and_recorded_with_its_checkpoint(project, lab, cluster):
    r = kit(project, lab, "run", "--detach", str(REPO / "examples" / "cifar10_cnn_horovod.py"), "--np", "3", "--",
            "--epochs", "2", "--samples", "768", "--checkpoint", "checkpoints/detached.pt")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    job_id = re.search(r"job (\S+) started \(detached\)", r.stdout)[1]
    assert last_job(project, lab)["id"] == job_id
    # a follower whose connection is cut mid-run (SIGKILL) ends nothing; the next one follows to the end
    follower = subprocess.Popen([sys.executable, "-m", "kit", "logs", job_id, "-f"], cwd=project,
                                env={**__import__("os").environ, **lab.env, "COLUMNS": "200"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    read_until(follower, lambda seen: any(re.search(r"rank \d/3", line) for line in seen), 120)  # the ranks started
    assert last_job(project, lab)["state"] == "running"
    follower.kill()
    follower.communicate(timeout=30)
    attached = kit(project, lab, "attach", job_id, timeout=300)  # from the start to the end, as kit run
    assert attached.returncode == 0, attached.stdout[-2000:] + attached.stderr
    assert re.search(r"^\[\S+ rank 0\] rank 0/3", attached.stdout, re.M), attached.stdout[-2000:]
    assert f"job {job_id} finished" in attached.stdout, attached.stdout[-2000:]
    followed = kit(project, lab, "logs", job_id, "-f", timeout=300)
    assert followed.returncode == 0, followed.stderr
    assert "epoch 2: loss" in followed.stdout and "saved checkpoint" in followed.stdout, followed.stdout[-2000:]
    job = last_job(project, lab)
    assert (job["id"], job["state"], job["exit"], job["np"]) == (job_id, "succeeded", 0, 3), job
    assert lab.hosts[0].run_in("test", "-s", "/var/lib/kit/lab/workspace/checkpoints/detached.pt",
                               check=False).returncode == 0


@pytest.mark.parametrize("launcher", LAUNCHES)
def test_ctrl_c_stops_the_job_on_every_host(request, lab, launcher):
    proc = start_loop(cluster_for(request, launcher), lab, launcher)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"kit run did not end within 30 s of Ctrl-C:\n{out[-3000:]}\n{err[-3000:]}")
    assert proc.returncode == 130, out[-2000:] + err
    assert "interrupted: job" in err and "stopped on every host" in err
    assert left_after(lab, "allreduce_loop") == {}
    project = cluster_for(request, launcher)
    deadline = time.monotonic() + 30  # its supervisor, never stopped by kit, records the end
    while (job := last_job(project, lab))["state"] == "stopping" and time.monotonic() < deadline:
        time.sleep(1)
    assert (job["state"], job["launcher"]) == ("stopped", launcher) and job["exit"] is not None, job


RESTARTING = {  # launcher -> (kit run's options, the example and its options)
    "horovod": (["--np", "3"], "cifar10_cnn_horovod.py", ["--samples", "768"]),
    "torchrun": (["--launcher", "torchrun"], "ddp_train.py", ["--samples", "24576"]),
}


@pytest.mark.parametrize("launcher", RESTARTING)
@pytest.mark.alone  # a 10 s hang watch over training steps: steps slowed by the other stream would read as a hang
def test_a_job_goes_on_from_its_checkpoint_on_the_hosts_left_after_one_is_lost(project, lab, cluster, launcher):
    """A host's container killed mid-run: kit starts the job again on the two others (--restarts 1 --min-np 2),
    the example resumes from its last checkpoint and ends; kit jobs shows the restart and the host left out. The
    hang watch, at 10 s, sees the training steps move all along (before, during and after the restart)."""
    run_options, example, job_options = RESTARTING[launcher]
    checkpoint = f"checkpoints/restart-{launcher}.pt"
    lab.hosts[0].run_in("rm", "-f", f"/var/lib/kit/lab/workspace/{checkpoint}")
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", *run_options, "--restarts", "1", "--min-np", "2",
                             "--hang-timeout", "10s", str(REPO / "examples" / example), "--", *job_options,
                             "--epochs", "8", "--checkpoint", checkpoint],
                            cwd=project, env={**__import__("os").environ, **lab.env, "COLUMNS": "200"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    h3 = lab.hosts[2]
    try:
        seen = read_until(proc, lambda seen: any(re.search(r"rank 0\] epoch 2: loss", line) for line in seen), 300)
        h3.docker("kill", "kit-lab")
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
        h3.docker("start", "kit-lab")
    out = "".join(seen) + out
    assert proc.returncode == 0, out[-4000:] + err[-3000:]
    assert f"kit: restart 1 of 1: left out {h3.address} (no answer); 2 processes on " in out, out[-4000:]
    resumed = re.search(rf"rank 0\] resumed from {checkpoint} after epoch (\d) \(restart 1, 2 ranks\)", out)
    assert resumed and int(resumed[1]) >= 2, out[-4000:]
    epochs = [(int(e), float(loss)) for e, loss in re.findall(r"rank 0\] epoch (\d): loss ([\d.]+)", out)]
    after = [loss for e, loss in epochs if e > int(resumed[1])]
    assert [e for e, _ in epochs][-1] == 8 and after and after[-1] < epochs[0][1], epochs
    assert not re.search(rf"^\[{re.escape(h3.address)} rank", out.split("resumed from")[1], re.M)  # none on h3
    job = last_job(project, lab)
    assert (job["state"], job["exit"], job["restarts"], job["left_out"]) == ("succeeded", 0, 1, [h3.address]), job
    assert job["np"] == 2 and job_processes(lab, example) == {}
    table = kit(project, lab, "jobs").stdout
    assert re.search(rf"^{job['id']}\s.*succeeded\s.*\s1 \(left out {re.escape(h3.address)}\)", table, re.M), table


@pytest.mark.alone  # named within the hang timeout + 60 s
def test_a_hang_is_named_with_every_ranks_stack_and_the_job_stopped(project, lab, cluster):
    """Rank 2 blocks before an allreduce, the others wait in it: within the hang timeout + 60 s kit names rank 2 and
    its host, keeps each rank's stack (py-spy) in the job's folder, and nothing of the job is left."""
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--np", "3", "--hang-timeout", "20s", LOOP, "--",
                             "--hang-rank", "2"], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**__import__("os").environ, **lab.env, "COLUMNS": "200"}, text=True)
    try:
        seen = read_until(proc, lambda seen: any("rank 2 blocks on purpose" in line for line in seen), 180)
        blocked = time.monotonic()
        out, err = proc.communicate(timeout=300)
        elapsed = time.monotonic() - blocked
    finally:
        proc.kill()
    r = subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen) + out, err)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert elapsed < 20 + 60, elapsed  # reported and stopped within the hang timeout + 60 s of the rank blocking
    h3 = lab.hosts[2]
    hung = re.search(r"hung: no rank has made progress for \d+ s: rank 2 on (\S+) is at (.*); the other 2 ranks "
                     r"wait at (.*); it was stopped on every host", " ".join(r.stderr.split()))
    assert hung and hung[1] == h3.address and "allreduce_loop.py" in hung[2], r.stderr[-3000:]
    job = last_job(project, lab)
    assert job["state"] == "failed" and job["hang"].startswith("no rank has made progress"), job
    folder = f"/var/lib/kit/lab/jobs/{job['id']}/stacks"
    stacks = {name: lab.hosts[0].run_in("cat", f"{folder}/{name}").stdout
              for name in ("rank-0.txt", "rank-1.txt", "rank-2.txt")}
    assert stacks["rank-2.txt"].startswith(f"rank 2 on {h3.address}\n"), stacks
    assert re.search(r"<module> \(.*allreduce_loop\.py:\d+\)", stacks["rank-2.txt"]), stacks["rank-2.txt"]
    assert "synchronize" in stacks["rank-0.txt"] or "allreduce" in stacks["rank-0.txt"], stacks["rank-0.txt"]
    assert left_after(lab, "allreduce_loop") == {}


def test_a_launcher_the_image_cannot_run_is_refused_before_anything_runs(lab, cluster, tf_cluster):
    """Which launchers a cluster runs comes from its image's own flavor label, recorded by kit up."""
    for where, launcher, has in ((tf_cluster, "horovod", "TensorFlow, no torch or Horovod"),
                                 (cluster, "tf", "torch and Horovod, no TensorFlow")):
        r = kit(where, lab, "run", "--launcher", launcher, LOOP)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"error: --launcher {launcher}: cluster " in r.stderr and has in r.stderr, r.stderr
        assert r.stderr.count("\n") == 2 and "fix: use --launcher" in r.stderr
        assert "job " not in r.stdout


def listeners(host) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket in the host's network namespace."""
    found = set()
    for line in host.run_in("cat", "/proc/net/tcp", "/proc/net/tcp6").stdout.splitlines():
        cols = line.split()
        if len(cols) > 3 and cols[3] == "0A" and ":" in cols[1]:
            addr, port = cols[1].split(":")
            ip = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)) if len(addr) == 8 else \
                ("::" if set(addr) == {"0"} else addr)
            found.add((ip, int(port, 16)))
    return found


def test_a_jobs_servers_and_sshd_listen_on_the_cluster_address_only(project, lab, cluster):
    """Horovod's rendezvous (no authentication) and every rank's Gloo listen on each host's cluster address,
    the containers' sshd too: nothing of the cluster answers on another interface."""
    proc = start_loop(project, lab)
    try:
        for h in lab.hosts:
            found = listeners(h)
            assert (h.address, 12345) in found, found
            assert not [s for s in found if s[0] in ("0.0.0.0", "::")], (h.name, found)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


@pytest.mark.alone  # compute and links measured against a baseline taken moments before: nothing else may run
def test_the_preflight_names_a_host_whose_link_runs_at_a_tenth_and_exclude_bad_runs_on_the_others(project, lab,
                                                                                                   cluster):
    """Every host's link at 2 Gbit/s, kept as the baseline (`kit bench baseline`); then h3's at a tenth of it: `kit
    run --preflight` measures the ring (each host to the next, at once), then each end of a slow ring link with a
    good host, and names h3 with its figure (and its share of its baseline) within 30 s, and the job does not start;
    with --exclude-bad it runs on the other two (-np 3 becomes 2) and says so. Then every link at a tenth, all alike:
    no host is slower than the others, and each is named against its baseline. (Each host's container runs on 0.6
    of a CPU: the three share this machine's two cores, and a compute figure is each one's share of them.)"""
    h3 = lab.hosts[2]
    baseline = None
    try:
        for h in lab.hosts:  # (this machine's 2 cores among 3 hosts: a figure each, the CPU floor of each container)
            h.docker("update", "--cpu-period", "100000", "--cpu-quota", "60000", "kit-lab")
        lab.shape("2gbit")
        kept = kit(project, lab, "bench", "baseline", "--json")
        assert kept.returncode == 0, kept.stdout[-3000:] + kept.stderr[-3000:]
        baseline = Path(json.loads(kept.stdout)["saved"])
        assert baseline.is_file() and baseline.is_relative_to(lab.env["KIT_HOME"]), baseline
        figures = json.loads(kept.stdout)["hosts"]
        assert sorted(figures) == sorted(h.address for h in lab.hosts), figures
        assert all(1.0 < f["gbits"] <= 2.1 and f["gflops"] > 0 for f in figures.values()), figures
        lab.shape("200mbit", [h3])
        began = time.monotonic()
        r = kit(project, lab, "run", "--preflight", "--np", "3", LOOP, "--", "--seconds", "5")
        took = time.monotonic() - began
        assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
        said = " ".join(r.stdout.split())
        found = re.search(rf"preflight: {re.escape(h3.address)}: its links run at ([\d.]+) Gbit/s \(\S+ -> \S+\), the "
                          r"others' at ([\d.]+); 0\.(\d\d) of its baseline", said)
        assert found and float(found[2]) >= 5 * float(found[1]) and int(found[3]) <= 15, said
        took_said = re.search(r"preflight: 3 hosts in (\d+) s: (\S+) would hold the job back", said)
        assert took_said and int(took_said[1]) <= 30 and took_said[2] == h3.address and took < 60, said
        assert f"error: the preflight names {h3.address}: the job would run at its speed" in " ".join(r.stderr.split())
        assert "--exclude-bad runs it on" in r.stderr and not re.search(r"^kit: job \S+ ", r.stdout, re.M)
        r = kit(project, lab, "run", "--preflight", "--exclude-bad", "--np", "3", LOOP, "--", "--seconds", "1")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        others = ", ".join(h.address for h in lab.hosts[:2])
        assert f"preflight: --exclude-bad: the job runs on {others}, -np 2 (of 3)" in " ".join(r.stdout.split())
        ranks = set(re.findall(r"^\[(\S+) rank \d\] ", r.stdout, re.M))
        assert ranks == {h.address for h in lab.hosts[:2]}, r.stdout[-3000:]
        lab.shape("200mbit")
        r = kit(project, lab, "run", "--preflight", "--exclude-bad", "--np", "3", LOOP, "--", "--seconds", "5")
        said = " ".join(r.stdout.split())
        assert r.returncode == 1 and "others' at" not in said, said
        for h in lab.hosts:
            assert re.search(rf"preflight: {re.escape(h.address)}: its fastest link runs at [\d.]+ Gbit/s, 0\.\d\d of "
                             r"its baseline \([\d.]+ on \d{4}-\d\d-\d\d\)", said), said
        assert "the job would run at their speed" in " ".join(r.stderr.split()), r.stderr
        lab.unshape()  # (links as fast as they come: above the baseline's)
        healthy = kit(project, lab, "run", "--preflight", "--np", "3", LOOP, "--", "--seconds", "1")
        assert healthy.returncode == 0 and "compute and links alike" in healthy.stdout, healthy.stdout[-3000:]
    finally:
        lab.unshape()
        for h in lab.hosts:
            h.docker("update", "--cpu-quota", "-1", "kit-lab", check=False)
        if baseline is not None:  # (the other tests' preflights compare the hosts with each other alone)
            baseline.unlink(missing_ok=True)


def test_a_host_slowed_mid_job_is_named_the_straggler_with_what_its_rank_does(project, lab, cluster):
    """CIFAR on three hosts; after its first epoch each rank gets a CPU quota of 0.6 of a core, and h3's half of it:
    within 3 minutes kit names h3 (rank 2), how much slower its rank is outside collectives, and what it does most of
    its time; `kit jobs` keeps it, and `kit jobs ID --ranks` shows h3 against the others while the job runs.
    (--straggler-window 10s here; 2m by default.)"""
    h3 = lab.hosts[2]
    proc = subprocess.Popen([sys.executable, "-m", "kit", "run", "--np", "3", "--straggler-window", "10s",
                             str(REPO / "examples" / "cifar10_cnn_horovod.py"), "--", "--epochs", "400", "--samples",
                             "1536"], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**__import__("os").environ, **lab.env, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1"},
                            text=True)
    try:
        seen = read_until(proc, lambda seen: any("] epoch 1: loss" in line for line in seen), 300)
        for h in lab.hosts:  # (each rank's process on a host; a quota of its own host's, h3's half the others')
            throttle(h, "cifar10_cnn_horovod", 0.3 if h is h3 else 0.6)
        slowed = time.monotonic()
        seen += read_until(proc, lambda more: any("straggler:" in line for line in more), 180)
        named = time.monotonic() - slowed
        # (two readings 10 s apart while the job runs on, once kit named the host: a reading begun sooner may span the
        # moment the quotas began, and show h3 less slowed than it is)
        ranks = kit(project, lab, "jobs", "--ranks", "--json")
        assert proc.poll() is None, "".join(seen)[-3000:]
        interrupt(proc, 120)  # (Ctrl-C: the job stopped on every host)
    finally:
        release_cpu_groups()
        proc.kill()
    said = [line for line in seen if "straggler:" in line]
    assert len(said) == 1 and named < 180, "".join(seen)[-3000:]
    found = re.search(rf"kit: straggler: host {re.escape(h3.address)} \(rank 2\) ([\d.]+)x slower than the others "
                      r"for \d+ s; its rank (waits for data|computes|waits in collectives) (\d+)% of the time", said[0])
    assert found and float(found[1]) >= 1.5, said
    job = last_job(project, lab)
    assert job["straggler"] == said[0].split("kit: ", 1)[1].strip(), job
    rows = {row["rank"]: row for row in map(json.loads, ranks.stdout.splitlines())}
    assert ranks.returncode == 0 and sorted(rows) == [0, 1, 2], ranks.stdout + ranks.stderr
    assert rows[2]["host"] == h3.address and rows[2]["vs_others"] >= 1.5 > rows[0]["vs_others"], rows
    assert all(row["step"] > 0 and row["steps_per_s"] > 0 for row in rows.values()), rows
    assert left_after(lab, "cifar10_cnn_horovod") == {}
