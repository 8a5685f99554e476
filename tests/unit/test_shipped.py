"""The supervisor's script as kit ships it (kit.backends.cluster.supervisor.shipped): kit.backends.cluster.supervisor's modules made one
standard-library-only source, run here as the primary's container runs it (`python -c SOURCE --start`)."""

import ast
import hashlib
import importlib.util
import io
import json
import shlex
import subprocess
import sys
import tarfile

import pytest

from kit.backends.cluster import run as jobs
from kit.backends.cluster.supervisor import shipped
from kit.backends.cluster.supervisor.starter import COPIED, MANIFEST_END


def test_the_shipped_supervisor_is_one_stdlib_script(tmp_path):
    """It compiles, under one `from __future__` first, and imports nothing of kit; run apart from kit, its starter
    lists the workspace, unpacks the job's files sent to it, and, its input ended before the go, removes the job's
    folder and starts nothing."""
    source = shipped.source()
    assert jobs.SUPERVISOR == source
    tree = ast.parse(compile(source, "supervisor", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + \
               [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m == "kit" or m.startswith("kit.")]
    futures = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    assert len(futures) == 1 and tree.body[0] is futures[0]
    assert set(imported) - {"__future__"} <= set(sys.stdlib_module_names)

    ws, folder = tmp_path / "ws", tmp_path / "jobs" / "20261126-093000-ab12"
    ws.mkdir()
    (ws / "had.txt").write_text("already there\n")
    request = {"folder": str(folder), "files": {"plan.json": "{}"}, "env": {}, "source": source, "follow": None,
               "workspace": str(ws), "env_file": None, "hosts": [], "job_files": {}, "copy": False}
    blob, tar = b"print('hello')\n", io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w:gz") as t:
        info = tarfile.TarInfo("train.py")
        info.size = len(blob)
        t.addfile(info, io.BytesIO(blob))
    starter = subprocess.Popen([sys.executable, "-c", source, "--start"], cwd=tmp_path, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        starter.stdin.write(json.dumps(request).encode() + b"\n")
        starter.stdin.flush()
        listed = [starter.stdout.readline().decode() for _ in range(2)]
        digest = hashlib.sha256(b"already there\n").hexdigest()
        assert listed == [f"{digest}  ./had.txt\n", MANIFEST_END + "\n"]
        assert (folder / "plan.json").read_text() == "{}\n"
        starter.stdin.write(json.dumps({"tar": len(tar.getvalue())}).encode() + b"\n" + tar.getvalue())
        starter.stdin.flush()
        assert starter.stdout.readline().decode() == COPIED + "\n"
        assert (ws / "train.py").read_bytes() == blob
        starter.stdin.close()  # kit went away before the go
        assert starter.wait(timeout=30) == 3, starter.stderr.read()
    finally:
        starter.kill()
    assert not folder.exists() and (ws / "had.txt").exists()


def test_an_import_of_kit_that_is_not_marked_fails_the_script(tmp_path):
    """A module of the script may import an earlier one only by a marked line, which the script drops; any other
    import of kit would fail in the container, so it fails here, naming the line."""
    def module(name: str, text: str):
        (tmp_path / f"{name}.py").write_text(text)
        spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
        found = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(found)
        return found
    marked = module("marked", f"from __future__ import annotations\n\nfrom kit.errors import KitError  "
                              f"{shipped.TOGETHER}\nX = 1\n")
    assert shipped.source((marked,)) == "from __future__ import annotations\n\n\n\nX = 1\n"
    lonely = module("lonely", "from __future__ import annotations\nimport json\nimport kit.errors\n")
    with pytest.raises(ValueError, match=r"lonely:3: `import kit.errors` cannot be shipped"):
        shipped.source((marked, lonely))


def test_the_supervisors_command_line_fits_one_argument_and_what_looks_for_it_reads_it_whole():
    """The supervisor runs as `python -I -c SOURCE PLAN`: the kernel takes one argument up to MAX_ARG_STRLEN (32
    pages: 128 KiB), and the scripts that tell a live supervisor by its command line's last word (the follower, kit
    jobs) read that much of it and more. (They once read 64 KiB, and the source outgrew it: every job seemed to have
    lost its supervisor 10 s after it started.)"""
    from kit.backends.cluster.supervisor.launch import SUPERVISOR_APART
    size = len(shlex.quote(shipped.source()).encode())  # (quoted: as it goes in the one argument of the host's sh -c)
    assert size < 112 << 10, f"the supervisor's source is {size} bytes: near the kernel's 128 KiB for an argument"
    bound = {}
    exec(SUPERVISOR_APART.split("\ndef ")[0], bound)
    assert bound["CMDLINE_MAX"] >= (128 << 10) + 4096
