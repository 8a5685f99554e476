"""`kit cp`: files and folders between this machine and a host's workspace, as `docker cp` copies them.

On a host, the workspace is only read and written inside the cluster's container (which sees the workspace and
nothing else of the host's), by tar; a path that leads out of the workspace through a link is refused there.

What comes from a host is the job's: untrusted (a rank wrote it). kit unpacks it itself, member by member, and never
runs anything of it: only files, folders and links whose targets stay inside the copy; each folder is opened without
following a link, so nothing is ever written outside the destination; no device, fifo, setuid bit or owner of the
host's lands here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import queue
import shlex
import stat
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from kit import state as st
from kit.commands.docker import command
from kit.errors import BadInput, KitError
from kit.runners.base import Reading, Runner

STALL_S = 300  # a copy fails when no byte moves for this long
CHUNK = 1 << 20
# What of an untrusted stream kit holds in memory: a member's long name or pax header (tarfile reads one whole before
# kit sees the member), and the members it left out that it names (the others are counted).
HEADER_MAX = 64 << 10
LEFT_OUT_KEPT = 1000


# ---------------------------------------------------------------- what the user typed

@dataclass(frozen=True)
class Remote:
    host: st.HostState
    path: str         # absolute, normalized, inside the workspace
    given: str        # as typed, for messages: HOST:PATH
    contents: bool    # PATH ended with /. : what the folder holds, not the folder


@dataclass(frozen=True)
class Local:
    path: Path
    given: str        # as typed: a trailing / or /. is meant
    contents: bool


def split(arg: str, hosts: list[st.HostState]) -> tuple[st.HostState, str] | None:
    """(host, path) of HOST:PATH, or None for a local path; a host kit does not know is bad input. A local path with a
    colon in its first part is written ./NAME, as for docker cp."""
    head, colon, path = arg.partition(":")
    if not colon or "/" in head or not head:
        return None
    found = next((h for h in hosts if head in (h.name, h.address)), None)
    if found is None:
        raise BadInput(f"{arg}: {head} is not a host of the cluster",
                       hint=f"use one of: {', '.join(h.name for h in hosts)} (HOST:PATH); a local path with a colon "
                            f"is written ./{arg}")
    return found, path


def remote_path(arg: str, path: str, workspace: str) -> str:
    """The absolute path of PATH (relative to the workspace, or absolute inside it), normalized; outside it is bad
    input."""
    full = posixpath.normpath(posixpath.join(workspace, path)) if path else workspace
    full = "/" + full.lstrip("/")  # normpath keeps a leading //
    if full != workspace and not full.startswith(workspace.rstrip("/") + "/"):
        raise BadInput(f"{arg}: {full} is outside the cluster's workspace {workspace}",
                       hint=f"give a path relative to the workspace (HOST:checkpoints/model.pt) or inside "
                            f"{workspace}")
    return full


def contents_of(path: str) -> bool:
    """docker cp's SRC/. : the folder's contents."""
    return path == "." or path.endswith("/.")


def endpoints(src: str, dest: str, hosts: list[st.HostState], workspace: str) -> tuple[Remote | Local, Remote | Local]:
    """(source, destination): one of them on a host (HOST:PATH), the other here."""
    ends: list[Remote | Local] = []
    for arg in (src, dest):
        found = split(arg, hosts)
        ends.append(Local(Path(arg), arg, contents_of(arg)) if found is None else
                    Remote(found[0], remote_path(arg, found[1], workspace), arg, contents_of(found[1])))
    if type(ends[0]) is type(ends[1]):
        raise BadInput(f"kit cp {src} {dest}: one of them must be on a host of the cluster, the other here",
                       hint="write the host's side as HOST:PATH, e.g. kit cp h1:checkpoints/model.pt . or "
                            "kit cp data.csv h1:")
    return ends[0], ends[1]


# ---------------------------------------------------------------- from a host

@dataclass(frozen=True)
class Target:
    """Where a copy lands here: in the folder `into`, under `name` ("": the source's contents go into `into`)."""

    into: Path
    name: str
    onto_file: bool = False  # name is an existing file: only a file may replace it


def local_target(dest: Local, source_name: str, contents: bool) -> Target:
    """docker cp's rules: into an existing folder under the source's name; else as dest, in a folder that exists."""
    path = dest.path
    if path.is_dir():
        return Target(path, "" if contents else source_name)
    if contents and path.exists():
        raise BadInput(f"{dest.given} is a file: a folder's contents go into a folder", hint="give a folder")
    if dest.given.endswith("/"):
        raise BadInput(f"{dest.given}: no such folder", hint="make it first, or drop the trailing / to copy under "
                                                               "that name")
    if not path.parent.is_dir():
        raise BadInput(f"{dest.given}: the folder {path.parent} does not exist",
                       hint=f"make it first (mkdir -p {shlex.quote(str(path.parent))})")
    return Target(path.parent, path.name, onto_file=path.exists())


# Run in the container as `sh -c PACK sh PATH WORKSPACE`: PATH as a tar stream on stdout, its top named by its last
# component; a path that leads out of the workspace through a link is refused.
PACK = ('ws=$(realpath -e -- "$2") && p=$(realpath -e -- "$1" 2>/dev/null) || '
        '{ echo "kit: $1: no such file or folder" >&2; exit 3; }; '
        'case "$p" in "$ws"|"$ws"/*) ;; *) echo "kit: $1 leads out of the workspace (a link to $p)" >&2; exit 4;; '
        'esac; '
        'cd "$(dirname -- "$p")" && exec tar -cf - -- "$(basename -- "$p")"')


def pack_command(container: str, workspace: str, path: str) -> str:
    return command(["docker", "exec", container, "sh", "-c", PACK, "sh", path, workspace])


@dataclass
class Unpacked:
    files: int = 0
    folders: int = 0
    links: int = 0
    bytes: int = 0
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (member, why): the first LEFT_OUT_KEPT
    left_out_count: int = 0   # every member left out


class _Counted:
    """A Reading whose bytes are counted (progress) and whose silence is an error naming the host."""

    def __init__(self, reading: Reading, host: str, on_bytes: Callable[[int], None]) -> None:
        self.reading, self.host, self.on_bytes = reading, host, on_bytes

    def read(self, size: int = -1) -> bytes:
        try:
            data = self.reading.read(size)
        except TimeoutError:
            raise Stalled(f"no byte came for {STALL_S} s: the copy was stopped", host=self.host or None,
                          hint="check the host (kit status) and run kit cp again") from None
        self.on_bytes(len(data))
        return data


class Stalled(KitError):
    """A copy in which no byte moved for STALL_S seconds."""


def _parts(name: str, target: Target) -> tuple[str, ...] | str:
    """The member's path under target.into, or why it is left out. Its first component is the source's own name."""
    if name.startswith("/"):
        return "an absolute name"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return "a name with .."
    if not parts:
        return "an empty name"
    rest = tuple(parts[1:])
    return rest if not target.name else (target.name, *rest)


# The headers that extend the next member (a GNU long name or link, a pax header), which tarfile reads whole.
_EXTENSIONS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
               tarfile.SOLARIS_XHDTYPE)


