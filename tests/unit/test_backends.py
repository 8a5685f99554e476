"""One job model, three back ends: each back end declares the options of `kit run` it takes, one check refuses the
others in the same words, and the job commands reach a back end only through the table (kit.cli.backends)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from helpers import REPO
from kit.app import app
from kit.cli import backends
from kit.errors import BadInput
from kit.jobs.model import COMMON, Job

RUN = typer.main.get_command(app).commands["run"]
PARAMS = {p.name: p for p in RUN.params}
CLI = REPO / "cli" / "kit" / "cli"

# A value each of kit run's own options takes (a flag: no value).
VALUES = {"launcher": "torchrun", "np": "2", "hosts": "a:1", "nproc_per_node": "2", "workdir": ".",
          "fusion_threshold_mb": "64", "cycle_time_ms": "5", "fp16_allreduce": None, "timeline": "t.json",
          "verbose_horovod": None, "start_timeout": "90", "env": "A=1", "env_file": "vars.env", "detach": None,
          "restarts": "1", "min_np": "1", "hang_timeout": "60s", "on": None, "nodes": "2", "ntasks_per_node": "2",
          "gpus_per_node": "1", "kind": "jobset", "namespace": "ml", "image": "registry.lab:5000/kit:1",
          "workspace_pvc": "data", "image_pull_secret": "pull", "cpus": "4", "memory": "8Gi", "partition": "gpu",
          "account": "lab", "cpus_per_task": "4", "mem": "64G", "mem_per_gpu": "16G", "time_limit": "2:00:00",
          "config": "kit.yaml", "name": "lab", "preflight": None, "exclude_bad": None, "straggler_window": "30s"}
OWN = sorted(n for n in PARAMS if n not in ("script", "args", "on"))


@pytest.fixture
def handed(monkeypatch, tmp_path):
    """What each back end's run() is handed, instead of running it."""
    got = {}
    for b in backends.BACKENDS.values():
        monkeypatch.setattr(b, "run", lambda job, b=b: got.update(on=b.name, job=job))
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "vars.env").write_text("A=1\n")
    (tmp_path / "kit.yaml").write_text("cluster:\n  name: lab\n")
    monkeypatch.chdir(tmp_path)
    return got


def argv_of(name: str) -> list[str]:
    flag = PARAMS[name].opts[0]
    return [flag] if VALUES[name] is None else [flag, VALUES[name]]


def test_every_option_of_kit_run_is_taken_by_some_back_end_and_has_a_value_here():
    assert set(OWN) <= set(VALUES)
    assert set().union(*(b.options for b in backends.BACKENDS.values())) >= set(PARAMS) - {"on"}
    assert all(COMMON <= b.options for b in backends.BACKENDS.values())


@pytest.mark.parametrize("on", list(backends.BACKENDS))
@pytest.mark.parametrize("option", OWN)
def test_a_back_end_takes_the_options_it_declares_and_refuses_the_others_in_the_same_words(handed, on, option):
    b = backends.BACKENDS[on]
    r = CliRunner().invoke(app, ["run", "--on", on, *argv_of(option), "train.py"], prog_name="kit")
    if option in b.options:
        assert r.exit_code == 0 and handed["on"] == on, r.output
        job: Job = handed["job"]
        field = {"env_file": "env_files"}.get(option, option)
        policy = ("restarts", "min_np", "hang_timeout", "straggler_window")
        value = getattr(job.policy, option) if option in policy else \
            getattr(job, field) if field in Job.__dataclass_fields__ else job.option(option)
        assert value not in (None, False, (), PARAMS[option].default), (option, value)
        return
    flag = PARAMS[option].opts[0]
    takers = [n for n, other in backends.BACKENDS.items() if option in other.options]
    assert r.exit_code == 2 and "job" not in handed, r.output
    assert r.output.splitlines() == [
        f"error: {flag}: not for --on {on} ({b.title})",
        f"fix: add --on {' or --on '.join(takers)}, or drop it (on {b.title}, {b.placement})"]


def test_several_options_a_back_end_does_not_take_are_named_together(handed):
    r = CliRunner().invoke(app, ["run", "--on", "slurm", "-H", "a:1", "--kind", "jobset", "train.py"],
                           prog_name="kit")
    assert r.exit_code == 2 and "job" not in handed
    assert r.output.splitlines()[0] == "error: -H, --kind: not for --on slurm (Slurm)"
    assert r.output.splitlines()[1].startswith("fix: drop them (on Slurm, ")


