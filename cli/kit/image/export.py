"""`kit export`: kit's image as one file a Slurm site's container runtime takes. enroot (pyxis): the image's root
filesystem as a squashfs, made the way `enroot import dockerd://IMAGE` makes it (the same files written into the root,
the same mksquashfs options); Apptainer: the image as `docker save` writes it, for `apptainer build`. Neither runtime
is needed here: the files are made from the local Docker engine's image with tar and mksquashfs."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from kit.errors import BadInput, KitError

FORMATS = ("enroot", "docker-archive")
SUFFIX = {"enroot": ".sqsh", "docker-archive": ".tar"}

# enroot's default ENROOT_SQUASH_OPTIONS (enroot.in, doc/cmd/import.md): lzo metadata, data blocks left uncompressed,
# which is also the fastest squashfs to make and to read.
SQUASH_OPTIONS = ("-comp", "lzo", "-noD", "-exit-on-error")

# What enroot's docker::configure writes as /etc/rc.local: an empty hook sourced by /etc/rc.
RC_LOCAL = ("# This file is sourced by /etc/rc when the container starts.\n"
            "# It can be used to manipulate the entrypoint or the command of the container.\n")


@dataclass(frozen=True)
class Exported:
    path: Path
    image_id: str
    skipped: bool      # the file already held this image: nothing was done
    seconds: float
    size: int


def default_output(tag: str, fmt: str, folder: Path | None = None) -> Path:
    """The file named after the image, as enroot names an import (`repo:tag` -> `repo+tag.sqsh`)."""
    name = tag.replace(":", "+").replace("/", "+")
    return (folder or Path.cwd()) / f"{name}{SUFFIX[fmt]}"


def marker(output: Path) -> Path:
    """The sidecar that records which image the output holds: FILE.id."""
    return output.with_name(output.name + ".id")


def is_current(output: Path, image_id: str) -> bool:
    """Whether output already holds this image (its sidecar names the same image id), so there is nothing to do."""
    try:
        return output.is_file() and marker(output).read_text().strip() == image_id
    except OSError:
        return False


def check_tools(fmt: str, which: Callable[[str], str | None] = shutil.which) -> None:
    """Before any work: the programs the format needs are on PATH."""
    missing = [t for t in ("tar", "mksquashfs") if fmt == "enroot" and which(t) is None]
    if missing:
        raise BadInput(f"kit export --to enroot needs {' and '.join(missing)}, which is not on this machine's PATH",
                       hint="install squashfs-tools (e.g. apt-get install squashfs-tools) and run it again")


def find_image(client, tag: str):
    """The local image, or a BadInput naming it."""
    import docker.errors
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        raise BadInput(f"image {tag} is not on this machine's Docker engine",
                       hint="build it with `kit build` (same kit.yaml), or give an image `docker images` lists "
                            "with --image") from None


# ---------------------------------------------------------------- enroot's files in the root

def bash_quote(word: str) -> str:
    """A word as bash's ${var@Q} writes it (enroot's rc uses it): always single-quoted."""
    return "'" + word.replace("'", "'\\''") + "'"


def enroot_files(attrs: dict, uri: str) -> dict[str, str]:
    """The files enroot's docker::configure writes into the root (path below the root -> text), from an image's
    inspect attributes (Config: Env, Entrypoint, Cmd, WorkingDir, Volumes, Labels)."""
    config = attrs.get("Config") or {}
    fstab = "".join(f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n"
                    for v in sorted(config.get("Volumes") or {}))
    environ = "".join(f"{e}\n" for e in config.get("Env") or [])
    return {"etc/fstab": fstab, "etc/environment": environ, "etc/rc": enroot_rc(config, uri), "etc/rc.local": RC_LOCAL}


def enroot_rc(config: dict, uri: str) -> str:
    """/etc/rc, the script enroot starts a container with: provenance and labels as comments, the working directory,
    then the entrypoint with the arguments given (srun's command), else with the image's Cmd."""
    labels = "".join(f"# {k} {str(v).replace(chr(10), ' ')}\n" for k, v in (config.get("Labels") or {}).items())
    workdir = config.get("WorkingDir") or "/"
    entrypoint, cmd = list(config.get("Entrypoint") or []), list(config.get("Cmd") or [])
    if not entrypoint and not cmd:
        cmd = ["/bin/sh"]
    ep, args = " ".join(map(bash_quote, entrypoint)), " ".join(map(bash_quote, cmd))
    return (f"# enroot-provenance: {uri}\n{labels}\n"
            f'mkdir -p "{workdir}" 2> /dev/null\n'
            f'cd "{workdir}" && unset OLDPWD || exit 1\n\n'
            "if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\n"
            f'if [ $# -gt 0 ]; then\n    exec {ep} "$@"\nelse\n    exec {ep} {args}\nfi\n')


def write_enroot_files(rootfs: Path, attrs: dict, uri: str) -> None:
    """Write them (over what the image had there: enroot does the same), and make the working directory."""
    for rel, text in enroot_files(attrs, uri).items():
        path = rootfs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():  # the image's, not ours to follow
            path.unlink()
        path.write_text(text)
    workdir = ((attrs.get("Config") or {}).get("WorkingDir") or "/").lstrip("/")
    (rootfs / workdir).mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------- the commands

def tar_argv(rootfs: Path) -> list[str]:
    """Unpack a container's export as enroot does (no /dev content, no .dockerenv), owners by number: the host's
    user names must not remap the image's."""
    return ["tar", "-C", str(rootfs), "--warning=no-timestamp", "--anchored", "--exclude=dev/*",
            "--exclude=.dockerenv", "--numeric-owner", "-px"]


def mksquashfs_argv(rootfs: Path, output: Path, processors: int) -> list[str]:
    """enroot's own call: every file root's (enroot maps root to the user who starts the container)."""
    return ["mksquashfs", str(rootfs), str(output), "-all-root", "-no-progress", "-processors", str(processors),
            *SQUASH_OPTIONS]


def fixperms_argvs(rootfs: Path) -> list[list[str]]:
    """enroot's common::fixperms: an unprivileged user (root mapped to them) must read every file and enter and
    write every folder, as root could with CAP_DAC_OVERRIDE."""
    return [["chmod", "-f", "-R", "u+rX", str(rootfs)],
            ["find", str(rootfs), "-maxdepth", "15", "-type", "d", "!", "-perm", "-u=w", "-exec", "chmod", "-f",
             "u+w", "{}", "+"]]


def _run(argv: list[str], stdin=None, check: bool = True) -> None:
    r = subprocess.run(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if check and r.returncode != 0:
        tail = "\n".join(r.stdout.decode(errors="replace").strip().splitlines()[-8:])
        raise KitError(f"{argv[0]} failed (exit {r.returncode})", command=shlex.join(argv), output_tail=tail,
                       hint="see its output above; free disk space beside the output file if it says so")


# ---------------------------------------------------------------- exporting

def check_space(folder: Path, image_size: int, copies: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < copies * image_size:
        raise BadInput(f"{folder} has {free / 1e9:.1f} GB free; exporting this image needs about "
                       f"{copies * image_size / 1e9:.1f} GB there", hint="free space there, or give -o a path "
                                                                         "on a disk with room")


def export_enroot(client, tag: str, output: Path, on_status: Callable[[str], None] = lambda s: None) -> Exported:
    """The image's root filesystem as one squashfs at output, unless output already holds it."""
    check_tools("enroot")
    image = find_image(client, tag)
    if is_current(output, image.id):
        return Exported(output, image.id, True, 0.0, output.stat().st_size)
    check_space(output.parent, image.attrs.get("Size", 0), 2)  # the unpacked root and the squashfs
    started = time.monotonic()
    marker(output).unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".kit-export-", dir=output.parent))  # beside: one rename at the end
    try:
        rootfs = work / "rootfs"
        rootfs.mkdir()
        on_status(f"unpacking {tag}'s root filesystem")
        _unpack(client, image, tag, rootfs)
        for argv in fixperms_argvs(rootfs):
            _run(argv, check=False)  # as enroot: best effort (`|| :`)
        write_enroot_files(rootfs, image.attrs, f"dockerd://{tag}")
        on_status("making the squashfs (mksquashfs)")
        _run(mksquashfs_argv(rootfs, work / "image.sqsh", os.cpu_count() or 1))
        os.chmod(work / "image.sqsh", 0o644)
        os.replace(work / "image.sqsh", output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    marker(output).write_text(image.id + "\n")
    return Exported(output, image.id, False, time.monotonic() - started, output.stat().st_size)


def _unpack(client, image, tag: str, rootfs: Path) -> None:
    """A created, never started container's filesystem, streamed from the engine into tar."""
    box = client.containers.create(image.id, network_disabled=True, labels={"io.kit.export": "1"})
    try:
        tar = subprocess.Popen(tar_argv(rootfs), stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _feed(tar.stdin, box.export(chunk_size=1 << 20))
        except BrokenPipeError:
            pass  # tar stopped early: its exit status and message say why
        finally:
            tar.stdin.close()
            err = tar.stderr.read().decode(errors="replace")
            tar.wait()
        if tar.returncode != 0:
            raise KitError(f"unpacking image {tag} failed (tar exit {tar.returncode})",
                           command=shlex.join(tar_argv(rootfs)), output_tail=err.strip()[-2000:],
                           hint="free disk space beside the output file if it says so")
    finally:
        box.remove(force=True)


def _feed(sink, chunks: Iterable[bytes]) -> None:
    for chunk in chunks:
        sink.write(chunk)


def export_docker_archive(client, tag: str, output: Path) -> Exported:
    """`docker save` of the image at output (mode 0644, whole or not at all), unless output already holds it."""
    image = find_image(client, tag)
    if is_current(output, image.id):
        return Exported(output, image.id, True, 0.0, output.stat().st_size)
    check_space(output.parent, image.attrs.get("Size", 0), 1)
    started = time.monotonic()
    marker(output).unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            _feed(f, image.save(chunk_size=1 << 20, named=tag if tag in image.tags else False))
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    marker(output).write_text(image.id + "\n")
    return Exported(output, image.id, False, time.monotonic() - started, output.stat().st_size)
