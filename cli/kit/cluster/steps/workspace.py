"""The job's folder on every host, at the workspace path (storage: copy): only files that changed are
sent. After the job, what its ranks wrote on each host is copied to every other host, so rank 0's
checkpoint and rank 2's log are at the same path everywhere.

Nothing is deleted there: checkpoints and outputs that ranks wrote stay.

What the job's .kitignore matches (gitignore's syntax), and what is never a job's input (DEFAULT_IGNORE), is neither
hashed, nor copied to a host, nor copied between hosts afterwards. The job's own --env-file files are never carried,
whatever .kitignore says: their values reach the ranks as the job's variables, and only so.

What is in a workspace is the job's: untrusted. A rank can leave a symlink there (ckpt -> /root/.ssh), and
a tar run as root on the host would follow it, reading or writing the host's files. So the workspace is
only ever read and written inside the cluster's containers, which see the workspace and nothing of the
host's; what the job wrote goes from one container to the others over the cluster's SSH, streamed.
"""

from __future__ import annotations

import os
import shlex
import tarfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import pathspec

from kit.jobs.commands.docker import command, exec_argv
from kit.errors import BadInput, read_input
from kit.cluster.steps.image import file_sha256
from kit.cluster.steps.node import Node
from kit.backends.cluster.supervisor.launch import MANIFEST, parse_manifest

COPY_TIMEOUT_S = 3600  # a bound on one copy of the job's outputs (checkpoints of many GB, over 1 GbE)

IGNORE_FILE = ".kitignore"
# Never a job's input: version control, Python's caches and virtual environments, kit's own folder, and environment
# files (secrets, mostly: a job's variables come from --env-file). They come first, so a `!` line of .kitignore brings
# one back (`!.venv/`).
DEFAULT_IGNORE = (".git/", "__pycache__/", "*.pyc", ".venv/", ".pytest_cache/", ".kit/", ".env", "*.env")


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


@dataclass(frozen=True)
class Ignore:
    """What is left out of a job's folder: gitignore's rules, as git applies them (a folder it leaves out is not
    looked into, so nothing under it comes back)."""

    spec: pathspec.GitIgnoreSpec = field(default_factory=lambda: pathspec.GitIgnoreSpec.from_lines(DEFAULT_IGNORE))
    secrets: frozenset[Path] = frozenset()  # files never carried (the job's --env-file), resolved: links to them too
    secret_files: frozenset[tuple[int, int]] = frozenset()  # and by (device, inode): a hard link to one too

    def secret(self, path: Path) -> bool:
        """Whether path is one of the job's --env-file files: itself, a link to it or a hard link of it."""
        if not self.secrets or (st := _stat(path)) is None:
            return False
        return path.resolve() in self.secrets or (st.st_dev, st.st_ino) in self.secret_files

    @classmethod
    def of(cls, folder: Path, secrets: Iterable[Path] = ()) -> "Ignore":
        """The defaults and the folder's .kitignore, if it has one; a bad line is named with its number. secrets: the
        job's --env-file files, left out wherever they are in the folder, and any link or hard link to one."""
        path, kept = folder / IGNORE_FILE, frozenset(Path(s).resolve() for s in secrets)
        ids = frozenset((st.st_dev, st.st_ino) for st in map(_stat, kept) if st)
        if not path.is_file():
            return cls(secrets=kept, secret_files=ids)
        lines = read_input(path, "ignore file", hint=f"make {path} a readable UTF-8 text file").splitlines()
        for number, line in enumerate(lines, 1):
            try:
                pathspec.GitIgnoreSpec.from_lines([line])
            except ValueError:
                raise BadInput(f"{path}:{number}: {line!r} is not a gitignore pattern",
                               hint="write one pattern a line as in .gitignore, e.g. data/, *.ckpt or !keep.ckpt; "
                                    "escape a trailing backslash or a lone ! with \\") from None
        return cls(pathspec.GitIgnoreSpec.from_lines([*DEFAULT_IGNORE, *lines]), kept, ids)

    def folder(self, rel: str) -> bool:
        return self.spec.match_file(rel.rstrip("/") + "/")

    def file(self, rel: str) -> bool:
        """A file (relative to the job's folder) is left out when it or a folder above it is."""
        parts = rel.split("/")
        return any(self.folder("/".join(parts[:i])) for i in range(1, len(parts))) or self.spec.match_file(rel)


@dataclass
class Scan:
    files: dict[str, str]   # relative path -> sha256 of each file kit copies
    left_out_files: int = 0
    left_out_folders: int = 0  # not looked into: their files are not counted


