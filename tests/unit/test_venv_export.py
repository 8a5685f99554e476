"""kit export --to venv's parts: what the image's container says of its Python, the tar members taken from the image
(renamed, and nothing that leaves the folder), the venv scripts made relative, the folder's entry point run for real
with this machine's Debian Python, and the unpacking on the far side (whole or not at all). The export of kit's real
image, moved and run with torchrun and horovodrun: lab/test_export.py; used by the Slurm lab's jobs: lab/test_slurm.py.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kit.app import app
from kit.image import venv as venvexport
from kit.config.settings import read_config, set_setting
from kit.errors import BadInput, KitError
from kit.runners import safefolder
from kit.runners.local import LocalRunner

PLAN_OUT = """python 3.11.2
stdlib /usr/lib/python3.11
site /opt/venv/lib/python3.11/site-packages
binary /usr/bin/python3.11
glibc 2.36
lib libstdc++.so.6 /usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30
lib libffi.so.8 /usr/lib/x86_64-linux-gnu/libffi.so.8.1.2
"""


def test_the_plan_is_what_the_images_container_said_and_nothing_odd_passes():
    plan = venvexport.parse_plan(PLAN_OUT)
    assert (plan.python, plan.short, plan.binary, plan.stdlib, plan.glibc) == (
        "3.11.2", "3.11", "/usr/bin/python3.11", "/usr/lib/python3.11", "2.36")
    assert plan.libs == (("libffi.so.8", "/usr/lib/x86_64-linux-gnu/libffi.so.8.1.2"),
                         ("libstdc++.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"))
    for bad in (PLAN_OUT.replace("glibc 2.36", ""), PLAN_OUT.replace("libffi.so.8 /", "../libffi /"),
                PLAN_OUT.replace("stdlib /usr/lib/python3.11", "stdlib /usr/lib/../../etc"),
                PLAN_OUT.replace("python 3.11.2", "python 3.11.2; rm -rf /")):
        with pytest.raises(KitError):
            venvexport.parse_plan(bad)


def archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> list[bytes]:
    """A docker get_archive stream: a tar, in chunks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    raw = buf.getvalue()
    return [raw[i:i + 1000] for i in range(0, len(raw), 1000)]


