"""`kit cp`: files and folders between this machine and a host's workspace, as `docker cp` copies them.

On a host, the workspace is only read and written inside the cluster's container (which sees the workspace and
nothing else of the host's), by tar; a path that leads out of the workspace through a link is refused there.

What comes from a host is the job's: untrusted (a rank wrote it); kit.data.untar unpacks it (no link followed, nothing
written outside the destination). kit.data.cpargs reads the command's arguments.
"""

from __future__ import annotations

import posixpath
import queue
import tarfile
import threading
from pathlib import Path
from typing import Callable, Iterator

from kit.jobs.commands.docker import command
from kit.data.cpargs import Local, Remote, local_source, local_target, remote_target, source_name
from kit.errors import BadInput, KitError
from kit.runners.base import Runner
from kit.data.untar import STALL_S, Stalled, Unpacked, unpack


# ---------------------------------------------------------------- from a host

# Run in the container as `sh -c PACK sh PATH WORKSPACE`: PATH as a tar stream on stdout, its top named by its last
# component; a path that leads out of the workspace through a link is refused.
PACK = ('ws=$(realpath -e -- "$2") && p=$(realpath -e -- "$1" 2>/dev/null) || '
        '{ echo "kit: $1: no such file or folder" >&2; exit 3; }; '
        'case "$p" in "$ws"|"$ws"/*) ;; *) echo "kit: $1 leads out of the workspace (a link to $p)" >&2; exit 4;; '
        'esac; '
        'cd "$(dirname -- "$p")" && exec tar -cf - -- "$(basename -- "$p")"')


def pack_command(container: str, workspace: str, path: str) -> str:
    return command(["docker", "exec", container, "sh", "-c", PACK, "sh", path, workspace])


def download(runner: Runner, source: Remote, dest: Local, workspace: str,
             on_bytes: Callable[[int], None] = lambda n: None) -> Unpacked:
    """HOST:PATH to dest here."""
    target = local_target(dest, source_name(source), source.contents)
    reading = runner.read_out(pack_command(source.host.place.container, workspace, source.path), STALL_S)
    try:
        try:
            done = unpack(reading, target, on_bytes, source.host.name)
        except (BadInput, Stalled):
            raise
        except KitError:
            reading.result().check(f"cannot read {source.given}")  # the host's own failure says more
            raise
        reading.result().check(f"cannot read {source.given}")
    finally:
        reading.close()
    return done


# ---------------------------------------------------------------- to a host

# Run in the container as `sh -c PROBE sh PATH`: what is at the path (a link is followed, as tar -C will).
PROBE = ('if [ -d "$1" ]; then echo folder; elif [ -e "$1" ] || [ -L "$1" ]; then echo file; '
         'elif [ -d "$(dirname -- "$1")" ]; then echo none; else echo noparent; fi')

# `sh -c UNPACK sh FOLDER WORKSPACE`: a tar stream from stdin unpacked in a folder of the workspace; a folder that
# leads out of it through a link is refused.
UNPACK = ('ws=$(realpath -e -- "$2") && d=$(realpath -e -- "$1" 2>/dev/null) || '
          '{ echo "kit: $1: no such folder" >&2; exit 3; }; '
          'case "$d" in "$ws"|"$ws"/*) ;; *) echo "kit: $1 leads out of the workspace (a link to $d)" >&2; exit 4;; '
          'esac; exec tar -xf - -C "$d" --no-same-owner')


def probe_command(container: str, path: str) -> str:
    return command(["docker", "exec", container, "sh", "-c", PROBE, "sh", path])


def unpack_command(container: str, workspace: str, into: str) -> str:
    return command(["docker", "exec", "-i", container, "sh", "-c", UNPACK, "sh", into, workspace])


def tar_member(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Files, folders and links only, owned by nobody in particular."""
    if not (info.isreg() or info.isdir() or info.issym() or info.islnk()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def tar_chunks(source: Path, name: str) -> Iterator[bytes]:
    """source as a tar stream, its top named name ("": its contents), packed on a thread as the chunks are taken."""
    chunks: queue.Queue = queue.Queue(maxsize=8)
    stop = threading.Event()

    class Sink:
        def write(self, data: bytes) -> int:
            while not stop.is_set():
                try:
                    chunks.put(bytes(data), timeout=0.5)
                    return len(data)
                except queue.Full:
                    continue
            raise OSError("the copy was stopped")

    def pack() -> None:
        try:
            with tarfile.open(fileobj=Sink(), mode="w|", format=tarfile.PAX_FORMAT) as tar:
                members = [(source, name)] if name else [(c, c.name) for c in sorted(source.iterdir())]
                for path, arcname in members:
                    tar.add(path, arcname=arcname, filter=tar_member)
            chunks.put(None)
        except BaseException as e:  # noqa: BLE001 - raised where the chunks are taken
            chunks.put(e)
    threading.Thread(target=pack, daemon=True).start()
    try:
        while (chunk := chunks.get()) is not None:
            if isinstance(chunk, BaseException):
                raise KitError(f"cannot read {source} ({chunk})", hint="check that it is readable") from None
            yield chunk
    finally:
        stop.set()


def upload(runner: Runner, source: Local, dest: Remote, workspace: str,
           on_bytes: Callable[[int], None] = lambda n: None) -> tuple[str, int]:
    """source here to HOST:PATH; returns where it went on the host, and the bytes sent."""
    local_source(source)
    container = dest.host.place.container
    kind = runner.run(probe_command(container, dest.path), timeout=60).check(f"cannot look at {dest.given}").stdout
    into, name = remote_target(kind.strip(), dest, source)
    sent = 0

    def count(n: int) -> None:
        nonlocal sent
        sent += n
        on_bytes(n)
    r = runner.stream_in(unpack_command(container, workspace, into), tar_chunks(source.path, name), count,
                         timeout=STALL_S)
    r.check(f"cannot copy {source.given} to {dest.given}",
            hint="the tail above says why (free disk space on the host?)")
    return posixpath.join(into, name) if name else into, sent
