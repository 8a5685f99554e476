"""horovodrun from the inventory, and its output read back."""

import json
import os
import shlex
import subprocess

import pytest

from kit.cluster import state as st
from kit.jobs.commands.horovod import (Failures, HorovodOptions, check_np, exit_report, horovodrun_argv, rank_command,
                                       rank_launcher, split_rank)
from kit.config.settings import ClusterConfig
from kit.network.choose import Decision, Member
from kit.network.measure import record, route
from kit.backends.cluster.supervisor.launch import Slot, placement
from kit.errors import BadInput

SLOTS = [Slot("gpu-1", "10.0.0.1", 2), Slot("gpu-2", "10.0.0.2", 1), Slot("gpu-3", "10.0.0.3", 1)]


def test_argv_from_the_inventory():
    assert horovodrun_argv(4, SLOTS, 12345, ["eth0"], ["python", "-u", "train.py", "--epochs", "2"],
                           HorovodOptions()) == [
        "horovodrun", "--gloo", "-np", "4", "-H", "10.0.0.1:2,10.0.0.2:1,10.0.0.3:1", "-p", "12345",
        "--network-interface", "eth0", "--start-timeout", "60", "python", "-u", "train.py", "--epochs", "2"]


def test_fewer_processes_use_the_first_hosts():
    argv = horovodrun_argv(3, SLOTS, 2222, ["eth0", "ens3"], ["python", "t.py"], HorovodOptions())
    assert argv[argv.index("-H") + 1] == "10.0.0.1:2,10.0.0.2:1"
    assert argv[argv.index("--network-interface") + 1] == "eth0,ens3"
    assert [s.host for s in placement(SLOTS, 3)] == ["gpu-1", "gpu-1", "gpu-2"]


def test_a_job_on_one_host_names_no_interface():
    argv = horovodrun_argv(2, SLOTS, 12345, ["eth0"], ["python", "t.py"], HorovodOptions())
    assert "--network-interface" not in argv and argv[argv.index("-H") + 1] == "10.0.0.1:2"


def test_tuning_options_are_passed_as_horovod_expects():
    opts = HorovodOptions(fusion_threshold_mb=32, cycle_time_ms=3.5, timeline="/w/timeline.json", verbose=True,
                          start_timeout=120)
    assert opts.argv() == ["--start-timeout", "120", "--fusion-threshold-mb", "32", "--cycle-time-ms", "3.5",
                           "--timeline-filename", "/w/timeline.json", "--verbose"]


def test_np_defaults_to_every_slot_and_more_is_bad_input():
    assert check_np(None, SLOTS) == 4
    assert check_np(3, SLOTS) == 3
    with pytest.raises(BadInput, match=r"--np: 5 processes, but the cluster has 4 slots"):
        check_np(5, SLOTS)
    with pytest.raises(BadInput):
        check_np(0, SLOTS)


def _record(interfaces: dict[str, list], network: dict | None = None) -> st.ClusterState:
    place = ClusterConfig().host_place()
    return st.ClusterState("lab", "img", "sha256:0", 12345, "/ws", [
        st.HostState(h, f"10.0.0.{i + 1}", place, primary=i == 0, interfaces=found)
        for i, (h, found) in enumerate(interfaces.items())], network=network or {})


def test_a_cluster_recorded_before_kit_chose_networks_trains_on_the_hosts_txt_subnet_by_each_hosts_name():
    state = _record({"a": [["lo", "127.0.0.1", 8], ["docker0", "172.17.0.1", 16], ["eth0", "10.0.0.1", 24]],
                     "b": [["lo", "127.0.0.1", 8], ["ens3", "10.0.0.2", 24], ["docker0", "172.17.0.1", 16]]})
    assert route(state) == {"a": Member("eth0", "10.0.0.1"), "b": Member("ens3", "10.0.0.2")}
    with pytest.raises(BadInput, match="b has no interface on a subnet that holds every cluster address"):
        route(_record({"a": [["eth0", "10.0.0.1", 24]], "b": [["eth0", "10.9.0.2", 24]]}))


def test_a_recorded_choice_is_what_the_ranks_get():
    decision = Decision("10.9.0.0/24", {"a": Member("fabric0", "10.9.0.1"), "b": Member("ib0", "10.9.0.2")}, "", 100.0)
    state = _record({"a": [["eth0", "10.0.0.1", 24]], "b": [["eth0", "10.0.0.2", 24]]})
    record(state, decision, "f00d")
    assert route(state) == decision.members
    state.network["decision"]["members"]["b"]["iface"] = "ib0; reboot"  # a record edited by hand is not trusted
    assert route(state) == {"a": Member("eth0", "10.0.0.1"), "b": Member("eth0", "10.0.0.2")}


def test_each_horovod_rank_takes_its_own_hosts_interface_before_the_jobs_variables(tmp_path):
    """horovodrun gives every rank the primary's interface name; the rank launcher replaces it with its own host's
    (KIT_RANK_NICS, by HOROVOD_HOSTNAME), and a variable the job set itself (-e) still wins."""
    script = tmp_path / "show.py"
    script.write_text("import os\nprint(*(os.environ.get(k) for k in ('HOROVOD_GLOO_IFACE', 'GLOO_SOCKET_IFNAME', "
                      "'NCCL_SOCKET_IFNAME', 'NCCL_IB_HCA', 'KIT_RANK_NICS', 'KIT_RANK_HCAS')))\n")
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    (env_dir / "j1").write_text(json.dumps({"NCCL_SOCKET_IFNAME": "mine"}))
    base = {"PATH": os.environ["PATH"], "HOROVOD_GLOO_IFACE": "fabric0", "HOROVOD_HOSTNAME": "10.0.0.2",
            "KIT_RANK_NICS": "10.0.0.1=fabric0 10.0.0.2=enp65s0", "KIT_RANK_HCAS": "10.0.0.2=mlx5_2:1,mlx5_3:1"}
    argv = ["python", "-u", "-c", rank_launcher(env_dir=str(env_dir)), str(script)]
    said = subprocess.run(argv, env=base, capture_output=True, text=True, check=True).stdout.splitlines()[0]
    assert said == "enp65s0 enp65s0 =enp65s0 =mlx5_2:1,mlx5_3:1 None None"
    said = subprocess.run(argv, env={**base, "KIT_JOB": "j1", "KIT_ENV": "1"}, capture_output=True, text=True,
                          check=True).stdout.splitlines()[0]
    assert said == "enp65s0 enp65s0 mine =mlx5_2:1,mlx5_3:1 None None"


