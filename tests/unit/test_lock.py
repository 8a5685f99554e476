"""kit's locks: one command at a time on a cluster; one build at a time of an image's settings."""

import threading
import time

import pytest

from kit.cluster.lock import Busy, build_lock, cluster_lock


def test_a_second_build_of_the_same_settings_waits_for_the_first_and_is_told_who_builds(in_tmp):
    entered, release, order, told = threading.Event(), threading.Event(), [], []

    def first():
        with build_lock("abc123", told.append):
            order.append("first in")
            entered.set()
            release.wait(10)
            order.append("first out")

    def second():
        with build_lock("abc123", told.append):
            order.append("second in")

    a = threading.Thread(target=first)
    a.start()
    assert entered.wait(10)
    b = threading.Thread(target=second)
    b.start()
    deadline = time.monotonic() + 10
    while not told and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(told) == 1 and "pid" in told[0] and order == ["first in"], (told, order)  # waiting, not building
    release.set()
    a.join(10)
    b.join(10)
    assert order == ["first in", "first out", "second in"]


def test_builds_of_other_settings_do_not_wait(in_tmp):
    told = []
    with build_lock("one", told.append), build_lock("two", told.append):
        pass
    assert told == []


def test_a_cluster_held_by_another_command_is_refused_naming_it(in_tmp):
    with cluster_lock("lab"):
        with pytest.raises(Busy, match=r"cluster lab is busy: `kit .*` \(pid \d+, since "):
            with cluster_lock("lab"):
                pass
