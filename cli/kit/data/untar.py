"""The safe unpacking of an untrusted tar stream (what `kit cp` brings from a host: a job's files).

kit unpacks it itself, member by member, and never runs anything of it: only files, folders and links whose targets
stay inside the copy; each folder is opened without following a link, so nothing is ever written outside the
destination; no device, fifo, setuid bit or owner of the host's lands here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kit.errors import BadInput, KitError
from kit.runners.base import Reading

STALL_S = 300  # a copy fails when no byte moves for this long
CHUNK = 1 << 20
# What of an untrusted stream kit holds in memory: a member's long name or pax header (tarfile reads one whole before
# kit sees the member), and the members it left out that it names (the others are counted).
HEADER_MAX = 64 << 10
LEFT_OUT_KEPT = 1000


@dataclass(frozen=True)
class Target:
    """Where a copy lands here: in the folder `into`, under `name` ("": the source's contents go into `into`)."""

    into: Path
    name: str
    onto_file: bool = False  # name is an existing file: only a file may replace it


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
