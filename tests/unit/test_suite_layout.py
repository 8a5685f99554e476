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
