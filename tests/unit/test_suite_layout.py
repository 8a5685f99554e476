"""The suite's own layout: pytest imports test modules by their file name (the folders are no packages), so two
test files of one name in different folders stop the whole run at collection."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []


def test_a_test_alone_waits_for_the_other_streams_test_and_no_test_starts_meanwhile(tmp_path):
    """tests/run's streams: a share each side by side; one wanting the whole machine waits for the share held, and
    a share asked for while it waits starts only after it."""
    import threading
    import time

    from helpers import machine_share

    order, holding, release = [], threading.Event(), threading.Event()

    def share(name, hold=None):
        with machine_share(str(tmp_path), whole=False):
            order.append(f"{name} in")
            if hold:
                holding.set()
                release.wait(10)
            order.append(f"{name} out")

    def whole():
        with machine_share(str(tmp_path), whole=True):
            order.append("alone in")
            time.sleep(0.2)
            order.append("alone out")

    with machine_share(str(tmp_path), whole=False):  # two shares side by side
        with machine_share(str(tmp_path), whole=False):
            pass
    first = threading.Thread(target=share, args=("first", True))
    first.start()
    assert holding.wait(10)
    alone = threading.Thread(target=whole)
    alone.start()
    time.sleep(0.3)
    later = threading.Thread(target=share, args=("later",))
    later.start()
    time.sleep(0.3)
    assert order == ["first in"]  # the test alone waits for the share; the later share waits behind it
    release.set()
    for t in (first, alone, later):
        t.join(10)
    assert order == ["first in", "first out", "alone in", "alone out", "later in", "later out"]


def test_alone_tests_that_follow_each_other_keep_the_machine_and_the_other_stream_waits_once(tmp_path):
    """Two `alone` tests in a row hold the whole machine from one to the next: a test of the other stream asked for
    meanwhile starts after both, and its wait (over a second) is written down for tests/timings.py."""
    import threading
    import time

    from helpers import StreamShare

    order, asked = [], threading.Event()
    lab, beside = StreamShare(str(tmp_path), "lab"), StreamShare(str(tmp_path), "unit")

    def other():
        asked.set()
        beside.take(False, "tests/unit/test_x.py::test_between")
        order.append("between")
        beside.give(next_alone=False)

    lab.take(True, "tests/lab/test_a.py::test_one")
    order.append("one")
    thread = threading.Thread(target=other)
    thread.start()
    assert asked.wait(10)
    time.sleep(0.6)
    lab.give(next_alone=True)  # kept: the next test wants the whole too
    lab.take(True, "tests/lab/test_a.py::test_two")
    time.sleep(0.6)
    order.append("two")
    lab.give(next_alone=False)
    thread.join(10)
    assert order == ["one", "two", "between"]
    stream, seconds, test = (tmp_path / "waits").read_text().split()
    assert (stream, test) == ("unit", "tests/unit/test_x.py::test_between") and float(seconds) > 1


def test_the_timings_give_each_phase_and_each_streams_slowest_tests_with_their_waits(tmp_path):
    import timings

    (tmp_path / "phases").write_text("total start 100.0\npackages start 100.0\npackages end 190.5\n"
                                     "lab start 200\nimages start 200\nimages end 900\nlab end 2000\n"
                                     "unit start 900\ntotal end 2010\n")  # unit never ended: left out
    (tmp_path / "waits").write_text("lab 30.0 tests/lab/test_run.py::test_x\nlab 12.5 tests/lab/test_run.py::test_y\n")
    cases = "".join(f'<testcase classname="tests.lab.test_run" name="test_{i}" time="{i}.0"/>' for i in range(12))
    (tmp_path / "lab.xml").write_text(f'<testsuites><testsuite>{cases}<testcase classname="tests.lab.test_cluster" '
                                      'name="test_up" time="99.5"><failure message="x"/></testcase>'
                                      '</testsuite></testsuites>')
    (tmp_path / "unit.xml").write_text("<testsuites><testsu")  # killed while writing
    lines = timings.report(tmp_path).splitlines()
    assert lines[:5] == ["phases", "  packages                      90 s   1.5 min",
                         "  lab                         1800 s  30.0 min",
                         "  images                       700 s  11.7 min",
                         "  total                       1910 s  31.8 min"]
    assert lines[5] == "lab: 13 tests, 166 s in them (2.8 min); 2 waited 42 s in all for the other streams"
    assert lines[6:9] == ["     99.5 s  tests/lab/test_cluster.py::test_up (failure)",
                          "     11.0 s  tests/lab/test_run.py::test_11", "     10.0 s  tests/lab/test_run.py::test_10"]
    assert len(lines) == 6 + 10


LAB = TESTS / "lab"
# What the lab's second stream must not touch: slot 0's addresses and host names, and what is this machine's own (the
# local clusters and compose projects on its Docker engine, the Slurm lab and its users, `kit prepare --slurm`'s
# changes to the machine's packages and files), which the first uses; nor may it hold a test alone (it would stop the
# first stream while it runs, as the point of a second lab is to run beside it). (`kit prepare --dry-run` is Ansible's
# check mode.)
SLOT_0 = ("10.231.77", "10.232.0", '"kitlab-h', "local_leftovers", "remove_local_clusters",
          "slurmlab", "--slurm", "compose", "mark.alone")


def lab_names(slot: int) -> dict[str, str]:
    import json
    import os
    import subprocess
    import sys

    code = ("import json, harness as h; print(json.dumps({k: str(getattr(h, k)) for k in ('PREFIX', 'SUBNET', "
            "'FABRIC_SUBNET', 'BRIDGE', 'FABRIC_BRIDGE', 'RUN', 'DATA')}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=LAB, env={**os.environ, "KIT_LAB_SLOT": str(slot)},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_the_labs_of_the_two_lab_streams_share_no_name_address_or_folder():
    """Each lab removes, before and after it runs, whatever carries its prefix and a dash (a killed run's hosts,
    links, rules): the second lab's names must not fall under the first's, nor its subnets be the same."""
    first, second = lab_names(0), lab_names(1)
    assert first["PREFIX"] == "kitlab" and first["SUBNET"] == "10.231.77"  # what the first half's modules name
    assert all(first[k] != second[k] for k in first), (first, second)
    assert not second["PREFIX"].startswith(first["PREFIX"] + "-")
    assert not first["PREFIX"].startswith(second["PREFIX"] + "-")
    assert len(f"{second['PREFIX']}-fab") <= 15  # a Linux interface name


def test_the_lab_modules_of_the_second_stream_use_nothing_the_first_stream_uses():
    import ast

    tree = ast.parse((LAB / "conftest.py").read_text())
    second = next(ast.literal_eval(node.value) for node in tree.body
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SECOND")
    assert second and all((LAB / name).is_file() for name in second), second
    used = {name: [word for word in SLOT_0 if word in (LAB / name).read_text()] for name in second}
    assert {name: words for name, words in used.items() if words} == {}
