"""`kit export --to venv DIR`: the Python of kit's image as a folder that a Slurm site's nodes run without a
container (slurm.runtime none), from wherever the folder is put: the image's interpreter and standard library, its
venv's packages (torch and Horovod, or TensorFlow), and the shared libraries those need beyond glibc.

    DIR/bin/python        the entry point (bash): puts DIR/libs on LD_LIBRARY_PATH and runs the interpreter as
                          DIR/bin/python, so that what the job starts with sys.executable (torchrun's workers, kit's
                          ranks) comes through it again
    DIR/bin/.pythonX.Y    the image's interpreter; it finds its prefix, DIR, by the standard library beside it (also
                          with -I, which ignores PYTHONHOME)
    DIR/bin/*             the venv's scripts (torchrun, horovodrun...), each starting DIR/bin/python
    DIR/lib/pythonX.Y/    the standard library
    DIR/lib/python3/dist-packages/
                          the venv's packages, where the image's Debian Python looks under its prefix
    DIR/libs/             the libraries they link beyond glibc (libstdc++, libffi, libssl...), by soname
    DIR/kit-export.json   what this is: the image, its Python, the glibc it needs

The nodes need an x86-64 glibc as new as the image's (Debian 12: 2.36) and nothing else. A sitecustomize of kit's
gives the job back LD_LIBRARY_PATH as it was, once the interpreter has started (its loader keeps the path it started
with): a program the job runs (`git`, the site's tools) sees the node's own libraries, not the export's.

Made from one container of the image that only prints what it holds (with the network off), and the files read from
a second one that is never started. Written beside DIR and renamed into place, or, with a login host, streamed over
SSH and unpacked by tar as the login user, who owns all of it.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import tarfile
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Callable, Iterable, Iterator

from kit.errors import BadInput, KitError
from kit.runners import safefolder

VENV = "/opt/venv"
MARKER = "kit-export.json"

# Printed by a container of the image: its Python, its standard library, its venv's packages, glibc's version, and
# each library the interpreter and the extension modules link (as ldd resolves it there) that the export must carry:
# not glibc's own (the node's glibc runs them), not what the venv holds already (torch's, NumPy's), not the GPU
# driver's (the node's driver is the one that matches its kernel).
PLAN = r"""
set -eu
venv=/opt/venv
real=$(readlink -f "$venv/bin/python")
"$venv/bin/python" -c 'import sys, sysconfig
print("python", sys.version.split()[0])
print("stdlib", sysconfig.get_paths()["stdlib"])
print("site", sysconfig.get_paths()["purelib"])'
echo "binary $real"
echo "glibc $(getconf GNU_LIBC_VERSION | cut -d' ' -f2)"
stdlib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
{ echo "$real"; find "$stdlib/lib-dynload" "$venv/lib" -type f -name '*.so*'; } | while read -r f; do
    ldd "$f" 2>/dev/null || true
done | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case "$lib" in "$venv"/*) continue;; esac
    case "${lib##*/}" in
        ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libutil.so.*|libresolv.so.*|libanl.so.*|\
        libnss_*|libmvec.so.*|libcuda.so*|libnvidia-*) continue;;
    esac
    echo "lib ${lib##*/} $(readlink -f "$lib")"
