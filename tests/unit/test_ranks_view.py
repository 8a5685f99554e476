"""kit jobs ID --ranks and the live view of kit attach / kit logs -f (kit.cli.joblist): the table from two readings
of the ranks' heartbeats, from whichever back end runs the job; the live view's thread shows it while the body runs
and ends with it, or when the job ends."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

from rich.console import Console

from kit.cli import joblist
from kit.errors import BadInput


class Backend:
    """A back end whose job's three ranks step 10 a reading; rank 2's host is busy twice as long a step."""

    def __init__(self, readings: int = 100, comm: bool = True) -> None:
        self.read, self.left, self.comm = 0, readings, comm

    def ranks(self, found, at, measure):
        if self.left <= 0:
            raise BadInput("job 20261129-100000-abcd is not running (succeeded): it has no ranks to read now")
        self.left -= 1

        def read():
            self.read += 1
            n = self.read
            return [SimpleNamespace(rank=r, host=f"h{r + 1}", t=float(n), steps=10 * n, data_s=0.0,
                                    comm_s=n * (0.2 if r == 2 else 0.6) if self.comm else 0.0) for r in range(3)]
        return "20261129-100000-abcd", measure(read)


def test_the_table_names_each_rank_and_its_host_against_the_others(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(joblist, "console", Console(file=out, width=200))
    monkeypatch.setattr(joblist, "RANKS_WAIT_S", 0.01)
    job, paces = joblist.measure_ranks(Backend(), None, None)
    joblist.show_ranks(job, paces)
    text = out.getvalue()
    assert "job 20261129-100000-abcd: its ranks" in text
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert [(r[0], r[1], r[-1]) for r in rows] == [("0", "h1", "0.67x"), ("1", "h2", "0.67x"), ("2", "h3", "2.00x")]


def test_ranks_whose_waits_in_collectives_are_not_counted_are_not_compared_and_the_table_says_why(monkeypatch):
    """A DDP job's wait for its slowest rank is inside backward(): with no wait in collectives counted, every busy
    time is the step time, and `vs others` would show every rank alike (1.00x) however slow one is."""
    out = io.StringIO()
    monkeypatch.setattr(joblist, "console", Console(file=out, width=400))
    monkeypatch.setattr(joblist, "RANKS_WAIT_S", 0.01)
    job, paces = joblist.measure_ranks(Backend(comm=False), None, None)
    joblist.show_ranks(job, paces)
    text = out.getvalue()
    rows = [line.split() for line in text.splitlines() if line.strip()[:1].isdigit()]
    assert [(r[0], r[1], r[2]) for r in rows] == [("0", "h1", "20"), ("1", "h2", "20"), ("2", "h3", "20")], text
    assert not any(r[-1].endswith("x") for r in rows), text
    assert "no wait in collectives is counted for these ranks, so none can be told from the others" in text
    monkeypatch.setattr("sys.stdout", out := io.StringIO())
    joblist.show_ranks(job, paces, as_json=True)
    assert [line.count('"vs_others": null') for line in out.getvalue().splitlines()] == [1, 1, 1]


def test_the_live_view_shows_the_table_while_the_body_runs_and_stops_when_the_job_ends(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(joblist, "console", Console(file=out, width=200))
    monkeypatch.setattr(joblist, "RANKS_WAIT_S", 0.01)
    b = Backend(readings=2)
    with joblist.live_ranks(b, None, None, every=0.05):
        deadline = time.monotonic() + 10
        while b.left > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # (the third look finds the job ended: the thread ends quietly)
    assert out.getvalue().count("its ranks over") == 2 and "warning" not in out.getvalue()
    shown = out.getvalue()
    with joblist.live_ranks(Backend(), None, None, every=60):
        pass  # (ends with the body, before its first look)
    assert out.getvalue() == shown
