"""One kit command at a time on a cluster: `up`, `down`, `run` and `demo` hold its lock while they change it; and one
build at a time of an image's settings, which a second build of them waits for and then finds built.

An flock on ~/.kit/.locks/<cluster> (outside the cluster's own folder, which `down` removes: a lock file
made again there would be another file, and two commands would both hold "the" lock). The holder writes
who it is into the file, so a second command says who holds it instead of interleaving with it. The kernel
drops the lock when its process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from kit.errors import KitError
from kit.cluster.identity import state_root

LOCKS = ".locks"


class Busy(KitError):
    """Another kit command holds the cluster: nothing was done."""


def cluster_lock(cluster: str, root: Path | None = None) -> contextlib.AbstractContextManager[None]:
    def busy(holder: str) -> None:
        raise Busy(f"cluster {cluster} is busy: {holder} holds it",
                   hint="wait until that command ends (or stop it), then run this one again") from None
    return _held(cluster, busy, root)


def build_lock(key: str, on_wait: Callable[[str], None],
               root: Path | None = None) -> contextlib.AbstractContextManager[None]:
    """Held while an image of settings `key` is built: a second build of the same settings (another terminal, a
    `kit up` that builds) waits for it, told who holds it through on_wait(holder), rather than building it too."""
    return _held(f"build-{key}", on_wait, root)


@contextlib.contextmanager
def _held(name: str, on_busy: Callable[[str], None], root: Path | None) -> Iterator[None]:
    """The flock on <kit's home>/.locks/<name>, the holder's command written in its file. When another holds it,
    on_busy(that holder) raises to give up, or returns to wait for it."""
    folder = (root or state_root()) / LOCKS
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_busy(os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another kit command")
            fcntl.flock(fd, fcntl.LOCK_EX)
        me = f"`kit {shlex.join(sys.argv[1:])}` (pid {os.getpid()}, since {time.strftime('%H:%M:%S')})"
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # drops the lock
