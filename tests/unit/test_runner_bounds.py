"""What kit's runners hold of a command's output, and how long a bounded step may take: a rank that writes without
ever ending its line, a host that says megabytes, or one that trickles a byte now and then cannot grow kit without
limit or keep a step from ending. Real commands, on this machine and over a real sshd on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import test_ssh_runner

from kit.errors import KitError
from kit.runners import base, local, ssh
from kit.runners.base import LINE_KEPT, STDERR_KEPT, Tail
from kit.runners.local import LocalRunner
from kit.runners.ssh import SshRunner

pytestmark = pytest.mark.alone  # timings of a few seconds: tests/run's other stream waits meanwhile

host = test_ssh_runner.host  # the sshd of its own on loopback, with a HOME that trusts its key

STREAM = 150 << 20  # what the rank writes, with no newline
GROWN_CAP = 64 << 20  # what the reading process may grow by: the head kept of a command's stdout, and some change

# In a process of its own, so that its peak memory is what the runner held: each way kit reads a command's output.
READER = r"""
import json, resource, sys
from kit.config.hosts import Host
from kit.runners.local import LocalRunner
from kit.runners.ssh import SshRunner
kind, port, command = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runner = LocalRunner("here") if kind == "local" else SshRunner(Host("127.0.0.1", user="root", port=port))
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
runner.run("true")
before, seen = peak(), {}
lines = []
seen["stream_out"] = (runner.stream_out(command, lambda line: lines.append(len(line))), lines)
talk = runner.converse(command, silence=60)
seen["converse"] = ([len(line) for line in talk.lines()], talk.result().exit_code)
r = runner.run(command, timeout=120)
seen["run"] = (r.exit_code, len(r.stdout))
runner.close()
print(json.dumps({"grown": peak() - before, "seen": seen}))
"""


def _runner(kind: str, request) -> LocalRunner | SshRunner:
    return LocalRunner("here") if kind == "local" else SshRunner(request.getfixturevalue("host"))


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_a_line_without_end_keeps_the_runner_bounded(request, kind):
    """150 MB with no newline (a rank writing without end, an output.log linked to /dev/zero): each way kit reads it
    holds the head of the line and counts the rest, and the reading process grows by far less than the stream."""
    port = request.getfixturevalue("host").port if kind == "ssh" else 0
    command = f"head -c {STREAM} /dev/zero | tr '\\0' x; exit 3"
    done = subprocess.run([sys.executable, "-c", READER, kind, str(port), command], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout)
    mark = len(f" [kit: {STREAM - LINE_KEPT} more bytes of this line left out]")
    assert said["seen"]["stream_out"] == [3, [LINE_KEPT + mark]]
    assert said["seen"]["converse"] == [[LINE_KEPT + mark], 3]
    assert said["seen"]["run"] == [3, base.STDOUT_KEPT]
    assert said["grown"] < GROWN_CAP, f"the reader grew by {said['grown'] >> 20} MiB for a {STREAM >> 20} MiB line"


def test_a_long_line_is_cut_once_and_the_lines_around_it_stay_whole():
    lines = base.Lines()
    lines.feed(b"before\r\n" + b"y" * (LINE_KEPT + 10))
    lines.feed(b"z" * 5 + b"\nafter\n" + b"last")
    lines.end()
    assert list(lines.ready) == ["before", "y" * LINE_KEPT + " [kit: 15 more bytes of this line left out]", "after",
                                 "last"]


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_trickling_output_ends_at_the_steps_deadline(request, kind):
    """A byte every 0.2 s never leaves the far end silent for long: a 2 s step still ends at 2 s, and its failure
    names the host and the command."""
    runner = _runner(kind, request)
    trickle = "i=0; while [ $i -lt 150 ]; do printf x || exit; sleep 0.2; i=$((i+1)); done"
    try:
        runner.run("true")  # connected: the step's time is the command's
        started = time.monotonic()
        r = runner.run(trickle, timeout=2)
        took = time.monotonic() - started
        assert r.exit_code == 124 and 1.8 <= took < 5, (r, took)
        with pytest.raises(KitError) as failed:
            r.check("cannot read the host")
        assert failed.value.host == runner.host and failed.value.command == trickle
        assert "timed out" in failed.value.output_tail and "2 s" in failed.value.output_tail
    finally:
        runner.close()


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_a_trickling_stream_in_ends_at_its_finish(request, kind):
    """Once its input has ended, a command may run `finish` seconds in all, whatever it says meanwhile."""
    runner = _runner(kind, request)
    try:
        runner.run("true")
        started = time.monotonic()
        r = runner.stream_in("cat >/dev/null; i=0; while [ $i -lt 150 ]; do printf x || exit; sleep 0.2; "
                             "i=$((i+1)); done", iter([b"layer"]), lambda n: None, timeout=30, finish=2)
        assert r.exit_code == 124 and 1.8 <= time.monotonic() - started < 5
    finally:
        runner.close()


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_stderr_tail_is_kept_by_one_helper(request, kind):
    """Both runners keep the last STDERR_KEPT bytes of a command's stderr with base.Tail: exactly those bytes, for a
    command run to its end and for a conversation alike."""
    assert local.Tail is ssh.Tail is Tail
    said = b"".join(b"%07d\n" % i for i in range(200_000))  # 1.6 MB, every line different
    kept = Tail()
    for start in range(0, len(said), 10_000):
        kept.add(said[start:start + 10_000])
    assert kept.data == said[-STDERR_KEPT:]
    runner = _runner(kind, request)
    command = "seq -f %07g 0 199999 >&2; exit 4"
    try:
        r = runner.run(command, timeout=60)
        assert (r.exit_code, r.stderr) == (4, said[-STDERR_KEPT:].decode())
        talk = runner.converse(command, silence=60)
        assert list(talk.lines()) == []
        r = talk.result()
        assert (r.exit_code, r.stderr) == (4, said[-STDERR_KEPT:].decode())
    finally:
        runner.close()



@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_a_conversation_reads_kits_own_long_answers_whole_and_the_jobs_lines_cut(request, kind):
    """The job starter's answer names every other host's workspace in one line (MBs for a large one): read whole
    while kit asks for it; what follows (the job's output) is cut at LINE_KEPT again."""
    runner = _runner(kind, request)
    try:
        talk = runner.converse(f"head -c {3 << 20} /dev/zero | tr '\\0' a; echo; head -c {1 << 20} /dev/zero | "
                               "tr '\\0' b; echo", silence=60)
        first = next(talk.lines(base.STDOUT_KEPT))
        rest = list(talk.lines())
        assert first == "a" * (3 << 20)
        assert rest == ["b" * LINE_KEPT + f" [kit: {(1 << 20) - LINE_KEPT} more bytes of this line left out]"]
    finally:
        runner.close()


def test_a_commands_output_cut_at_the_head_kept_fails_its_check():
    """What kit parses of a command is its stdout's head (STDOUT_KEPT): a parser must never read a cut one as whole."""
    from kit.errors import KitError
    from kit.runners.base import STDOUT_KEPT
    from kit.runners.local import LocalRunner
    r = LocalRunner("a").run(f"head -c {STDOUT_KEPT + 10} /dev/zero", timeout=60)
    assert r.ok and r.cut == 10
    with pytest.raises(KitError, match="longer than the 16 MiB kit reads"):
        r.check("cannot list the workspace")