def entry(name: str, kind=tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.uid, info.uname = kind, link, 1000, "someone"
    return info


def test_the_images_files_are_renamed_into_the_folder_and_nothing_leaves_it():
    """From get_archive's stream of /opt/venv/bin: files, folders, links within the tree are kept (renamed, owned
    by whoever unpacks); a link to an absolute path or out of the tree, a device and a FIFO are dropped."""
    stream = archive((entry("bin/", tarfile.DIRTYPE), None), (entry("bin/torchrun"), b"x"),
                     (entry("bin/sub", tarfile.DIRTYPE), None),
                     (entry("bin/sub/ok", tarfile.SYMTYPE, "../torchrun"), None),
                     (entry("bin/sub/out", tarfile.SYMTYPE, "../../etc/shadow"), None),
                     (entry("bin/abs", tarfile.SYMTYPE, "/etc/shadow"), None),
                     (entry("bin/hard", tarfile.LNKTYPE, "bin/torchrun"), None),
                     (entry("bin/elsewhere", tarfile.LNKTYPE, "etc/shadow"), None),
                     (entry("bin/dev", tarfile.CHRTYPE), None), (entry("bin/fifo", tarfile.FIFOTYPE), None),
                     (entry("other/x"), b"y"))
    got = [(info.name, info.type, info.linkname, info.uid, info.uname)
           for info, _ in venvexport._renamed(stream, "/opt/venv/bin", "bin2")]
    assert got == [("bin2", tarfile.DIRTYPE, "", 0, ""), ("bin2/torchrun", tarfile.REGTYPE, "", 0, ""),
                   ("bin2/sub", tarfile.DIRTYPE, "", 0, ""), ("bin2/sub/ok", tarfile.SYMTYPE, "../torchrun", 0, ""),
                   ("bin2/hard", tarfile.LNKTYPE, "bin2/torchrun", 0, "")]


def test_a_venv_script_starts_the_folders_python_from_its_own_folder():
    text = venvexport.script(b"#!/opt/venv/bin/python3.11\nimport sys\nfrom torch.distributed.run import main\n")
    assert text == venvexport.RELOCATED_SHEBANG.encode() + b"import sys\nfrom torch.distributed.run import main\n"
    assert venvexport.script(b"#!/bin/sh\necho hi\n") is None and venvexport.script(b"\x7fELF\x02") is None


@pytest.fixture
def folder(tmp_path) -> Path:
    """The export's layout around this machine's own Debian Python 3.11 (the image's Python is Debian's too)."""
    if not (Path("/usr/bin/python3.11").is_file() and Path("/usr/lib/python3.11/os.py").is_file()):
        pytest.skip("needs Debian's python3.11 (the image's base)")
    plan = venvexport.parse_plan(PLAN_OUT)
    root = tmp_path / "envs" / "kit"
    (root / "bin").mkdir(parents=True)
    (root / "libs").mkdir()
    (root / "lib/python3/dist-packages").mkdir(parents=True)
    shutil.copy2("/usr/bin/python3.11", root / "bin/.python3.11")
    shutil.copytree("/usr/lib/python3.11", root / "lib/python3.11", symlinks=True,
                    ignore=shutil.ignore_patterns("sitecustomize.py", "test", "__pycache__"))
    (root / "lib/python3.11/sitecustomize.py").write_text(venvexport.SITECUSTOMIZE)
    (root / "lib/python3/dist-packages/kit_marker_pkg.py").write_text("WHERE = __file__\n")
    (root / "bin/python").write_text(venvexport.entry_point(plan, "kit-horovod:cpu-0"))
    (root / "bin/python").chmod(0o755)
    (root / "bin/python3").symlink_to("python")
    (root / "bin/tool").write_bytes(venvexport.script(b"#!/opt/venv/bin/python\nimport sys; print(sys.executable)\n"))
    (root / "bin/tool").chmod(0o755)
    return root


SHOW = ("import os, sys, kit_marker_pkg; print(sys.prefix, sys.executable, kit_marker_pkg.WHERE, "
        "os.environ.get('LD_LIBRARY_PATH'), 'libs' in open('/proc/self/environ').read())")


def test_the_entry_point_runs_the_folders_python_wherever_it_is_and_gives_the_job_its_environment(folder, tmp_path):
    """-I (which ignores PYTHONHOME) too; a Python it starts comes through it again; the job's LD_LIBRARY_PATH (set
    or not) is its own once the interpreter started (the loader had the folder's libs); moved, it still runs."""
    for env, seen in (({"PATH": "/usr/bin:/bin"}, "None"), ({"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/own"},
                                                              "/own")):
        r = subprocess.run([str(folder / "bin/python3"), "-I", "-c", SHOW], env=env, capture_output=True, text=True,
                           cwd="/")
        assert r.stdout.split() == [str(folder), str(folder / "bin/python"),
                                    str(folder / "lib/python3/dist-packages/kit_marker_pkg.py"), seen, "True"], \
            r.stderr
        child = subprocess.run([str(folder / "bin/python"), "-c", "import subprocess, sys; subprocess.run("
                                f"[sys.executable, '-c', {SHOW!r}])"], env=env, capture_output=True, text=True)
        assert child.stdout.split()[3:] == [seen, "True"], child.stderr
    moved = tmp_path / "moved"
    folder.rename(moved)
    r = subprocess.run([str(moved / "bin/tool")], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert r.stdout == f"{moved}/bin/python\n", r.stderr


def test_the_entry_point_passes_shellcheck():
    text = venvexport.entry_point(venvexport.parse_plan(PLAN_OUT), "kit-horovod:cpu-0")
    r = subprocess.run(["shellcheck", "-"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_the_folder_is_replaced_whole_or_not_at_all(tmp_path):
    """A new export takes the folder's place in one rename; one that breaks off leaves the old one as it was, and
    nothing beside it."""
    dest = tmp_path / "shared" / "kit"
    runner = LocalRunner("localhost")
    command = venvexport.unpack_command(venvexport.check_folder(str(dest)))
    record = {venvexport.MARKER: b'{"image": "sha256:1"}'}
    assert runner.stream_in(command, iter([tar_of({"bin/python": b"old", **record})]), lambda n: None).ok
    assert runner.stream_in(command, iter([tar_of({"bin/python": b"new", **record})]), lambda n: None).ok
    assert (dest / "bin/python").read_bytes() == b"new" and sorted(os.listdir(dest.parent)) == ["kit"]
    broken = tar_of({"bin/python": b"x" * 5000})[:2000]
    assert not runner.stream_in(command, iter([broken]), lambda n: None).ok
    assert (dest / "bin/python").read_bytes() == b"new" and sorted(os.listdir(dest.parent)) == ["kit"]


def test_a_folder_kit_did_not_write_is_refused_and_kept_and_its_parents_must_be_safe(tmp_path):
    """`-o ~/thesis` (a typo) once replaced the thesis with the export. A folder that holds files and no export of
    kit's is refused by the look before anything is written, and by the unpack itself; absent, empty, or kit's are
    taken; a folder above it that others may write (not sticky) is refused too."""
    runner = LocalRunner("localhost")
    thesis = tmp_path / "home" / "thesis"
    thesis.mkdir(parents=True)
    (thesis / "chapter1.tex").write_text("years of work")
    looked = runner.run(venvexport.target_command(str(thesis)), timeout=30)
    assert safefolder.unsafe(looked.stdout) == (str(thesis), "not empty and holds no export of kit's: kit replaces no "
                                                             "folder it did not write")
    unpack = venvexport.unpack_command(str(thesis))
    assert not runner.stream_in(unpack, iter([tar_of({"bin/python": b"x", venvexport.MARKER: b"{}"})]),
                                lambda n: None).ok
    assert os.listdir(thesis) == ["chapter1.tex"] and sorted(os.listdir(thesis.parent)) == ["thesis"]
    (thesis / "chapter1.tex").unlink()
    assert runner.run(venvexport.target_command(str(thesis)), timeout=30).stdout == ""      # empty: taken
    assert runner.run(venvexport.target_command(str(tmp_path / "new")), timeout=30).stdout == ""
    (thesis / venvexport.MARKER).write_text('{"image": "sha256:2"}')
    assert '"image": "sha256:2"' in runner.run(venvexport.target_command(str(thesis)), timeout=30).stdout
    (tmp_path / "file").write_text("")
    assert safefolder.unsafe(runner.run(venvexport.target_command(str(tmp_path / "file")), timeout=30).stdout)[1] == \
        "not a folder"
    thesis.parent.chmod(0o777)
    assert safefolder.unsafe(runner.run(venvexport.target_command(str(thesis)), timeout=30).stdout) == \
        (str(thesis.parent), "mode 777: others may rename what is in it")
    thesis.parent.chmod(0o1777)
    assert safefolder.unsafe(runner.run(venvexport.target_command(str(thesis)), timeout=30).stdout) is None


def test_kit_export_refuses_a_folder_it_did_not_write_with_exit_2_before_docker(tmp_path, monkeypatch):
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "chapter1.tex").write_text("years of work")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")   # nothing of Docker is needed to refuse
    r = CliRunner().invoke(app, ["export", "--to", "venv", "-o", str(thesis)])
    assert r.exit_code == 2, r.output
    assert f"{thesis} is not empty and holds no export of kit's" in " ".join(r.output.split())
    assert os.listdir(thesis) == ["chapter1.tex"]


@pytest.mark.parametrize("bad", ["relative/kit", "/", "/shared/../etc", "/shared/$(id)", "/shared/a b"])
def test_a_folder_that_is_not_a_plain_absolute_path_is_refused(bad):
    with pytest.raises(BadInput, match="is not an absolute folder path"):
        venvexport.check_folder(bad)


@pytest.mark.parametrize("before, after", [
    (None, 'slurm:\n  python_path: "/s/kit/bin/python"\n'),
    ("cluster:\n  name: lab\n", 'cluster:\n  name: lab\nslurm:\n  python_path: "/s/kit/bin/python"\n'),
    ("slurm:\n    login: a@b  # the login host\n    workdir: x\n",
     'slurm:\n    python_path: "/s/kit/bin/python"\n    login: a@b  # the login host\n    workdir: x\n'),
    ("# ours\nslurm:\n  python_path: /old/bin/python\n  login: a\n",
     '# ours\nslurm:\n  python_path: "/s/kit/bin/python"\n  login: a\n'),
])
def test_the_nodes_python_is_recorded_in_kit_yaml_changing_no_other_line(tmp_path, monkeypatch, before, after):
    monkeypatch.chdir(tmp_path)
    if before is not None:
        (tmp_path / "kit.yaml").write_text(before)
    set_setting(read_config(None), "slurm", "python_path", "/s/kit/bin/python")
    assert (tmp_path / "kit.yaml").read_text() == after


def test_a_section_kit_cannot_edit_is_left_as_it_was_with_the_line_to_add(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kit.yaml").write_text("slurm: {login: a}\n")
    with pytest.raises(BadInput) as e:
        set_setting(read_config(None), "slurm", "python_path", "/s/kit/bin/python")
    assert e.value.hint == 'add `python_path: "/s/kit/bin/python"` under `slurm:` in kit.yaml'
    assert (tmp_path / "kit.yaml").read_text() == "slurm: {login: a}\n"