done
"""

LIB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
VERSION = re.compile(r"\d+\.\d+(\.\d+)?")


@dataclass(frozen=True)
class Plan:
    python: str                       # 3.11.2
    binary: str                       # /usr/bin/python3.11
    stdlib: str                       # /usr/lib/python3.11
    site: str                         # /opt/venv/lib/python3.11/site-packages
    glibc: str                        # 2.36
    libs: tuple[tuple[str, str], ...]  # (soname, the file it is in the image)

    @property
    def short(self) -> str:
        return ".".join(self.python.split(".")[:2])


def parse_plan(text: str) -> Plan:
    """What the image's container printed. Pure; anything unexpected is kit's image not being what kit made."""
    found: dict[str, str] = {}
    libs = []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "lib":
            name, _, path = rest.partition(" ")
            if not LIB_NAME.fullmatch(name) or not path.startswith("/"):
                raise KitError(f"the image named a library as {line!r}", hint="rebuild the image with kit build")
            libs.append((name, path))
        elif word in ("python", "binary", "stdlib", "site", "glibc"):
            found[word] = rest.strip()
    missing = [k for k in ("python", "binary", "stdlib", "site", "glibc") if not found.get(k)]
    if missing or not VERSION.fullmatch(found["python"]) or not VERSION.fullmatch(found["glibc"]):
        raise KitError(f"the image does not say what its Python is ({', '.join(missing) or 'its versions'})",
                       hint=f"export an image kit build made (its Python is {VENV})")
    for key in ("binary", "stdlib", "site"):
        if not found[key].startswith("/") or ".." in PurePosixPath(found[key]).parts:
            raise KitError(f"the image's {key} is {found[key]!r}", hint="rebuild the image with kit build")
    return Plan(found["python"], found["binary"], found["stdlib"], found["site"], found["glibc"], tuple(sorted(libs)))


def read_plan(client, image) -> Plan:
    """Run PLAN in a container of the image (network off, removed after) and read what it printed."""
    try:
        out = client.containers.run(image.id, ["-c", PLAN], entrypoint="sh", network_disabled=True, remove=True,
                                    stdout=True, stderr=True, labels={"io.kit.export": "1"})
    except Exception as e:  # noqa: BLE001 - docker's ContainerError carries the script's stderr
        tail = getattr(e, "stderr", b"") or b""
        raise KitError("reading the image's Python failed", command="sh -c PLAN (kit.image.venv)",
                       output_tail=tail.decode(errors="replace")[-2000:] if isinstance(tail, bytes) else str(e),
                       hint=f"export an image kit build made (its Python is {VENV})") from None
    return parse_plan(out.decode(errors="replace"))


# ---------------------------------------------------------------- the folder's own files

def entry_point(plan: Plan, tag: str) -> str:
    """DIR/bin/python: the interpreter as DIR/bin/python (sys.executable), DIR/libs first on LD_LIBRARY_PATH; what it
    was goes along for sitecustomize to give back."""
    return f"""#!/bin/bash
