"""What a rank writes reaches the user's terminal with its control characters made visible (kit.shown): a job's
ESC, C1 and line-separator characters never reach `kit run`'s, `kit logs`' or `kit jobs`' output as they are, and
Rich markup in it is printed as written."""

import re
from pathlib import Path

import pytest

from harness import kit, lab_cluster

pytestmark = pytest.mark.lab
JOB = Path(__file__).parent / "jobs" / "escapes.py"
RAW = re.compile("[\x1b\x07\x80-\x9f\u2028\u2029]")
VISIBLE = ("\\x1b[2J", "\\x1b[1;1H", "\\x1b]52;c:aGFja2Vk\\x07", "c1\\x9b31m", "sep\\u2028after", "bell\\x07")


@pytest.fixture(scope="module")
def cluster(project, lab):
    with lab_cluster(lab, project, "lab", "--hosts", "hosts.txt"):
        yield project


def shows_it_visibly(out: str, markup: bool = True) -> None:
    assert not RAW.search(out), repr(RAW.findall(out))
    for escape in VISIBLE:
        assert escape in out, (escape, out[-3000:])
    if markup:
        assert "[bold]x[/bold]" in out, out[-3000:]


def test_a_ranks_escape_sequences_reach_the_terminal_visible(project, lab, cluster):
    run = kit(project, lab, "run", str(JOB), "--np", "1")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    shows_it_visibly(run.stdout)
    job = re.search(r"^✓ job (\S+) finished", run.stdout, re.M)[1]  # kit's line, not the rank's fake one
    assert re.search(r"^\[\S+ rank 0\] before\\x1b\[2J", run.stdout, re.M), run.stdout[-3000:]  # its prefix kept

    logs = kit(project, lab, "logs", job)
    assert logs.returncode == 0, logs.stderr
    shows_it_visibly(logs.stdout)

    jobs = kit(project, lab, "jobs")
    assert jobs.returncode == 0, jobs.stderr
    assert not RAW.search(jobs.stdout), repr(RAW.findall(jobs.stdout))
    # the rank wrote the same into its folder's `hang` record: the supervisor's own record of the end replaced it
    assert "forged the hang record" in run.stdout and "aGFja2Vk" not in jobs.stdout, jobs.stdout[-3000:]
