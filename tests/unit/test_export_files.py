"""`kit export`: the files written into an enroot root (the same bytes enroot's docker::configure writes), the exact
tar and mksquashfs calls, when an export is skipped, and bad input refused before any work."""

import os
from pathlib import Path

import docker.errors
import pytest

from helpers import run_kit
from kit.image import export as ex
from kit.errors import BadInput

# The inspect attributes of kit's cpu image (docker image inspect, abridged to what enroot reads).
KIT_CPU = {"Id": "sha256:" + "ab" * 32, "Architecture": "amd64", "Size": 2_060_000_000, "Config": {
    "Env": ["PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "DEBIAN_FRONTEND=noninteractive", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "PYTHONUNBUFFERED=1",
            "VIRTUAL_ENV=/opt/venv", "KIT_SSH_PORT=12345"],
    "Entrypoint": ["/opt/kit/entrypoint.sh"], "Cmd": ["sshd"], "WorkingDir": "", "Volumes": None,
    "Labels": {"io.kit.flavor": "cpu", "io.kit.horovod": "horovod==0.28.1", "io.kit.key": "0123456789ab",
               "io.kit.torch": "2.13.0"}}}

RC_TAIL = """
if [ -s /etc/rc.local ]; then
    . /etc/rc.local
fi

if [ $# -gt 0 ]; then
"""


def test_the_root_gets_enroots_files_from_the_images_config():
    files = ex.enroot_files(KIT_CPU, "dockerd://kit-horovod:cpu-0123456789ab")
    assert files == {
        "etc/fstab": "",
        "etc/environment": "\n".join(KIT_CPU["Config"]["Env"]) + "\n",
        "etc/rc": ("# enroot-provenance: dockerd://kit-horovod:cpu-0123456789ab\n"
                   "# io.kit.flavor cpu\n# io.kit.horovod horovod==0.28.1\n# io.kit.key 0123456789ab\n"
                   "# io.kit.torch 2.13.0\n\n"
                   'mkdir -p "/" 2> /dev/null\ncd "/" && unset OLDPWD || exit 1\n' + RC_TAIL +
                   "    exec '/opt/kit/entrypoint.sh' \"$@\"\nelse\n    exec '/opt/kit/entrypoint.sh' 'sshd'\nfi\n"),
        "etc/rc.local": ("# This file is sourced by /etc/rc when the container starts.\n"
                         "# It can be used to manipulate the entrypoint or the command of the container.\n"),
    }


def test_volumes_workdir_quotes_and_no_command_as_enroot_writes_them(tmp_path):
    attrs = {"Config": {"Env": None, "Entrypoint": None, "Cmd": ["python", "-c", "print('hi')", "a b"],
                        "WorkingDir": "/work/dir", "Volumes": {"/data": {}, "/cache": {}},
                        "Labels": {"note": "two\nlines"}}}
    files = ex.enroot_files(attrs, "dockerd://x:y")
    assert files["etc/fstab"] == ("${ENROOT_ROOTFS}/cache /cache none x-create=dir,bind,rw,nosuid,nodev\n"
                                  "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n")
    assert files["etc/environment"] == ""
    assert files["etc/rc"].startswith('# enroot-provenance: dockerd://x:y\n# note two lines\n\nmkdir -p "/work/dir"')
    assert files["etc/rc"].endswith("""    exec  "$@"\nelse\n    exec  'python' '-c' 'print('\\''hi'\\'')' 'a b'\nfi\n""")
    assert ex.enroot_files({"Config": {}}, "u")["etc/rc"].endswith("""else\n    exec  '/bin/sh'\nfi\n""")
    ex.write_enroot_files(tmp_path, attrs, "dockerd://x:y")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "etc", "etc/environment", "etc/fstab", "etc/rc", "etc/rc.local", "work", "work/dir"]


def test_an_images_link_where_enroot_writes_is_replaced_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("keep")
    (tmp_path / "root" / "etc").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "environment").symlink_to(outside)
    ex.write_enroot_files(tmp_path / "root", KIT_CPU, "u")
    assert outside.read_text() == "keep"
    assert (tmp_path / "root" / "etc" / "environment").read_text().startswith("PATH=/opt/venv/bin:")


def test_tar_and_mksquashfs_are_called_as_enroot_calls_them():
    assert ex.mksquashfs_argv(Path("/x/.kit-export-1/rootfs"), Path("/x/.kit-export-1/image.sqsh"), 2) == [
        "mksquashfs", "/x/.kit-export-1/rootfs", "/x/.kit-export-1/image.sqsh", "-all-root", "-no-progress",
        "-processors", "2", "-comp", "lzo", "-noD", "-exit-on-error"]
    assert ex.tar_argv(Path("/x/rootfs")) == [
        "tar", "-C", "/x/rootfs", "--warning=no-timestamp", "--anchored", "--exclude=dev/*", "--exclude=.dockerenv",
        "--numeric-owner", "-px"]
    assert ex.fixperms_argvs(Path("/x/rootfs")) == [
        ["chmod", "-f", "-R", "u+rX", "/x/rootfs"],
        ["find", "/x/rootfs", "-maxdepth", "15", "-type", "d", "!", "-perm", "-u=w", "-exec", "chmod", "-f", "u+w",
         "{}", "+"]]


