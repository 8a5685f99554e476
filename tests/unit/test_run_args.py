"""`kit run [OPTIONS] SCRIPT [ARGS]...`: which arguments are kit's and which the script's, -np and -H as horovodrun
spells them, and what a job on some of the cluster's hosts launches. tests/lab/test_run_args.py runs them."""

import contextlib
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from kit.backends.cluster import run as jobs
from kit.cluster import state as st
from kit.app import app
from kit.cli.backends import cluster as cli_jobs
from kit.cli.runargs import options_of, split
from kit.jobs.commands.horovod import HorovodOptions, check_np, parse_hosts, pick_hosts
from kit.config.settings import ClusterConfig
from kit.errors import BadInput
from kit.network.choose import Member
from kit.network.measure import rank_env as route_env, route
from kit.backends.cluster.supervisor.launch import MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, Slot

RUN = typer.main.get_command(app).commands["run"]
OPTIONS = options_of(RUN.get_params(RUN.context_class(RUN)))
SLOTS = [Slot("a", "10.0.0.1", 2), Slot("b", "10.0.0.2", 2), Slot("c", "10.0.0.3", 2)]


@pytest.mark.parametrize("argv, kit, script, args", [
    (["train.py", "--epochs", "2"], [], "train.py", ["--epochs", "2"]),
    (["-np", "3", "train.py", "--epochs", "2"], ["-np", "3"], "train.py", ["--epochs", "2"]),
    (["train.py", "--epochs", "1", "-np", "2", "-H", "a:1,c:1"], ["-np", "2", "-H", "a:1,c:1"], "train.py",
     ["--epochs", "1"]),
    (["train.py", "--config", "cfg.yaml"], [], "train.py", ["--config", "cfg.yaml"]),
    (["-c", "kit.yaml", "--name", "lab", "train.py", "-c", "x", "--name", "run-1", "--workdir", "w", "--help"],
     ["-c", "kit.yaml", "--name", "lab"], "train.py", ["-c", "x", "--name", "run-1", "--workdir", "w", "--help"]),
    (["train.py", "--name=run-1", "--np=2"], ["--np=2"], "train.py", ["--name=run-1"]),
    (["train.py", "--", "--np", "5", "--", "-d"], [], "train.py", ["--np", "5", "--", "-d"]),
    (["--np", "2", "--", "-odd.py", "--np", "4"], ["--np", "2"], "-odd.py", ["--np", "4"]),
    (["-d", "-eA=1", "--env", "B", "--launcher", "torchrun", "train.py", "--lr", "-1", "-e", "C=2", "--detach"],
     ["-d", "-eA=1", "--env", "B", "--launcher", "torchrun", "-e", "C=2", "--detach"], "train.py", ["--lr", "-1"]),
    (["train.py", "-d", "/data", "--epochs", "2"], [], "train.py", ["-d", "/data", "--epochs", "2"]),
    (["--cycle-time-ms", "-2", "train.py", "-", "--hosts", "b"], ["--cycle-time-ms", "-2", "--hosts", "b"], "train.py",
     ["-"]),
    (["--np", "2"], ["--np", "2"], None, []),
    (["-np=4", "train.py", "-np=2"], ["-np=4", "-np=2"], "train.py", []),
    (["-n", "4", "train.py", "-n", "10"], ["-n", "4"], "train.py", ["-n", "10"]),
    (["--num-proc", "4", "train.py", "--num-proc=2", "-eA=1"], ["--num-proc", "4", "--num-proc=2"], "train.py",
     ["-eA=1"]),
])
def test_kit_takes_its_options_and_the_script_the_rest(argv, kit, script, args):
    found = split(argv, OPTIONS)
    assert (found.kit, found.script, found.args) == (kit, script, args)


def test_what_click_reads_puts_the_script_and_its_arguments_after_a_double_dash():
    assert split(["train.py", "--epochs", "2", "-np", "3"], OPTIONS).argv() == \
           ["-np", "3", "--", "train.py", "--epochs", "2"]
    assert split(["-np", "3"], OPTIONS).argv() == ["-np", "3"]


