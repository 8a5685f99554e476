"""Helpers shared by the unit tests, the lab tests and bench/."""

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_kit(*args: str, cwd: Path, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run the installed `kit` as a user would, with wide output so lines stay whole. kit's pace watch is on in every
    job it follows: no job a test runs through here has a host slowed on purpose, so none may be named a straggler
    (the tests that slow one start kit themselves)."""
    r = subprocess.run([sys.executable, "-m", "kit", *args], cwd=cwd, env={**os.environ, "COLUMNS": "200", **(env or {})},
                       capture_output=True, text=True, timeout=timeout)
    assert not (args[:1] in (("run",), ("attach",)) and "kit: straggler:" in r.stdout), r.stdout[-3000:]
    return r


def silent_listener():
    """A loopback socket that takes connections and never says a word: a hung index or a black-holing proxy.
    Close it when done."""
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def closed_port() -> int:
    """A loopback port where nothing listens: a connection is refused at once."""
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


def nvidia_smi_stand_in(gpus: int, driver: str) -> str:
    """A stand-in `nvidia-smi` (a script for PATH) reporting `gpus` H200s of NVIDIA driver `driver`, in the forms
    a real one prints (captured on an H200 host): for tests on machines without a GPU. It runs nothing on a GPU."""
    cuda = "13.0" if int(driver.split(".")[0]) >= 580 else "12.2"  # (the newest CUDA the driver runs, as it says)
    return f"""#!/bin/sh
# kit's tests: a stand-in nvidia-smi ({gpus} GPUs, driver {driver}); no GPU is behind it.
case "$*" in
  -L) i=0; while [ $i -lt {gpus} ]; do echo "GPU $i: NVIDIA H200 (UUID: GPU-8f25e925-f097-b52c-532c-8ee7f0ee3c8$i)"; \
i=$((i + 1)); done ;;
  *--query-gpu=driver_version*) i=0; while [ $i -lt {gpus} ]; do echo "{driver}"; i=$((i + 1)); done ;;
  *--query-gpu=*) i=0; while [ $i -lt {gpus} ]; do echo "$i, NVIDIA H200, {driver}, 143771 MiB, 9.0"; \
i=$((i + 1)); done ;;
  *) echo "| NVIDIA-SMI {driver}             Driver Version: {driver}     CUDA Version: {cuda}     |" ;;
esac
"""


@contextlib.contextmanager
def machine_share(folder: str, whole: bool):
    """A share of the machine among tests/run's streams, all of it if `whole`. A test that wants all of it waits
    for the tests the other streams run to end, and no test starts meanwhile: each takes a turnstile first, which one
    that wants the whole keeps until it has it."""
    turnstile = os.open(os.path.join(folder, "turnstile"), os.O_RDWR | os.O_CREAT, 0o600)
    machine = os.open(os.path.join(folder, "machine"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(machine, fcntl.LOCK_EX if whole else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        os.close(machine)  # closing drops the lock
        os.close(turnstile)


class StreamShare:
    """One stream's share of the machine from test to test (tests/conftest.py): a test holds its share while it runs;
    `alone` tests that follow each other (a module of them) keep the whole machine from one to the next, so the
    other streams' running tests are waited for once, not before each, and none of their tests slips in between. A wait
    over a second is written to FOLDER/waits (`STREAM SECONDS TEST`), for tests/timings.py."""

    def __init__(self, folder: str, stream: str):
        self.folder, self.stream = folder, stream
        self._held = contextlib.ExitStack()
        self._whole = False

    def take(self, whole: bool, test: str) -> None:
        if whole and self._whole:
            return
        asked = time.monotonic()
        self._held.enter_context(machine_share(self.folder, whole))
        self._whole = whole
        if (waited := time.monotonic() - asked) > 1:
            with open(os.path.join(self.folder, "waits"), "a") as log:
                log.write(f"{self.stream} {waited:.1f} {test}\n")

    def give(self, next_alone: bool) -> None:
        """After a test: its share dropped, unless it holds the whole and the next test wants the whole too."""
        if not (self._whole and next_alone):
            self._held.close()
            self._whole = False