def test_the_default_file_is_named_after_the_image_as_enroot_names_an_import(tmp_path):
    assert ex.default_output("kit-horovod:cpu-0123456789ab", "enroot", tmp_path) == \
        tmp_path / "kit-horovod+cpu-0123456789ab.sqsh"
    assert ex.default_output("lab/kit:gpu", "docker-archive", tmp_path) == tmp_path / "lab+kit+gpu.tar"


def test_an_export_is_skipped_only_when_the_file_holds_this_very_image(tmp_path):
    out = tmp_path / "kit.sqsh"
    assert not ex.is_current(out, "sha256:aa")
    (tmp_path / "kit.sqsh.id").write_text("sha256:aa\n")
    assert not ex.is_current(out, "sha256:aa")  # a record of a file that is gone
    out.write_bytes(b"hsqs")
    assert ex.is_current(out, "sha256:aa")
    assert not ex.is_current(out, "sha256:bb")  # the image was rebuilt: export again
    (tmp_path / "kit.sqsh.id").unlink()
    assert not ex.is_current(out, "sha256:aa")  # a file kit did not record (or an export cut short)


class _Images:
    def __init__(self, known: dict):
        self.known = known

    def get(self, tag):
        if tag not in self.known:
            raise docker.errors.ImageNotFound(f"No such image: {tag}")
        return self.known[tag]


class _Image:
    id = KIT_CPU["Id"]
    attrs = KIT_CPU
    tags = ["kit-horovod:cpu-0123456789ab"]


class _Engine:
    """Knows one image; creating a container or saving would fail the test (a skipped export does neither)."""

    def __init__(self):
        self.images = _Images({"kit-horovod:cpu-0123456789ab": _Image()})


@pytest.mark.parametrize("fmt", ["enroot", "docker-archive"])
def test_a_file_that_holds_the_image_is_left_as_it_is(tmp_path, fmt, monkeypatch):
    monkeypatch.setattr(ex.shutil, "which", lambda name: f"/usr/bin/{name}")
    out = tmp_path / f"kit{ex.SUFFIX[fmt]}"
    out.write_bytes(b"done before")
    ex.marker(out).write_text(KIT_CPU["Id"] + "\n")
    before = out.stat().st_mtime_ns
    run = ex.export_enroot if fmt == "enroot" else ex.export_docker_archive
    done = run(_Engine(), "kit-horovod:cpu-0123456789ab", out)
    assert (done.skipped, done.image_id, done.size, out.stat().st_mtime_ns) == (True, KIT_CPU["Id"], 11, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name, out.name + ".id"]


def test_an_image_that_is_not_here_is_named_with_the_fix():
    with pytest.raises(BadInput) as e:
        ex.find_image(_Engine(), "kit-horovod:cpu-ffffffffffff")
    assert str(e.value) == "image kit-horovod:cpu-ffffffffffff is not on this machine's Docker engine"
    assert "kit build" in e.value.hint and "--image" in e.value.hint and e.value.exit_code == 2


def test_no_mksquashfs_is_bad_input_with_the_package_to_install():
    with pytest.raises(BadInput) as e:
        ex.check_tools("enroot", which=lambda name: None if name == "mksquashfs" else f"/usr/bin/{name}")
    assert str(e.value) == "kit export --to enroot needs mksquashfs, which is not on this machine's PATH"
    assert "squashfs-tools" in e.value.hint
    ex.check_tools("docker-archive", which=lambda name: None)  # docker save needs neither