def test_an_unknown_option_before_the_script_is_refused_saying_where_script_arguments_go():
    with pytest.raises(BadInput, match=r"^--bogus is not an option of kit run; before the script, only kit's") as e:
        split(["--bogus", "train.py"], OPTIONS)
    assert e.value.hint == "put the script's arguments after it: kit run [OPTIONS] train.py --bogus ..."


@pytest.fixture
def seen(monkeypatch, tmp_path):
    """kit run as a user calls it, up to the job: what run_job would be given (and the --config/--name kit read)."""
    got = {}
    state = st.ClusterState("lab", "img:cpu", "sha256:0", 12345, "/ws", [
        st.HostState("a", "10.0.0.1", ClusterConfig().host_place(), primary=True)])

    @contextlib.contextmanager
    def locked(name, config):
        got.update(name=name, config=config)
        yield ClusterConfig(), None, state

    def run_job(cfg, state, script, args, np, workdir, options, env, on_line, launcher, nproc, detach, policy,
                hosts=None, secrets=()):
        got.update(script=str(script), args=args, np=np, workdir=workdir, hosts=hosts, detach=detach,
                   launcher=launcher)
    monkeypatch.setattr(cli_jobs, "locked", locked)
    monkeypatch.setattr(cli_jobs, "run_job", run_job)
    monkeypatch.chdir(tmp_path)
    return got


def kit_run(*argv: str):
    return CliRunner().invoke(app, ["run", *argv], prog_name="kit")


def test_kit_run_hands_the_script_its_arguments(seen):
    r = kit_run("train.py", "--epochs", "2")
    assert r.exit_code == 0, r.output
    assert (seen["script"], seen["args"], seen["np"], seen["hosts"]) == ("train.py", ["--epochs", "2"], None, None)


def test_np_and_h_as_horovodrun_spells_them_before_or_after_the_script(seen):
    assert kit_run("-np", "3", "train.py", "--epochs", "2").exit_code == 0
    assert (seen["np"], seen["args"]) == (3, ["--epochs", "2"])
    assert kit_run("train.py", "--epochs", "1", "-np", "2", "-H", "a:1,c:1").exit_code == 0
    assert (seen["np"], seen["hosts"], seen["args"]) == (2, [("a", 1), ("c", 1)], ["--epochs", "1"])
    assert kit_run("--hosts", "b", "--np", "1", "train.py").exit_code == 0
    assert (seen["np"], seen["hosts"], seen["args"]) == (1, [("b", None)], [])


def test_the_options_that_pick_the_cluster_or_folder_are_the_scripts_after_it(seen):
    assert kit_run("train.py", "--config", "cfg.yaml").exit_code == 0
    assert (seen["args"], seen["config"]) == (["--config", "cfg.yaml"], None)
    assert kit_run("-c", "kit.yaml", "--name", "lab", "train.py", "--name", "run-1", "--workdir", "out").exit_code == 0
    assert (seen["config"], seen["name"], seen["workdir"]) == (Path("kit.yaml"), "lab", None)
    assert seen["args"] == ["--name", "run-1", "--workdir", "out"]


def test_after_a_double_dash_everything_is_the_scripts(seen):
    assert kit_run("train.py", "--detach", "--", "--np", "5", "-H", "x").exit_code == 0
    assert (seen["args"], seen["np"], seen["hosts"], seen["detach"]) == (["--np", "5", "-H", "x"], None, None, True)


def test_a_data_folder_given_as_d_after_the_script_is_the_scripts_and_detaches_nothing(seen):
    assert kit_run("train.py", "-d", "/data").exit_code == 0
    assert (seen["args"], seen["detach"]) == (["-d", "/data"], False)
    assert kit_run("-d", "train.py", "-d", "/data").exit_code == 0
    assert (seen["args"], seen["detach"]) == (["-d", "/data"], True)