def test_output_lines_carry_their_rank():
    assert split_rank("[2]<stdout>:epoch 1: loss 2.3") == (2, "epoch 1: loss 2.3")
    assert split_rank("[0]<stderr>:Traceback (most recent call last):") == (0, "Traceback (most recent call last):")
    assert split_rank("Process 1 exit with status code 139.") == (None, "Process 1 exit with status code 139.")


def feed(lines: list[str]) -> Failures:
    f = Failures()
    for line in lines:
        f.feed(*split_rank(line))
    return f


def test_the_rank_that_failed_on_its_own_is_first_though_horovodrun_heard_of_another_sooner():
    f = feed(["[2]<stdout>:rank 2 fails on purpose", "[2]<stdout>:@@kit-exit 3 1000.10",
              "[0]<stderr>:RuntimeError: Horovod has been shut down. This was caused by an exception",
              "[0]<stdout>:@@kit-exit 1 1000.05",  # a victim: its clock even says earlier
              "Process 0 exit with status code 1.", "Process 2 exit with status code 3."])
    assert f.first() == (2, 3)


def test_a_rank_that_vanished_is_named_when_no_rank_failed_on_its_own():
    f = feed(["[0]<stderr>:RuntimeError: Horovod has been shut down.", "[0]<stdout>:@@kit-exit 1 1000.5",
              "Process 0 exit with status code 1.", "Process 1 exit with status code 255."])
    assert f.first() == (1, 255)


def test_a_rank_that_lost_its_peer_is_not_the_cause():
    f = feed(["[2]<stdout>:[E operations.cc:697] [2]: Horovod background loop uncaught exception: "
              "[pair.cc:598] Connection closed by peer [10.0.0.2]:6049", "[2]<stdout>:@@kit-exit 1 1000.1",
              "Process 1 exit with status code 255.", "Process 2 exit with status code 1."])
    assert f.first() == (1, 255)


def test_horovodruns_account_is_the_last_resort():
    assert feed(["Process 2 exit with status code 139."]).first() == (2, 139)
    assert feed(["[0]<stdout>:@@kit-exit 0 1000.0", "all good"]).first() is None


def test_rank_launcher_reports_how_the_script_ended(tmp_path):
    import subprocess
    import sys
    for body, code in [("import sys; sys.exit(3)", 3), ("raise ValueError('x')", 1), ("print('ok')", 0),
                       ("import helper; helper.go()", 0)]:
        (tmp_path / "helper.py").write_text("def go():\n    print('helper imported from the script folder')\n")
        (tmp_path / "job.py").write_text(body + "\n")
        argv = rank_command(str(tmp_path / "job.py"), ["--flag"])
        r = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, cwd="/")
        assert r.returncode == code, r.stderr
        reported, _ = exit_report(r.stdout.strip().splitlines()[-1])
        assert reported == code


def test_launch_gives_gloo_the_start_timeout_and_marks_the_job():
    from kit.backends.cluster.run import Job
    from kit.cluster.place import Place
    from kit.cluster.state import ClusterState, HostState

    state = ClusterState("lab", "img:1", "sha256:abc", 12345, "/w",
                         hosts=[HostState("a", "10.0.0.1", Place("kit-lab", "/var/lib/kit/lab"), primary=True)])
    job = Job("j1", state, 1, (Slot("a", "10.0.0.1", 1),), (), ("python", "-u", "t.py"),
              HorovodOptions(start_timeout=90))
    launch = shlex.split(job.start_command())
    assert launch[:7] == ["docker", "exec", "-i", "kit-lab", "python", "-I", "-c"] and launch[-1] == "--start"
    supervisor = shlex.split(job.supervisor_command())  # apart from kit's session: its parent outside the container
    assert supervisor[:5] == ["docker", "exec", "-d", "-w", "/"]
    assert supervisor[-1] == "/var/lib/kit/lab/jobs/j1/plan.json"
    assert supervisor[5:9] == ["-e", "KIT_SUPERVISOR=j1", "-e", "HOROVOD_GLOO_TIMEOUT_SECONDS=90"]
    assert supervisor[9:13] == ["kit-lab", "python", "-I", "-c"]
    request = json.loads(job.request(None))
    assert request["folder"] == job.folder == "/var/lib/kit/lab/jobs/j1" and request["follow"] is None
    assert request["workspace"] == "/w" and "environment" not in request["files"] and request["env_file"] is None
    assert (request["hosts"], request["copy"]) == ([], False)
    assert json.loads(request["files"]["plan.json"])["id"] == "j1"
    argv, _ = job.plan().launch(list(job.slots), "0")
    assert argv[:5] == ["horovodrun", "--gloo", "-np", "1", "-H"] and argv[-3:] == ["python", "-u", "t.py"]