def test_kit_export_without_mksquashfs_stops_before_touching_docker(tmp_path):
    """With tar but no mksquashfs on PATH: exit 2, the error and the fix, and no Docker engine is asked (none runs
    here: asking it would fail with exit 1 instead)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink("/usr/bin/tar" if os.path.exists("/usr/bin/tar") else "/bin/tar", bin_dir / "tar")
    r = run_kit("export", "--to", "enroot", "--image", "kit-horovod:cpu-0123456789ab", cwd=tmp_path,
                env={"PATH": str(bin_dir), "DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        "error: kit export --to enroot needs mksquashfs, which is not on this machine's PATH",
        "fix: install squashfs-tools (e.g. apt-get install squashfs-tools) and run it again"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


def test_to_takes_only_the_formats_kit_writes(tmp_path):
    r = run_kit("export", "--to", "oci", cwd=tmp_path, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert r.returncode == 2 and "enroot" in r.stderr and "docker-archive" in r.stderr


def _tar_of(files: dict) -> bytes:
    """A container export in miniature: a real tar stream with the given files (and /dev, /.dockerenv)."""
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        dev = tarfile.TarInfo("dev")
        dev.type, dev.mode = tarfile.DIRTYPE, 0o755
        t.addfile(dev)
        for name, text in {**files, ".dockerenv": "", "dev/console": ""}.items():
            info = tarfile.TarInfo(name)
            info.size, info.uid, info.gid, info.mode = len(text), 100, 101, 0o600
            t.addfile(info, io.BytesIO(text.encode()))
    return buf.getvalue()


class _Box:
    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def export(self, chunk_size):
        self.log.append("export")
        yield from self.stream()

    def remove(self, force):
        self.log.append("removed")


class _StreamingEngine(_Engine):
    """An engine whose container export is the given stream: tar, mksquashfs and the files are the real ones."""

    def __init__(self, stream):
        super().__init__()
        self.log = []
        engine = self

        class Containers:
            def create(self, image, **kw):
                engine.log.append(("create", image, kw["network_disabled"]))
                return _Box(stream, engine.log)
        self.containers = Containers()


needs_squashfs = pytest.mark.skipif(not (ex.shutil.which("mksquashfs") and ex.shutil.which("unsquashfs")),
                                    reason="squashfs-tools is not installed (tests/run installs it)")


@needs_squashfs
def test_a_small_export_is_a_squashfs_with_enroots_files_and_no_dev(tmp_path):
    tar = _tar_of({"bin/hello": "hi", "opt/kit/allreduce_check.py": "print(3)"})
    engine = _StreamingEngine(lambda: iter([tar[:1000], tar[1000:]]))
    out = tmp_path / "kit.sqsh"
    done = ex.export_enroot(engine, "kit-horovod:cpu-0123456789ab", out)
    assert (done.skipped, done.path, ex.marker(out).read_text()) == (False, out, KIT_CPU["Id"] + "\n")
    assert engine.log == [("create", KIT_CPU["Id"], True), "export", "removed"]
    listed = ex.subprocess.run(["unsquashfs", "-lls", str(out)], capture_output=True, text=True, check=True).stdout
    names = sorted(line.split()[-1].removeprefix("squashfs-root") for line in listed.splitlines()
                   if "squashfs-root" in line)
    assert names == ["", "/bin", "/bin/hello", "/dev", "/etc", "/etc/environment", "/etc/fstab", "/etc/rc",
                     "/etc/rc.local", "/opt", "/opt/kit", "/opt/kit/allreduce_check.py"]
    assert all(" root/root " in line for line in listed.splitlines() if "squashfs-root" in line)  # -all-root
    assert "-rw------- root/root" in next(line for line in listed.splitlines() if line.endswith("/bin/hello"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kit.sqsh", "kit.sqsh.id"]


@needs_squashfs
@pytest.mark.parametrize("stop", [KeyboardInterrupt, docker.errors.APIError])
def test_an_export_cut_short_leaves_no_scratch_no_container_and_no_file(tmp_path, stop):
    tar = _tar_of({"bin/hello": "hi" * 5000})

    def cut():
        yield tar[:4096]
        raise stop("cut")
    engine = _StreamingEngine(cut)
    out = tmp_path / "kit.sqsh"
    out.write_bytes(b"an older image")
    ex.marker(out).write_text("sha256:older\n")
    with pytest.raises(stop):
        ex.export_enroot(engine, "kit-horovod:cpu-0123456789ab", out)
    assert engine.log[-1] == "removed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kit.sqsh"]  # the old file, no longer said to be current
    assert not ex.is_current(out, "sha256:older")


def test_a_failing_tar_is_reported_with_its_command_and_message(tmp_path, monkeypatch):
    monkeypatch.setattr(ex.shutil, "which", lambda name: f"/usr/bin/{name}")
    engine = _StreamingEngine(lambda: iter([b"not a tar archive" * 64]))
    with pytest.raises(ex.KitError) as e:
        ex.export_enroot(engine, "kit-horovod:cpu-0123456789ab", tmp_path / "kit.sqsh")
    assert str(e.value).startswith("unpacking image kit-horovod:cpu-0123456789ab failed (tar exit 2)")
    assert e.value.command.startswith("tar -C ") and "This does not look like a tar archive" in e.value.output_tail
    assert engine.log[-1] == "removed" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where, said", [("folder", "is a folder"), ("missing/x.sqsh", "cannot be written: folder")])
def test_an_output_that_cannot_be_written_is_refused(tmp_path, where, said):
    (tmp_path / "folder").mkdir()
    r = run_kit("export", "--to", "docker-archive", "--image", "kit-horovod:cpu-0123456789ab", "-o", where,
                cwd=tmp_path, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"error: -o {tmp_path / where}: {said}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]