def test_np_as_horovodrun_takes_it_np_equals_n_and_num_proc(seen):
    """horovodrun takes -np=4, and -n 4 and --num-proc 4 (argparse's abbreviation and long form): so does kit run,
    but -n after the script is the script's (a count of its own)."""
    for spelling in (["-np=4"], ["-n", "4"], ["--num-proc", "4"], ["--num-proc=4"]):
        r = kit_run(*spelling, "train.py", "--epochs", "2")
        assert r.exit_code == 0, r.output
        assert (seen["np"], seen["args"]) == (4, ["--epochs", "2"])
    assert kit_run("train.py", "-np=3", "-n", "10").exit_code == 0
    assert (seen["np"], seen["args"]) == (3, ["-n", "10"])


@pytest.mark.parametrize("argv, error, fix", [
    (["train.py", "-e", "5"], "-e 5: '5' is not a variable name",
     "use letters, digits and _, not starting with a digit: NAME=VALUE; or, if -e is the script's, give the script's "
     "arguments after --: kit run [OPTIONS] train.py -- -e 5"),
    (["train.py", "--epochs", "2", "--time", "10"], "--time: not for --on cluster (kit's cluster)",
     "add --on slurm, or drop it (on kit's cluster, -np and -H place a job on the cluster's hosts); or, if --time is "
     "the script's, "
     "give the script's arguments after --: kit run [OPTIONS] train.py -- --epochs 2 --time 10"),
    (["train.py", "--nodes", "two"], "--nodes/-N: Input should be a valid integer, unable to parse string as an "
     "integer", "`kit run --help` says what it takes; or, if --nodes is the script's, give the script's arguments "
     "after --: kit run [OPTIONS] train.py -- --nodes two"),
    (["train.py", "--hang-timeout"], "--hang-timeout needs a value",
     "give it one: --hang-timeout VALUE (`kit run --help` says which); or, if --hang-timeout is the script's, give "
     "the script's arguments after --: kit run [OPTIONS] train.py -- --hang-timeout"),
])
def test_an_option_of_kits_after_the_script_that_fails_says_how_to_give_it_to_the_script(seen, argv, error, fix):
    """A script's own -e, --time or --nodes is kit's when it follows the script: where that fails, the fix says how
    to hand it to the script (after --), beside kit's own fix."""
    r = kit_run(*argv)
    assert r.exit_code == 2 and "script" not in seen, r.output
    assert r.output.splitlines() == [f"error: {error}", f"fix: {fix}"]


def test_an_unknown_option_before_the_script_exits_2(seen):
    r = kit_run("--bogus", "train.py")
    assert r.exit_code == 2 and "script" not in seen
    assert "error: --bogus is not an option of kit run; before the script, only kit's options go" in r.output
    assert "fix: put the script's arguments after it: kit run [OPTIONS] train.py --bogus ..." in r.output


def test_a_malformed_h_is_refused_before_the_cluster_is_read(seen):
    r = kit_run("train.py", "-H", "a:two")
    assert r.exit_code == 2 and "config" not in seen
    assert "error: -H: 'a:two' is not host or host:slots (in a:two)" in r.output


def test_h_is_parsed_as_horovodrun_spells_it():
    assert parse_hosts("a:2,10.0.0.3,c:1") == [("a", 2), ("10.0.0.3", None), ("c", 1)]
    for bad, said in (("a:0", "'a:0' is not host or host:slots"), ("a,,b", "'' is not host"),
                      ("a:1:2", "'a:1:2' is not"), ("a;rm -rf /", "is not host"), ("a,a:2", "a is named twice")):
        with pytest.raises(BadInput, match=said):
            parse_hosts(bad)


def test_h_picks_hosts_by_name_or_address_in_its_order_with_their_slots():
    assert pick_hosts([("c", 1), ("10.0.0.1", None)], SLOTS, "lab") == [Slot("c", "10.0.0.3", 1),
                                                                      Slot("a", "10.0.0.1", 2)]
    with pytest.raises(BadInput, match=r"^-H: d is not a host of cluster lab$") as e:
        pick_hosts([("a", 1), ("d", 1)], SLOTS, "lab")
    assert e.value.hint == "use its hosts: a:2, b:2, c:2"
    with pytest.raises(BadInput, match=r"-H: 10.0.0.2 and b are one host"):
        pick_hosts([("b", 1), ("10.0.0.2", 1)], SLOTS, "lab")