def scan(folder: Path, ignore: Ignore | None = None) -> Scan:
    """Every file under folder that ignore does not leave out, hashed; folders it leaves out are not entered."""
    ignore = ignore or Ignore()
    found = Scan({})
    for top, folders, names in os.walk(folder):  # links to folders are not followed
        rel = Path(top).relative_to(folder).as_posix()
        prefix = "" if rel == "." else rel + "/"
        kept = [d for d in folders if not ignore.folder(prefix + d)]
        found.left_out_folders += len(folders) - len(kept)
        folders[:] = sorted(kept)
        for name in sorted(names):
            path = Path(top) / name
            if not path.is_file():
                continue
            if ignore.file(prefix + name) or ignore.secret(path):
                found.left_out_files += 1
            else:
                found.files[prefix + name] = file_sha256(path)  # in blocks: a job's folder may hold GB files
    return found


def manifest(folder: Path, ignore: Ignore | None = None) -> dict[str, str]:
    """relative path -> sha256 of every file under folder that is copied (see scan)."""
    return scan(folder, ignore).files


def in_container(container: str, script: str, *, stdin: bool = False) -> str:
    """A shell script run in the cluster's container (with stdin attached when it reads it)."""
    return command(["docker", "exec", *(["-i"] if stdin else []), container, "sh", "-c", script])


def remote_manifest_command(container: str, workspace: str) -> str:
    return in_container(container, MANIFEST.format(workspace=shlex.quote(workspace)))


UNTAR = "mkdir -p {ws} && tar -xzf - -C {ws} --no-same-owner"


def changed(local: dict[str, str], remote: dict[str, str]) -> list[str]:
    return [name for name, digest in local.items() if remote.get(name) != digest]


def tarball(folder: Path, names: list[str], into: Path) -> Path:
    """The files as a gzip'd tarball on disk (streamed from there: a job's folder may hold GBs)."""
    with tarfile.open(into, mode="w:gz") as tar:
        for name in names:
            tar.add(folder / name, arcname=name, recursive=False)
    return into


def read_manifest(node: Node, workspace: str) -> dict[str, str]:
    r = node.runner.run(remote_manifest_command(node.place.container, workspace), timeout=COPY_TIMEOUT_S)
    return parse_manifest(r.check(f"cannot list the workspace {workspace} in the container").stdout)


# ---------------------------------------------------------------- after the job

def written(before: dict[str, str], after: dict[str, str], ignore: Ignore | None = None) -> dict[str, str]:
    """Files the job made or changed on one host, but what the job's folder leaves out (Python's caches...)."""
    ignore = ignore or Ignore()
    return {name: digest for name, digest in after.items() if before.get(name) != digest and not ignore.file(name)}


def spread_plan(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]],
                ignore: Ignore | None = None) -> dict[str, tuple[list[str], list[str]]]:
    """host -> (files it wrote that others lack, the hosts that lack any of them). Hosts in rank order, primary
    first: when several hosts wrote one file, the first one's copy wins. Pure."""
    winner: dict[str, tuple[str, str]] = {}  # file -> (host, digest)
    for host in before:
        for name, digest in written(before[host], after[host], ignore).items():
            winner.setdefault(name, (host, digest))
    lacking: dict[str, set[str]] = defaultdict(set)
    names: dict[str, list[str]] = defaultdict(list)
    for name, (source, digest) in sorted(winner.items()):
        targets = [h for h in after if h != source and after[h].get(name) != digest]
        if targets:
            names[source].append(name)
            lacking[source].update(targets)
    return {source: (names[source], [h for h in after if h in lacking[source]]) for source in names}


def spread_script(workspace: str, names: list[str], targets: list[str]) -> str:
    """In the source's container: the files packed once, then sent to each target's container over the cluster's
    SSH and unpacked there. Names a target it could not copy to; fails when any copy failed."""
    ws, q = shlex.quote(workspace), shlex.quote
    unpack = q(UNTAR.format(ws=ws))
    return ("tmp=$(mktemp) && trap 'rm -f \"$tmp\"' EXIT && "
            f"printf '%s\\0' {shlex.join(names)} | tar -czf \"$tmp\" -C {ws} --null -T - && rc=0 && "
            f"for t in {' '.join(q(t) for t in targets)}; do "
            f"ssh \"$t\" {unpack} < \"$tmp\" || {{ echo \"kit: copying to $t failed\" >&2; rc=1; }}; done; exit $rc")


def spread(node: Node, workspace: str, names: list[str], targets: list[str]) -> None:
    """What the job wrote on node's host, to the targets' workspaces (addresses on the cluster network)."""
    r = node.runner.run(command(exec_argv(node.place.container, ["sh", "-c", spread_script(workspace, names, targets)])),
                        timeout=COPY_TIMEOUT_S)
    r.check(f"cannot copy what the job wrote on {node.name} to the other hosts",
            hint="check free disk space and the cluster's SSH (kit status), then run the job again")