@pytest.mark.parametrize("on", list(backends.BACKENDS))
def test_a_back_end_reads_exactly_the_options_of_its_own_it_declares(on):
    """Declared is read: a back end reads each option of its own it declares (job.option), and none it does not
    (which Job.option would not have: KeyError)."""
    b = backends.BACKENDS[on]
    source = Path(__import__(type(b).__module__, fromlist=["_"]).__file__).read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == type(b).__name__)
    read = {c.args[0].value for c in ast.walk(cls) if isinstance(c, ast.Call) and c.args
            and isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)
            and (isinstance(c.func, ast.Attribute) and c.func.attr == "option" or
                 isinstance(c.func, ast.Name) and c.func.id == "o")}
    from kit.cli.jobs import JOB_FIELDS
    assert read == set(b.options) - COMMON - JOB_FIELDS
    with pytest.raises(KeyError):
        Job(Path("t.py"), options={}).option("partition")


def test_a_job_command_on_a_back_end_without_it_is_refused_in_the_same_words():
    slurm = backends.BACKENDS["slurm"]
    with pytest.raises(BadInput) as e:
        backends.needs(slurm, "stacks", "20261129-080000-abcd")
    assert str(e.value) == "kit stacks: job 20261129-080000-abcd runs on Slurm, where kit has no stacks"
    backends.needs(backends.BACKENDS["cluster"], "stacks", "x")


# Commands of one back end by nature: `kit export --to slurm|k8s` writes that scheduler's artefacts; `kit bench` and
# `kit demo` measure and show kit's own cluster.
ONE_BACK_END = {"export.py", "bench.py", "demo.py"}
NAMES = set(backends.BACKENDS)


JOB_COMMANDS = {"jobs.py", "joblogs.py", "joblist.py"}  # kit run, jobs, logs, stop, attach, stacks


def _names_a_back_end(path: Path) -> list[str]:
    """Its imports of a back end's modules; in a job command's module, a comparison with a back end's name too
    (elsewhere "slurm" and "cluster" are also kit.yaml's sections)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module == "kit.cli.backends":
            modules += [f"kit.cli.backends.{a.name}" for a in node.names]
        for m in modules:
            if re.match(r"kit\.(cli\.)?backends\.", m):
                found.append(f"imports {m}")
        if isinstance(node, ast.Compare) and path.name in JOB_COMMANDS:
            constants = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
            found += [f"compares with {c!r}" for c in constants if c in NAMES]
    return found


def test_no_cli_module_names_a_back_end_outside_the_table(tmp_path):
    named = {p.name: found for p in sorted(CLI.glob("*.py")) if p.name not in ONE_BACK_END
             if (found := _names_a_back_end(p))}
    assert named == {}
    (tmp_path / "jobs.py").write_text('if on == "slurm":\n    from kit.cli.backends import k8s\n')
    assert _names_a_back_end(tmp_path / "jobs.py") == ["compares with 'slurm'", "imports kit.cli.backends.k8s"]



def test_the_cluster_is_asked_last_and_listed_last():
    """Its jobs are read from its primary, so it takes any reference the schedulers' records do not know; `kit jobs`
    lists its table after theirs (a script that reads the last line of `kit jobs --json` gets the cluster's newest)."""
    assert [b.name for b in backends.in_turn()][-1] == "cluster"
    assert list(backends.BACKENDS) == ["cluster", "slurm", "k8s"]  # as --on offers them


def test_the_ranks_pace_is_for_the_back_ends_that_read_heartbeats_and_named_only_with_ranks(tmp_path, monkeypatch):
    """kit jobs ID --ranks on the cluster and Slurm; Kubernetes has none (its pods watch their own ranks), refused
    in the words of every job command a back end lacks; a job named without --ranks, and --ranks on kit logs without
    -f, are refused before anything is read."""
    assert "ranks" in backends.BACKENDS["cluster"].commands and "ranks" in backends.BACKENDS["slurm"].commands
    with pytest.raises(BadInput) as e:
        backends.needs(backends.BACKENDS["k8s"], "ranks", "20261129-080000-abcd")
    assert str(e.value).startswith("kit jobs --ranks: job 20261129-080000-abcd runs on Kubernetes, where kit has no "
                                   "ranks' pace")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["jobs", "20261129-080000-abcd"], prog_name="kit")
    assert r.exit_code == 2 and "a job is named only with --ranks" in r.output, r.output
    r = CliRunner().invoke(app, ["logs", "last", "--ranks", "60"], prog_name="kit")
    assert r.exit_code == 2 and "give -f with it" in r.output, r.output
    r = CliRunner().invoke(app, ["logs", "last", "-f", "--ranks", "5"], prog_name="kit")
    assert r.exit_code == 2 and "--ranks: 5 s is not from 20 s to a day" in r.output, r.output
