import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers.py, for every test folder

from helpers import StreamShare  # noqa: E402

# tests/run runs the whole suite in three streams side by side (see there); each test holds a share of the machine
# (an flock on $KIT_TEST_STREAMS/machine) while it runs, and one marked `alone` holds all of it (helpers.StreamShare).
STREAMS = os.environ.get("KIT_TEST_STREAMS")


def pytest_configure(config):
    # Tests send kit Ctrl-C (SIGINT) as a user does. A suite started in the background of a script has SIGINT ignored,
    # which every process it starts inherits (Python then installs no KeyboardInterrupt for it): the suite's own
    # processes get SIGINT's default back, as in a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line("markers", "alone: measures speed or timing, or changes what the other streams' tests "
                                       "use: tests/run's other streams wait while it runs")
    config.addinivalue_line("markers", "last: its module's last test, after its tests alone (it leaves what no test "
                                       "of the module after it may find)")


def alone(item) -> bool:
    return item.get_closest_marker("alone") is not None


SHARE = StreamShare(STREAMS, os.environ.get("KIT_TEST_STREAM", "tests")) if STREAMS else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if SHARE is None:
        return (yield)
    SHARE.take(alone(item), item.nodeid)
    try:
        return (yield)
    finally:
        SHARE.give(next_alone=nextitem is not None and alone(nextitem))


@pytest.fixture(scope="session")
def client():
    """This machine's Docker engine."""
    import docker
    return docker.from_env(timeout=300)


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    """A small wheelhouse of real (empty) wheel files, for rendering tests."""
    d = tmp_path / "wheels"
    d.mkdir()
    (d / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel one")
    return d


@pytest.fixture
def ca_bundle(tmp_path: Path) -> Path:
    f = tmp_path / "ca.pem"
    f.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    return f


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder, so no ./kit.yaml is picked up by accident, with a kit home of its own: the clusters
    this machine's user has recorded (~/.kit) change what kit says."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KIT_HOME", str(tmp_path / ".kit-home"))
    return tmp_path


SSH_SHIM = r"""#!/bin/bash
# `ssh [-n] [-o OPTION]... HOST COMMAND...` run here (unit tests of what runs in the primary's container); a host
# listed in $SHIM/down does not answer, as a host whose container is gone.
while [ $# -gt 0 ]; do case "$1" in -n) shift;; -o) shift 2;; *) break;; esac; done
host=$1; shift
echo "$host $*" >> "$SHIM/calls"
export KIT_PROGRESS_DIR="$SHIM/progress/$host"  # each host's container has its own /run
if grep -qx "$host" "$SHIM/down" 2>/dev/null; then echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255; fi
exec sh -c "$*"
"""


@pytest.fixture
def ssh_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with an `ssh` first on PATH that runs the command here (see SSH_SHIM); write host addresses into
    its file `down` to make them unreachable; `calls` lists what it ran."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "ssh").write_text(SSH_SHIM)
    (shim / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    monkeypatch.setenv("SHIM", str(shim))
    return shim