def test_np_beyond_the_slots_of_h_is_refused():
    picked = pick_hosts([("a", 1), ("c", 1)], SLOTS, "lab")
    assert check_np(None, picked, "a:1,c:1") == 2 and check_np(2, picked, "a:1,c:1") == 2
    with pytest.raises(BadInput, match=r"^--np: 3 processes, but -H a:1,c:1 gives 2 slots$") as e:
        check_np(3, picked, "a:1,c:1")
    assert e.value.hint == "use --np from 1 to 2, or give hosts more slots in -H (host:slots)"


def test_the_first_job_line_shows_what_the_script_was_given_and_where_it_runs():
    assert cli_jobs.job_line("20261122-005727-b862", ["train.py", "--epochs", "2", "--note", "a b"],
                             ["10.0.0.1", "10.0.0.1", "10.0.0.3"], 4, Path("/p")) == (
        "job 20261122-005727-b862: train.py --epochs 2 --note 'a b'; 3 processes on 2 hosts (10.0.0.1, 10.0.0.3); "
        "copied 4 changed files of /p")
    assert "; 1 process on 1 host (a); " in cli_jobs.job_line("j", ["t.py"], ["a"], 0, Path("/p"))
    many = [f"h{i}" for i in range(10)]
    assert "; 10 processes on 10 hosts (h0, h1, h2, h3, h4, h5, h6, h7 and 2 more); " in \
           cli_jobs.job_line("j", ["t.py"], many, 0, Path("/p"))


def subset_state() -> st.ClusterState:
    place = ClusterConfig().host_place()
    return st.ClusterState("lab", "img:cpu", "sha256:0", 12345, "/ws", [
        st.HostState(s.host, s.address, place, slots=s.slots, primary=s.host == "a",
                     interfaces=[["eth0", s.address, 24]]) for s in SLOTS])


def test_a_horovod_job_on_h_launches_horovodrun_on_exactly_those_hosts():
    state = subset_state()
    picked = pick_hosts([("c", 1), ("b", 1)], SLOTS, "lab")
    job = jobs.Job("j1", state, 2, tuple(picked), ("eth0",), ("python", "t.py"), HorovodOptions())
    plan = job.plan()
    assert (plan.hosts, plan.here) == (picked, "10.0.0.1")
    argv, ranks = plan.launch(plan.hosts, "0")
    assert argv == ["horovodrun", "--gloo", "-np", "2", "-H", "10.0.0.3:1,10.0.0.2:1", "-p", "12345",
                    "--network-interface", "eth0", "--start-timeout", "60", "python", "t.py"]
    assert ranks == ["c", "b"] and job.ranks_hosts() == ["c", "b"]


def test_a_torchrun_job_on_h_has_those_hosts_as_its_nodes_and_the_first_as_the_store():
    state = subset_state()
    picked = pick_hosts([("b", 1), ("c", None)], SLOTS, "lab")
    fanout, placed = jobs.fanout("torchrun", state, [], picked, ["python", "t.py"], None, route(state))
    assert [(n.host, n.argv[n.argv.index("torchrun"):][:6]) for n in fanout] == [
        (h, ("torchrun", f"--nnodes={NNODES}", f"--nproc-per-node={n}", f"--node-rank={NODE_RANK}",
             f"--master-addr={MASTER_ADDR}", f"--master-port={MASTER_PORT}")) for h, n in (("b", 1), ("c", 2))]
    assert [s.host for s in placed] == ["b", "c", "c"]
    job = jobs.Job("j1", state, len(placed), tuple(picked), ("eth0",), ("python", "t.py"), launcher="torchrun",
                   fanout=fanout, placed=placed)
    argv, ranks = job.plan().launch(picked, "29400")
    assert ranks == ["b", "c", "c"]
    script = argv[2]
    assert "--nnodes=2 --nproc-per-node=1 --node-rank=0 --master-addr=10.0.0.2 --master-port=29400" in script
    assert "--nnodes=2 --nproc-per-node=2 --node-rank=1 --master-addr=10.0.0.2 --master-port=29400" in script
    assert "10.0.0.1" not in script  # the primary, which -H left out, runs none of it


