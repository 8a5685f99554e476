"""How things are named on kit's command line: jobs (a prefix, the 4-hex tail, `last`), clusters that are not
recorded, commands in workflow order with readable metavars, shell completion, `prepare --dry-run`, `logs --tail`."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from helpers import run_kit
from kit.backends.cluster import control as jobcontrol
from kit.jobs import model
from kit.cluster import state as st
from kit.app import app
from kit.cli import cluster as cli_cluster
from kit.cli.common import WORKFLOW, KitGroup
from kit.cli.backends.cluster import _LogLines
from kit.config.settings import ClusterConfig
from kit.errors import BadInput

IDS = ["20261122-005727-b862", "20261122-010002-0c1d", "20261123-094501-b862", "20261123-101500-77aa"]


def test_a_job_is_named_by_its_id_a_unique_start_its_tail_or_last():
    assert [model.resolve_job(ref, IDS, "lab") for ref in (
        "20261122-010002-0c1d", "20261122-01", "0c1d", "20261123-10", "20261123-1", "77aa", "last")] == [
        IDS[1], IDS[1], IDS[1], IDS[3], IDS[3], IDS[3], IDS[3]]
    assert model.resolve_job("last", list(reversed(IDS)), "lab") == IDS[3]  # the newest, whatever the order


@pytest.mark.parametrize("ref, said", [
    ("20261122", "job 20261122 is ambiguous on cluster lab: it fits 20261122-005727-b862, 20261122-010002-0c1d"),
    ("b862", "job b862 is ambiguous on cluster lab: it fits 20261122-005727-b862, 20261123-094501-b862"),
    ("ffff", "no job ffff on cluster lab"),
    ("20261124", "no job 20261124 on cluster lab"),
])
def test_a_name_that_fits_no_job_or_several_is_refused(ref, said):
    with pytest.raises(BadInput) as e:
        model.resolve_job(ref, IDS, "lab")
    assert (str(e.value), e.value.exit_code) == (said, 2)
    assert ("give more of the id" if "ambiguous" in said else "`kit jobs` lists them") in e.value.hint
    if ref == "b862":  # the last 4 characters were given: the fix names the start of one, not them again
        assert e.value.hint == "give more of the id: its start, e.g. 20261123-094501-b862"


def test_a_job_name_is_checked_before_any_host_is_asked():
    for bad in ("../../etc", "20261123-194512-ab12/..", "x", "", "LAST", "2026 1"):
        with pytest.raises(BadInput, match="is not a job id"):
            model.check_job_ref(bad)
    with pytest.raises(BadInput, match="no jobs on cluster lab yet"):
        model.resolve_job("last", [], "lab")


def record(home: Path, name: str, hosts: int, local: bool = False) -> None:
    place = ClusterConfig(name=name).host_place()
    st.save(home / name, st.ClusterState(name, "img:cpu", "sha256:0", 12345, "/ws", [
        st.HostState(f"h{i}", f"192.0.2.{i + 1}", place, primary=i == 0, local=local) for i in range(hosts)]))


def kit(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    return run_kit(*args, cwd=cwd, env={"KIT_HOME": str(home), "DOCKER_HOST": "unix:///nonexistent/kit-test.sock"})


def test_a_cluster_that_is_not_recorded_lists_those_that_are(in_tmp):
    home = in_tmp / "home"
    r = kit("jobs", home=home, cwd=in_tmp)
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        f"error: no cluster kit is recorded here: {home} holds none", "fix: bring one up: kit up --hosts hosts.txt"])
    record(home, "alice", 3)
    record(home, "demo", 3, local=True)
    (home / "broken").mkdir()
    (home / "broken" / "state.json").write_text("{not json")
    for command in (["jobs"], ["logs", "last"], ["stop", "b862"], ["status"], ["exec", "h1", "true"], ["run", "t.py"]):
        (in_tmp / "t.py").write_text("")
        r = kit(*command, home=home, cwd=in_tmp)
        assert (r.returncode, r.stderr.splitlines()) == (2, [
            "error: no cluster kit is recorded here; recorded: alice (3 hosts), demo (local)",
            "fix: name it: --name alice (or another of those), or cluster.name: alice in kit.yaml"]), command
    r = kit("down", home=home, cwd=in_tmp)
    assert r.returncode == 0 and "; recorded: alice (3 hosts), demo (local)" in r.stdout


def test_doctor_without_a_cluster_says_how_to_check_hosts_first(in_tmp):
    r = kit("doctor", "--name", "nosuch", home=in_tmp / "home", cwd=in_tmp)
    assert r.returncode == 2 and r.stderr.splitlines()[1] == \
        "fix: check hosts before bringing them up: kit doctor --hosts hosts.txt"


def help_of(*argv: str) -> str:
    r = CliRunner().invoke(app, [*argv, "--help"], prog_name="kit", terminal_width=200)
    assert r.exit_code == 0, r.output
    return r.output


def test_help_lists_the_commands_in_workflow_order():
    listed = re.findall(r"^  (\w+)  ", help_of().split("Commands:")[1], re.M)
    assert listed == [n for n in WORKFLOW if n in listed] and listed[:5] == ["prepare", "build", "up", "status", "run"]
    assert listed[-3:] == ["bench", "down", "demo"]


def test_a_command_the_order_does_not_name_comes_last_and_a_missing_one_is_skipped():
    group = KitGroup(name="kit", commands={n: typer.main.get_command(app).commands[n] for n in ("demo", "up")})
    group.add_command(typer.main.get_command(app).commands["jobs"], "zzz")
    assert group.list_commands(None) == ["up", "demo", "zzz"]


def all_commands():
    def walk(command, path):
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])
    return list(walk(typer.main.get_command(app), []))


@pytest.mark.parametrize("path", all_commands(), ids=lambda p: " ".join(p) or "kit")
def test_every_help_says_what_each_value_is(path):
    text = help_of(*path)
    assert not re.search(r"<(?:str|int|float|bool|path|list|file|dir)|\{[a-z_]+\}|\b(?:TEXT|INTEGER|FLOAT|"
                         r"FILENAME|DIRECTORY)\b", text), text


def test_usage_lines_name_their_arguments():
    assert "Usage: kit run [OPTIONS] SCRIPT [ARGS]..." in help_of("run")
    assert "Usage: kit logs [OPTIONS] [JOB]" in help_of("logs") and "-n, --tail N" in help_of("logs")
    assert "Usage: kit stop [OPTIONS] JOB" in help_of("stop")
    assert "--hosts HOSTS_FILE" in help_of("up") and "-e, --env NAME[=VALUE]" in help_of("run")
    assert "-np, -n, --np, --num-proc N" in help_of("run") and "-H, --hosts HOST[:SLOTS],..." in help_of("run")


def test_kit_help_lists_every_command_in_a_whole_line():
    """kit --help's command list in an 80-column terminal: no line cut short ("..."), and export's names what it
    writes."""
    r = CliRunner().invoke(app, ["--help"], prog_name="kit", terminal_width=80)
    listed = r.output.split("Commands:\n", 1)[1].splitlines()
    assert len(listed) == len(WORKFLOW) and not [line for line in listed if line.endswith("...")], listed
    assert any(line.split()[0] == "export" and "sbatch" in line and "Kubernetes" in line for line in listed)


@pytest.mark.parametrize("words, offered", [
    ("kit run --launcher ", ["horovod", "torchrun", "tf"]),
    ("kit run --on ", ["cluster", "slurm", "k8s"]),
    ("kit run --kind j", ["jobset"]),
    ("kit export --launcher t", ["torchrun", "tf"]),
    ("kit export --kind ", ["indexed-job", "jobset", "pytorchjob", "tfjob", "mpijob", "trainjob"]),
    ("kit build --flavor tf", ["tf", "tf-cpu", "tf-gpu"]),
    ("kit bench allreduce --backend ", ["horovod", "torch", "all"]),
])
def test_every_option_of_a_few_values_completes_them(in_tmp, words, offered):
    r = run_kit(cwd=in_tmp, env={"_KIT_COMPLETE": "complete_bash", "COMP_WORDS": words,
                                 "COMP_CWORD": str(len(words.split()) - (not words.endswith(" ")))})
    assert r.stdout.split() == offered, r.stdout + r.stderr


def test_shell_completion_is_on(in_tmp):
    assert "--install-completion" in help_of()
    r = run_kit("--show-completion", "bash", cwd=in_tmp, env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert r.returncode == 0 and "_KIT_COMPLETE=complete_bash" in r.stdout, r.stdout + r.stderr
    r = run_kit(cwd=in_tmp, env={"_KIT_COMPLETE": "complete_bash", "COMP_WORDS": "kit lo", "COMP_CWORD": "1"})
    assert r.stdout.split() == ["logs"]
    r = run_kit(cwd=in_tmp, env={"_KIT_COMPLETE": "complete_bash", "COMP_WORDS": "kit run --hang", "COMP_CWORD": "2"})
    assert r.stdout.split() == ["--hang-timeout"]


@pytest.mark.parametrize("flag", ["--dry-run", "--check"])
def test_prepare_dry_run_is_ansibles_check_mode(in_tmp, monkeypatch, flag):
    (in_tmp / "hosts.txt").write_text("192.0.2.1\n")
    ran = []
    monkeypatch.setattr(cli_cluster, "reach_all", lambda inventory, timeout: None)  # (192.0.2.1 is not contacted)
    monkeypatch.setattr(cli_cluster, "run_playbook", lambda argv, env: ran.append(argv) or 0)
    r = CliRunner().invoke(app, ["prepare", "--hosts", "hosts.txt", flag], prog_name="kit")
    assert r.exit_code == 0, r.output
    assert ran[0][1] == "-i" and ran[0][3:5] == ["--check", "--diff"]
    assert "check mode: nothing was changed" in r.output
    assert "--check" not in help_of("prepare")  # the former name, kept but not shown


@pytest.mark.parametrize("hosts, kit_yaml, recorded, says", [
    ("alice@10.0.0.1\n10.0.0.2\n", None, "alice@10.0.0.1", "slurm.login is now alice@10.0.0.1, the primary"),
    ("10.0.0.1\nlocalhost primary\n", "cluster:\n  name: lab\n", "localhost",
     "slurm.login is now localhost, the primary"),
    ("10.0.0.1\n", "slurm:\n  login: bob@login.example\n", "bob@login.example", None),  # the user's own: kept
    ("10.0.0.1 port=2222\n", None, None, "add `slurm: {login: ALIAS}` to ./kit.yaml, ALIAS a Host of your "
                                          "~/.ssh/config with HostName 10.0.0.1 and Port 2222"),
])
def test_prepare_slurm_records_the_primary_as_the_login_host_kit_submits_from(in_tmp, monkeypatch, hosts, kit_yaml,
                                                                              recorded, says):
    """After kit prepare --slurm, README's next steps (kit export --to venv, kit run --on slurm) go to the primary,
    where slurmctld runs, with no kit.yaml line to write first; a login kit.yaml names is kept; --dry-run writes none."""
    from kit.config.settings import read_config
    (in_tmp / "hosts.txt").write_text(hosts)
    if kit_yaml:
        (in_tmp / "kit.yaml").write_text(kit_yaml)
    monkeypatch.setattr(cli_cluster, "reach_all", lambda inventory, timeout: None)  # (not contacted)
    monkeypatch.setattr(cli_cluster, "run_playbook", lambda argv, env: 0)
    r = CliRunner().invoke(app, ["prepare", "--hosts", "hosts.txt", "--slurm", "--dry-run"], prog_name="kit")
    assert r.exit_code == 0 and (in_tmp / "kit.yaml").exists() == bool(kit_yaml), r.output
    r = CliRunner().invoke(app, ["prepare", "--hosts", "hosts.txt", "--slurm"], prog_name="kit")
    assert r.exit_code == 0, r.output
    assert (says in " ".join(r.output.split())) if says else "slurm.login" not in r.output, r.output
    login = (read_config(in_tmp / "kit.yaml").sections.get("slurm") or {}).get("login") \
        if (in_tmp / "kit.yaml").exists() else None
    assert login == recorded
    if kit_yaml:
        assert (in_tmp / "kit.yaml").read_text().startswith(kit_yaml)  # no other line changed


def test_prepare_names_each_host_it_cannot_reach_in_a_line_and_starts_no_ansible(in_tmp):
    """Two hosts whose SSH port is closed (loopback): one line each, with the fix, as kit up says it; Ansible's
    own output (its play, UNREACHABLE! and recap) is not shown, as it is not run."""
    from helpers import closed_port
    ports = closed_port(), closed_port()
    while ports[1] == ports[0]:
        ports = ports[0], closed_port()
    (in_tmp / "hosts.txt").write_text("".join(f"127.0.0.1 port={p}\n" for p in ports))
    r = run_kit("prepare", "--hosts", "hosts.txt", cwd=in_tmp, env={"KIT_HOME": str(in_tmp / "kit")})
    assert r.returncode == 1 and "ansible" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"error: connecting failed on 2 hosts: 127.0.0.1:{ports[0]}, 127.0.0.1:{ports[1]}",
        *[f"  127.0.0.1:{p}: cannot connect to SSH port {p} ([Errno None] Unable to connect to port {p} on "
          "127.0.0.1)" for p in ports],
        "fix: check the name or address in hosts.txt (and its HostName and Port in your ~/.ssh/config) and that sshd "
        "runs there"]


def test_logs_tail_shows_the_last_lines_as_kit_logs_shows_them():
    shown = []
    lines = _LogLines(lambda rank, host, text: shown.append((rank, host, text)), [], None, 2)
    for line in ("kit: job j1: t.py; 2 processes on 2 hosts", "@@kit-ranks h1 h2", "[0]<stdout>:one",
                 "[1]<stdout>:two", "[1]<stdout>:@@kit-exit 0 1.5", "[0]<stdout>:three", f"{jobcontrol.END_MARK} 0"):
        lines.add(line)
    assert shown == []
    lines.flush()
    assert shown == [(1, "h2", "two"), (0, "h1", "three")]
    lines.add("[1]<stdout>:four")  # then, following, as they come
    assert shown[-1] == (1, "h2", "four")
    one_rank = _LogLines(lambda rank, host, text: shown.append(text), ["h1", "h2"], 0, 1)
    for line in ("[0]<stdout>:a", "[0]<stdout>:b", "[1]<stdout>:c"):
        one_rank.add(line)
    one_rank.flush()
    assert shown[-1] == "b"


def test_following_from_a_line_skips_what_was_shown(tmp_path):
    """follow_command's shell, run here on an ended job's folder (as the primary's container runs it)."""
    folder = tmp_path / "j1"
    folder.mkdir()
    (folder / "output.log").write_text("".join(f"line {i}\n" for i in range(1, 6)))
    (folder / "exit").write_text("0\n")
    script = shlex.split(jobcontrol.follow_command("kit-lab", str(folder), "20261122-005727-b862", first=4))[-1]
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert out == ["line 4", "line 5", f"{jobcontrol.END_MARK} 0"]


def test_the_entry_point_knows_the_module_of_every_command():
    """kit.main imports only the module of the command asked for: it must know each one's."""
    from kit.main import MODULES
    found = {c.name or c.callback.__name__: c.callback.__module__ for c in app.registered_commands}
    found.update({g.name: g.typer_instance.registered_commands[0].callback.__module__ for g in app.registered_groups})
    assert {name: f"kit.cli.{module}" for name, module in MODULES.items()} == found


def test_a_command_run_by_the_entry_point_alone_works_and_anything_else_gets_every_command(in_tmp):
    for argv, says in ((["run", "--help"], "Usage: kit run"), (["--help"], "prepare"), (["rnu"], "No such command")):
        r = run_kit(*argv, cwd=in_tmp)
        assert says in r.stdout + r.stderr, (argv, r.stdout, r.stderr)