class _Bounded(tarfile.TarInfo):
    """A member whose long name or pax header is refused beyond HEADER_MAX, before tarfile reads it into memory."""

    def _proc_member(self, tar):
        if self.type in _EXTENSIONS and self.size > HEADER_MAX:
            raise tarfile.SubsequentHeaderError(f"a header of {self.size} bytes; kit reads one of {HEADER_MAX} at most")
        return super()._proc_member(tar)


NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Unpacker:
    """Writes an untrusted tar stream's members under target.into/target.name, through folders each opened without
    following a link. Links are made last, once every folder is there, and only those whose target is inside the copy
    along real folders (none through a link: a link on the way could lead anywhere)."""

    def __init__(self, target: Target) -> None:
        self.target, self.done = target, Unpacked()
        self.umask = _umask()  # applied to the modes that came, as tar does for a user: the job's are not ours to set
        self.copy = (target.name,) if target.name else ()  # the copy's own folder (or file), under into
        self.written: set[tuple[str, ...]] = set()
        self.links: list[tuple[tuple[str, ...], str, str]] = []  # (path, link target, member)

    def run(self, stream, host: str, on_bytes: Callable[[int], None]) -> Unpacked:
        self.root = os.open(self.target.into, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            with tarfile.open(fileobj=_Counted(stream, host, on_bytes), mode="r|", tarinfo=_Bounded) as tar:
                for member in tar:
                    self._leave_out(member.name, self._member(tar, member))
                    tar.members.clear()  # (tarfile keeps every member it read: a stream has no end kit can trust)
            for path, link, name in self.links:
                self._leave_out(name, self._guarded(lambda: self._link(path, link)))
        except tarfile.TarError as e:
            raise KitError(f"what came is not a whole tar stream ({e})", host=host or None,
                           hint="run kit cp again; `kit exec` to the host shows what is at the path") from None
        finally:
            os.close(self.root)
        return self.done

    def _leave_out(self, member: str, why: str | None) -> None:
        if why:
            self.done.left_out_count += 1
            if len(self.done.left_out) < LEFT_OUT_KEPT:
                self.done.left_out.append((member, why))

    def _member(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> str | None:
        parts = _parts(m.name, self.target)
        if isinstance(parts, str):
            return parts
        if not parts:  # the source folder itself, when its contents go into an existing folder
            return None if m.isdir() else "not a folder"
        if self.target.onto_file and (len(parts) > 1 or not m.isreg()):
            raise BadInput(f"{self.target.into / self.target.name} is a file: a folder cannot be copied onto it",
                           hint="give a folder or a new name as the destination")
        if m.issym():
            self.links.append((parts, m.linkname, m.name))
            return None
        if m.islnk():
            return self._guarded(lambda: self._hard_link(parts, m.linkname))
        if m.isdir():
            return self._guarded(lambda: self._folder(parts, m))
        if m.isreg():
            return self._guarded(lambda: self._file(parts, tar.extractfile(m), m))
        return "a device, fifo or socket"

    def _guarded(self, act: Callable[[], str | None]) -> str | None:
        try:
            return act()
        except OSError as e:
            return "a link or a file is in its way here" if e.errno in (errno.ELOOP, errno.ENOTDIR) else \
                (e.strerror or str(e))

    def _open(self, parts: tuple[str, ...], make: bool = True) -> int:
        """The folder into/parts..., made where missing (make), each opened without following a link."""
        fd = os.dup(self.root)
        for part in parts:
            try:
                try:
                    nxt = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not make:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    nxt = os.open(part, NOFOLLOW_DIR, dir_fd=fd)
            finally:
                os.close(fd)
            fd = nxt
        return fd

    def _folder(self, parts: tuple[str, ...], m: tarfile.TarInfo) -> None:
        fd = self._open(parts)
        try:
            os.fchmod(fd, (m.mode & 0o777 & ~self.umask) | 0o700)  # no setgid or sticky bit; ours to write into
        finally:
            os.close(fd)
        self.done.folders += 1

    def _file(self, parts: tuple[str, ...], data, m: tarfile.TarInfo) -> None:
        parent = self._open(parts[:-1])
        try:
            fd = _create(parent, parts[-1])
            try:
                while block := data.read(CHUNK):
                    view = memoryview(block)
                    while view:
                        view = view[os.write(fd, view):]
                    self.done.bytes += len(block)
                os.fchmod(fd, m.mode & 0o777 & ~self.umask)  # no setuid, setgid or sticky bit
                with contextlib.suppress(OSError, OverflowError, ValueError):  # a time no file can have: now's
                    os.utime(fd, (m.mtime, m.mtime))
            finally:
                os.close(fd)
        finally:
            os.close(parent)
        self.written.add(parts)
        self.done.files += 1

    def _hard_link(self, parts: tuple[str, ...], linkname: str) -> str | None:
        source = _parts(linkname, self.target)
        if isinstance(source, str) or source not in self.written:
            return f"a hard link to what is not a file of the copy ({linkname})"
        src, dst = self._open(source[:-1], make=False), self._open(parts[:-1])
        try:
            _clear(dst, parts[-1])
            os.link(source[-1], parts[-1], src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
        finally:
            os.close(src)
            os.close(dst)
        self.written.add(parts)
        self.done.files += 1
        return None

    def _link(self, parts: tuple[str, ...], link: str) -> str | None:
        if not self._inside(parts[:-1], link):
            return f"a link out of the copy (to {link})"
        parent = self._open(parts[:-1])
        try:
            _clear(parent, parts[-1])
            os.symlink(link, parts[-1], dir_fd=parent)
        finally:
            os.close(parent)
        self.done.links += 1
        return None

    def _inside(self, folder: tuple[str, ...], link: str) -> bool:
        """Whether a link in folder (under into) to `link` leads inside the copy: relative, and every step before its
        last through a real folder here (made before any link), so that reading it as text is what it resolves to."""
        if not link or link.startswith("/"):
            return False
        path, steps = list(folder), [s for s in link.split("/") if s not in ("", ".")]
        for i, step in enumerate(steps):
            if step == "..":
                if not path:
                    return False
                path.pop()
            else:
                path.append(step)
                if i < len(steps) - 1 and not self._real_folder(tuple(path)):
                    return False
        return tuple(path[:len(self.copy)]) == self.copy

    def _real_folder(self, parts: tuple[str, ...]) -> bool:
        try:
            os.close(self._open(parts, make=False))
            return True
        except OSError:
            return False


def _umask() -> int:
    """This process's umask (reading it means setting it: put back at once)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _create(parent: int, name: str) -> int:
    """A regular file to write, made anew where a link was (never written through); O_NONBLOCK: a fifo in the way
    does not hang kit."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, 0o600, dir_fd=parent)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        os.unlink(name, dir_fd=parent)
        fd = os.open(name, flags, 0o600, dir_fd=parent)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EEXIST, "something that is not a file is in its way here")
    return fd


def _clear(parent: int, name: str) -> None:
    """A file or link in the way of a link goes (never a folder)."""
    try:
        if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        pass


def unpack(stream, target: Target, on_bytes: Callable[[int], None] = lambda n: None, host: str = "") -> Unpacked:
    """Unpack an untrusted tar stream (a Reading) at target: each member lands under target.into/target.name, or is
    left out with the reason; nothing is written elsewhere."""
    return Unpacker(target).run(stream, host, on_bytes)


def source_name(source: Remote) -> str:
    """The name a copy of source takes in a folder."""
    return posixpath.basename(source.path) or "workspace"


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


def remote_target(kind: str, dest: Remote, source: Local) -> tuple[str, str]:
    """(the host's folder the copy goes into, its name there; "": the source's contents), by docker cp's rules."""
    if kind == "folder":
        return dest.path, "" if source.contents else source.path.resolve().name
    if kind == "noparent" or dest.given.endswith("/"):
        raise BadInput(f"{dest.given}: the folder {posixpath.dirname(dest.path) if kind == 'noparent' else dest.path} "
                       f"does not exist on {dest.host.name}", hint="copy into a folder that exists (kit cp makes none)")
    if kind == "file" and source.path.is_dir():
        raise BadInput(f"{dest.given} is a file: a folder cannot be copied onto it", hint="give a folder or a new name")
    return posixpath.dirname(dest.path), posixpath.basename(dest.path)


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


def local_source(source: Local) -> None:
    if not source.path.exists() and not source.path.is_symlink():
        raise BadInput(f"{source.given}: no such file or folder", hint="give a file or folder of this machine")
    if source.contents and not source.path.is_dir():
        raise BadInput(f"{source.given} is not a folder: /. takes a folder's contents", hint="drop the /.")