def test_a_torchrun_job_talks_over_the_training_network_each_host_on_its_own_interface():
    """The store on node 0's address on the fabric, not its hosts.txt address; each host's Gloo and NCCL on its own
    name for the fabric; NCCL_IB_HCA where the fabric has RDMA ports."""
    state = subset_state()
    members = {"a": Member("fabric0", "10.9.0.1"), "b": Member("enp65s0", "10.9.0.2", rdma=("mlx5_0:1",)),
               "c": Member("ens1f0", "10.9.0.3", rdma=("mlx5_2:1",))}
    picked = [Slot(s.host, s.address, s.slots, members[s.host].address) for s in pick_hosts([("b", 1), ("c", 1)],
                                                                                            SLOTS, "lab")]
    fanout, placed = jobs.fanout("torchrun", state, [], picked, ["python", "t.py"], None, members)
    assert [n.argv[1:4] for n in fanout] == [
        ("GLOO_SOCKET_IFNAME=enp65s0", "NCCL_SOCKET_IFNAME==enp65s0", "NCCL_IB_HCA==mlx5_0:1"),
        ("GLOO_SOCKET_IFNAME=ens1f0", "NCCL_SOCKET_IFNAME==ens1f0", "NCCL_IB_HCA==mlx5_2:1")]
    job = jobs.Job("j1", state, len(placed), tuple(picked), ("fabric0",), ("python", "t.py"), launcher="torchrun",
                   fanout=fanout, placed=placed)
    argv, _ = job.plan().launch(picked, "29400")
    assert argv[2].count("--master-addr=10.9.0.2 --master-port=29400") == 2 and "10.0.0.2" in argv[2]  # ssh to b


def test_horovod_ranks_each_take_their_hosts_interface():
    """horovodrun names the primary's interface (its driver address comes from it) and gives every rank the same
    variables: each rank takes its own host's name for the fabric from KIT_RANK_NICS, by HOROVOD_HOSTNAME."""
    state = subset_state()
    members = {"a": Member("fabric0", "10.9.0.1"), "b": Member("enp65s0", "10.9.0.2"), "c": Member("ens1f0", "10.9.0.3")}
    env = dict(route_env(members, {h.name: h.address for h in state.hosts}))
    assert env == {"KIT_RANK_NICS": "10.0.0.1=fabric0 10.0.0.2=enp65s0 10.0.0.3=ens1f0"}
    job = jobs.Job("j1", state, 3, tuple(SLOTS), ("fabric0",), ("python", "t.py"), network=tuple(env.items()))
    assert f" -e 'KIT_RANK_NICS={env['KIT_RANK_NICS']}' " in job.supervisor_command()
    argv, _ = job.plan().launch(list(SLOTS), "0")
    assert argv[argv.index("--network-interface") + 1] == "fabric0"


def test_a_horovod_job_on_one_host_that_is_not_horovodruns_own_names_the_interface():
    """-H c:2 from the primary a: horovodrun reaches c over the network, so the cluster's interface is named; on a
    alone it talks over loopback and names none."""
    state = subset_state()
    for wanted, nic in (([("c", 2)], ["--network-interface", "eth0"]), ([("a", 2)], [])):
        picked = pick_hosts(wanted, SLOTS, "lab")
        plan = jobs.Job("j1", state, 2, tuple(picked), ("eth0",), ("python", "t.py")).plan()
        argv, _ = plan.launch(plan.hosts, "0")
        assert argv[:8 + len(nic)] == ["horovodrun", "--gloo", "-np", "2", "-H", f"{picked[0].address}:2", "-p",
                                       "12345", *nic]
        assert argv[8 + len(nic)] == "--start-timeout"
