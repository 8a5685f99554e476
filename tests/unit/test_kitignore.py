""".kitignore in the job's folder (gitignore's syntax) and the defaults: what is never hashed, copied or spread."""

import os

import pytest

from kit.errors import BadInput
from kit.backends.cluster.run import Synced
from kit.cluster.steps import workspace
from kit.cluster.steps.workspace import Ignore, scan


def tree(root, *names):
    for name in names:
        path = root / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(name)


def test_without_kitignore_what_is_never_a_jobs_input_is_left_out(tmp_path):
    tree(tmp_path, "train.py", "lib/model.py", ".git/HEAD", ".git/objects/ab/cd", "__pycache__/train.cpython-311.pyc",
         "lib/__pycache__/model.cpython-311.pyc", "lib/old.pyc", ".venv/bin/python", ".pytest_cache/v/x", "notes.txt")
    found = scan(tmp_path, Ignore.of(tmp_path))
    assert sorted(found.files) == ["lib/model.py", "notes.txt", "train.py"]
    assert (found.left_out_folders, found.left_out_files) == (5, 1)  # folders not entered; lib/old.pyc


def test_kitignore_patterns_negation_anchors_and_folders(tmp_path):
    tree(tmp_path, "train.py", "data/big.bin", "data/keep.txt", "runs/a/ckpt.pt", "runs/a/best.pt", "ckpt.pt",
         "sub/ckpt.pt", "top.log", "sub/top.log", ".kitignore")
    (tmp_path / ".kitignore").write_text("# datasets stay on the hosts\ndata/\n!data/keep.txt\n\n*.pt\n!best.pt\n"
                                         "/top.log\n")
    found = scan(tmp_path, Ignore.of(tmp_path))
    # data/ is not entered, so the ! line below it cannot bring keep.txt back (as git does)
    assert sorted(found.files) == [".kitignore", "runs/a/best.pt", "sub/top.log", "train.py"]
    assert (found.left_out_folders, found.left_out_files) == (1, 4)


def test_a_bang_line_brings_back_what_the_defaults_leave_out(tmp_path):
    tree(tmp_path, "train.py", ".venv/lib/site.py", "cached.pyc", "__pycache__/x.pyc")
    (tmp_path / ".kitignore").write_text("!.venv/\n!cached.pyc\n")
    assert sorted(scan(tmp_path, Ignore.of(tmp_path)).files) == [".kitignore", ".venv/lib/site.py", "cached.pyc",
                                                                  "train.py"]


def test_environment_files_and_the_jobs_env_files_are_never_carried(tmp_path):
    """.env and *.env are left out by default (a `!` line brings one back); the job's --env-file files are left out
    whatever their name and whatever .kitignore says, and so is a link or a hard link to one."""
    tree(tmp_path, "train.py", ".env", "prod.env", "conf/.env", "vars.txt", "keep.env", "notes.txt")
    (tmp_path / "copy.txt").symlink_to("vars.txt")
    os.link(tmp_path / "vars.txt", tmp_path / "same.txt")
    (tmp_path / ".kitignore").write_text("!keep.env\n!vars.txt\n")
    found = scan(tmp_path, Ignore.of(tmp_path, [tmp_path / "vars.txt", tmp_path.parent / "elsewhere.env"]))
    assert sorted(found.files) == [".kitignore", "keep.env", "notes.txt", "train.py"]
    assert found.left_out_files == 6
    assert "vars.txt" in scan(tmp_path, Ignore.of(tmp_path)).files  # as any file, when it is not the job's env file


def test_a_file_is_matched_as_under_its_folders():
    ignore = Ignore(workspace.pathspec.GitIgnoreSpec.from_lines([*workspace.DEFAULT_IGNORE, "data/", "!data/keep"]))
    assert ignore.file("data/keep") and ignore.file("data/sub/x") and ignore.file("a/data/x")
    assert ignore.file("pkg/__pycache__/m.cpython-311.pyc") and ignore.file(".git/config")
    assert not ignore.file("database.py") and not ignore.file("src/data.py")


def test_a_bad_line_is_named_with_its_number_and_the_fix(tmp_path):
    (tmp_path / ".kitignore").write_text("data/\n# ok\n!\n")
    with pytest.raises(BadInput) as e:
        Ignore.of(tmp_path)
    assert str(e.value) == f"{tmp_path}/.kitignore:3: '!' is not a gitignore pattern" and e.value.exit_code == 2
    assert "as in .gitignore" in e.value.hint


def test_what_a_job_wrote_is_not_spread_where_its_folder_leaves_it_out(tmp_path):
    (tmp_path / ".kitignore").write_text("cache/\n*.tmp\n")
    ignore = Ignore.of(tmp_path)
    before = {"h1": {"train.py": "1"}, "h2": {"train.py": "1"}}
    after = {"h1": {"train.py": "1", "ckpt.pt": "2", "cache/shard-0": "3", "x.tmp": "4", "__pycache__/a.pyc": "5"},
             "h2": {"train.py": "1", "cache/shard-1": "6"}}
    assert workspace.spread_plan(before, after, ignore) == {"h1": (["ckpt.pt"], ["h2"])}
    assert workspace.spread_plan(before, after) == {"h1": (["cache/shard-0", "ckpt.pt", "x.tmp"], ["h2"]),
                                                    "h2": (["cache/shard-1"], ["h1"])}  # the defaults only


def test_the_jobs_first_line_says_what_was_left_out():
    assert Synced({}, {}).left_out_text() == ""
    assert Synced({}, {}, left_out=(2, 1)).left_out_text() == \
        "; left out 1 folder and 2 files (.kitignore and kit's defaults)"
    assert Synced({}, {}, left_out=(1, 0)).left_out_text() == "; left out 1 file (.kitignore and kit's defaults)"
