"""`kit run`'s command line on three lab hosts, one cluster: a script's arguments without --, -np and -H as
horovodrun spells them (the job on exactly the hosts -H names, horovodrun and torchrun), and jobs named by their
4-hex tail or `last`."""

import json
import re

import pytest

from harness import kit, lab_cluster
from helpers import REPO

pytestmark = pytest.mark.lab
WORKSPACE = "/var/lib/kit/lab/workspace"
ARGS = """\
import json, socket, sys
print("args " + json.dumps(sys.argv[1:]) + " on " + socket.gethostname(), flush=True)
"""


@pytest.fixture(scope="module")
def cluster(project, lab):
    with lab_cluster(lab, project, "lab", "--hosts", "hosts.txt"):
        yield project


@pytest.fixture(scope="module")
def args_job(tmp_path_factory):
    """A job that prints what its script was given, and on which host."""
    script = tmp_path_factory.mktemp("args-job") / "args.py"
    script.write_text(ARGS)
    return script


def printed_args(out: str) -> list[tuple[str, str, list[str], str]]:
    """(host of the rank's prefix, rank, the script's arguments, the hostname it ran on), by rank."""
    found = re.findall(r"^\[(\S+) rank (\d+)\] args (\[.*\]) on (\S+)$", out, re.M)
    return sorted(((host, rank, json.loads(args), hostname) for host, rank, args, hostname in found),
                  key=lambda row: int(row[1]))


def test_h_runs_the_job_on_exactly_the_hosts_it_names(project, lab, cluster):
    h1, h2, h3 = lab.hosts
    r = kit(project, lab, "run", str(REPO / "examples" / "cifar10_cnn_horovod.py"), "--epochs", "1", "--samples",
            "512", "-np", "2", "-H", f"{h1.address}:1,{h3.address}:1")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert re.fullmatch(rf"kit: job \S+: cifar10_cnn_horovod\.py --epochs 1 --samples 512; 2 processes on 2 hosts "
                        rf"\({h1.address}, {h3.address}\); copied \d+ changed files of \S+", r.stdout.splitlines()[0])
    starts = re.findall(r"^\[(\S+) rank (\d)\] rank \2/2 \(local 0\) on (\S+) \((\S+)\)", r.stdout, re.M)
    assert sorted((rank, prefix, host, hostname) for prefix, rank, host, hostname in starts) == \
           [("0", h1.address, h1.address, h1.name), ("1", h3.address, h3.address, h3.name)]
    assert f"[{h2.address} rank" not in r.stdout and re.search(r"✓ job \S+ finished", r.stdout)
    (row,) = [json.loads(line) for line in kit(project, lab, "jobs", "--json").stdout.splitlines()]
    assert (row["np"], row["hosts"], row["state"]) == (2, sorted([h1.address, h3.address]), "succeeded")
    # nothing of the job reached h2: not its files, not what its ranks wrote
    script = f"{WORKSPACE}/cifar10_cnn_horovod.py"
    assert [h.run_in("test", "-e", script, check=False).returncode for h in lab.hosts] == [0, 1, 0]
    assert h2.run_in("test", "-e", f"{WORKSPACE}/checkpoints", check=False).returncode == 1


def test_a_scripts_arguments_need_no_double_dash(project, lab, cluster, args_job):
    r = kit(project, lab, "run", str(args_job), "--epochs", "2")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert r.stdout.startswith("kit: job ") and ": args.py --epochs 2; 3 processes on 3 hosts (" in r.stdout
    assert printed_args(r.stdout) == [(h.address, str(i), ["--epochs", "2"], h.name) for i, h in enumerate(lab.hosts)]


def test_options_that_pick_the_cluster_and_everything_after_a_double_dash_are_the_scripts(project, lab, cluster,
                                                                                           args_job):
    h1 = lab.hosts[0]
    r = kit(project, lab, "run", str(args_job), "--config", "cfg.yaml", "--name", "run-1", "-np", "1", "--", "--np",
            "5")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert ": args.py --config cfg.yaml --name run-1 --np 5; 1 process on 1 host (" in r.stdout.splitlines()[0]
    assert printed_args(r.stdout) == [(h1.address, "0", ["--config", "cfg.yaml", "--name", "run-1", "--np", "5"],
                                       h1.name)]


def test_a_torchrun_job_on_hosts_without_the_primary(project, lab, cluster, args_job):
    """-H leaves out the primary, where the job's supervisor runs: node 0 (h2) holds torchrun's store."""
    h1, h2, h3 = lab.hosts
    r = kit(project, lab, "run", "--launcher", "torchrun", str(args_job), "-H", f"{h2.address}:1,{h3.address}:2",
            "--lr", "0.1")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert printed_args(r.stdout) == [(h2.address, "0", ["--lr", "0.1"], h2.name),
                                      (h3.address, "1", ["--lr", "0.1"], h3.name),
                                      (h3.address, "2", ["--lr", "0.1"], h3.name)]
    assert f"[{h1.address} rank" not in r.stdout


def test_jobs_are_named_by_their_tail_a_start_or_last(project, lab, cluster):
    ids = sorted(json.loads(line)["id"] for line in kit(project, lab, "jobs", "--json").stdout.splitlines())
    assert len(ids) >= 2
    whole = kit(project, lab, "logs", ids[-1][-4:])
    assert whole.returncode == 0 and "args [" in whole.stdout, whole.stderr
    tail = kit(project, lab, "logs", "last", "--tail", "2")
    assert tail.returncode == 0 and tail.stdout.splitlines() == whole.stdout.splitlines()[-2:], tail.stdout
    ambiguous = kit(project, lab, "logs", ids[0][:2])
    assert ambiguous.returncode == 2 and ambiguous.stderr.startswith(f"error: job {ids[0][:2]} is ambiguous on "
                                                                     f"cluster lab: it fits {ids[0]}, {ids[1]}")