# kit export --to venv of {tag}: Python {plan.python}, the image's torch/Horovod or TensorFlow. This folder's Python,
# wherever the folder is; it needs glibc {plan.glibc} or newer on the node.
self=$(readlink -f -- "${{BASH_SOURCE[0]}}")
here=${{self%/bin/*}}
unset KIT_VENV_OLD_LD_LIBRARY_PATH
[ -n "${{LD_LIBRARY_PATH+set}}" ] && export KIT_VENV_OLD_LD_LIBRARY_PATH="$LD_LIBRARY_PATH"
export LD_LIBRARY_PATH="$here/libs${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
exec -a "$here/bin/python" "$here/bin/.python{plan.short}" "$@"
"""


SITECUSTOMIZE = '''"""kit's export: LD_LIBRARY_PATH as it was before DIR/bin/python put DIR/libs on it (this
process's loader keeps the path it started with). sys.executable is DIR/bin/python, which puts it there again for a
Python the job starts."""
import os

_old = os.environ.pop("KIT_VENV_OLD_LD_LIBRARY_PATH", None)
if _old is None:
    os.environ.pop("LD_LIBRARY_PATH", None)
else:
    os.environ["LD_LIBRARY_PATH"] = _old
'''

# A script of the venv's bin/ (its first line `#!/opt/venv/bin/python`) starts DIR/bin/python from its own folder
# instead: pip's way for a shebang that cannot name the interpreter (sh runs the first two lines, Python reads a
# string).
RELOCATED_SHEBANG = "#!/bin/sh\n'''exec' \"$(dirname -- \"$(readlink -f -- \"$0\")\")/python\" \"$0\" \"$@\"\n' '''\n"


def script(data: bytes) -> bytes | None:
    """A venv script with its shebang made relative; None for what is not a script of the venv's Python."""
    first, sep, rest = data.partition(b"\n")
    if not sep or not re.fullmatch(rb"#!" + re.escape(VENV.encode()) + rb"/bin/python[0-9.]*", first.strip()):
        return None
    return RELOCATED_SHEBANG.encode() + rest


# ---------------------------------------------------------------- the stream of the folder's files

def _member(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, int(time.time())
    return info, data


def _renamed(archive: Iterable[bytes], src_root: str, dest_root: str, skip: Callable[[str], bool] = lambda n: False,
             ) -> Iterator[tuple[tarfile.TarInfo, io.BufferedReader | None]]:
    """The members of one get_archive stream (its names start with the basename of src_root) under dest_root:
    regular files, folders, and links that stay within the tree; devices, FIFOs and links leaving it are dropped."""
    reader = _ChunkReader(iter(archive))
    base = PurePosixPath(src_root).name
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        for info in tar:
            parts = PurePosixPath(info.name).parts
            if not parts or parts[0] != base or ".." in parts:
                continue
            rel = "/".join(parts[1:])
            if skip(rel):
                continue
            info.name = f"{dest_root}/{rel}" if rel else dest_root
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.issym():
                target = PurePosixPath(info.linkname)
                if target.is_absolute() or not _within(PurePosixPath(rel).parent, target):
                    continue
            elif info.islnk():
                linked = PurePosixPath(info.linkname).parts
                if not linked or linked[0] != base:
                    continue
                info.linkname = "/".join([dest_root, *linked[1:]])
            elif not (info.isfile() or info.isdir()):
                continue
            yield info, (tar.extractfile(info) if info.isfile() else None)


def _within(folder: PurePosixPath, target: PurePosixPath) -> bool:
    """Whether a relative link in `folder` (relative to the tree's root) to `target` stays in the tree."""
    depth = len(folder.parts)
    for part in target.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return False
    return True


class _ChunkReader(io.RawIOBase):
    """A file over an iterator of byte chunks (docker's archive stream), for tarfile's stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.left = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.left:
            try:
                self.left = next(self.chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self.left))
        buffer[:n], self.left = self.left[:n], self.left[n:]
        return n


def members(client, image, tag: str, plan: Plan) -> Iterator[tuple[tarfile.TarInfo, object]]:
    """Every file of the export, in order, from a created (never started) container of the image; the marker last,
    so that a folder that has it is whole."""
    box = client.containers.create(image.id, network_disabled=True, labels={"io.kit.export": "1"})
    try:
        def archive(path: str) -> Iterable[bytes]:
            return box.get_archive(path, chunk_size=1 << 20)[0]

        yield _member("bin/python", entry_point(plan, tag).encode(), 0o755)
        for alias in ("python3", f"python{plan.short}"):
            link = tarfile.TarInfo(f"bin/{alias}")
            link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "python", 0o777, int(time.time())
            yield link, None
        for info, data in _renamed(archive(plan.binary), plan.binary, f"bin/.python{plan.short}"):
            info.mode = 0o755
            yield info, data
        yield from _renamed(archive(plan.stdlib), plan.stdlib, f"lib/python{plan.short}",
                            skip=lambda rel: rel in ("sitecustomize.py", "EXTERNALLY-MANAGED")
                            or rel.startswith(("test/", "dist-packages")))
        yield _member(f"lib/python{plan.short}/sitecustomize.py", SITECUSTOMIZE.encode())
        yield from _renamed(archive(plan.site), plan.site, "lib/python3/dist-packages")
        for info, data in _renamed(archive(f"{VENV}/bin"), f"{VENV}/bin", "bin",
                                   skip=lambda rel: rel.startswith(("python", "activate", "Activate"))):
            if info.isfile() and data is not None:
                text = script(data.read())
                if text is None:
                    continue  # (a binary or another interpreter's script: nothing the nodes can run from here)
                yield _member(info.name, text, 0o755)
        for soname, path in plan.libs:
            for info, data in _renamed(archive(path), path, f"libs/{soname}"):
                if info.isfile():
                    info.mode = 0o644
                    yield info, data
        marker = {"image": image.id, "tag": tag, "python": plan.python, "glibc": plan.glibc,
                  "entry_point": "bin/python", "made_by": "kit export --to venv"}
        yield _member(MARKER, (json.dumps(marker, indent=2) + "\n").encode())
    finally:
        box.remove(force=True)


def stream(client, image, tag: str, plan: Plan, on_bytes: Callable[[int], None] = lambda n: None) -> Iterator[bytes]:
    """The export as one tar stream (POSIX format), chunk by chunk."""
    sink = _Chunks()
    with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members(client, image, tag, plan):
            if isinstance(data, bytes):
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info, data)
            if sink.chunks:
                out, sink.chunks = b"".join(sink.chunks), []
                on_bytes(len(out))
                yield out
    if sink.chunks:
        yield b"".join(sink.chunks)


class _Chunks(io.RawIOBase):
    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.chunks.append(bytes(b))
        return len(b)


def check_folder(folder: str) -> str:
    """DIR: an absolute path, as the nodes will name it (it reaches the login host's shell quoted, and kit.yaml)."""
    path = PurePosixPath(folder)
    if not path.is_absolute() or ".." in path.parts or not re.fullmatch(r"[A-Za-z0-9._/+-]+", folder) \
            or str(path) == "/":
        raise BadInput(f"--to venv: {folder!r} is not an absolute folder path (letters, digits, . _ - + and /)",
                       hint="give -o the folder on storage every node sees at the same path, e.g. "
                            "-o /shared/envs/kit")
    return str(path)


# DIR as the login host has it, before anything is written: it and every folder above it safe (kit.runners.safefolder:
# the nodes run DIR/bin/python, so whoever may rename entries above it could swap in a Python of theirs), and DIR
# absent, empty, or an export of kit's, whose record it prints (a typo, `-o ~/thesis`, is refused, not replaced).
_TARGET = safefolder.CHECK_SH + r"""
top=$(realpath -m -- "$1") || exit 1
check "$top"
[ -e "$top" ] || exit 0
[ -d "$top" ] || { echo "@@kit-unsafe notdir - - $top"; exit 3; }
if [ -f "$top/$2" ]; then head -c 4096 -- "$top/$2"; echo
elif [ -n "$(ls -A -- "$top")" ]; then echo "@@kit-unsafe notkit - - $top"; exit 3; fi
"""


def target_command(folder: str) -> str:
    """The login host's shell: whether DIR may be written (kit.runners.safefolder's mark where not) and, where it
    holds an export already, its record."""
    return f"sh -c {shlex.quote(_TARGET)} kit-export {shlex.quote(folder)} {MARKER}"


def unpack_command(folder: str) -> str:
    """The login host's shell: unpack the stream beside DIR and rename it into place, whole or not at all (a
    previous export moved aside, then removed). A DIR that became something else than kit's since target_command
    looked is left as it is."""
    q = shlex.quote
    new, old = q(f"{folder}.kit-new"), q(f"{folder}.kit-old")
    return (f"set -e; umask 022; if [ -e {q(folder)} ] && [ ! -f {q(folder + '/' + MARKER)} ] && "
            f"[ -n \"$(ls -A -- {q(folder)})\" ]; then echo '{safefolder.MARK} notkit - - {folder}'; exit 3; fi; "
            f"rm -rf {new} {old}; mkdir -p {new}; "
            f"if ! tar -x -f - -C {new} --no-same-owner; then rm -rf {new}; exit 1; fi; "
            f"if [ -e {q(folder)} ]; then mv {q(folder)} {old}; fi; mv {new} {q(folder)}; rm -rf {old}")
