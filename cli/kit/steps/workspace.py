"""The job's folder on every host, at the workspace path (storage: copy): only files that changed are
sent. After the job, what its ranks wrote on each host is copied to every other host, so rank 0's
checkpoint and rank 2's log are at the same path everywhere.

Nothing is deleted there: checkpoints and outputs that ranks wrote stay.

What is in a workspace is the job's: untrusted. A rank can leave a symlink there (ckpt -> /root/.ssh), and
a tar run as root on the host would follow it, reading or writing the host's files. So the workspace is
only ever read and written inside the cluster's containers, which see the workspace and nothing of the
host's; what the job wrote goes from one container to the others over the cluster's SSH, streamed.
"""

from __future__ import annotations

import shlex
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

from kit.commands.docker import command, exec_argv
from kit.steps.image import chunks, file_sha256
from kit.steps.node import Node
from kit.supervisor import MANIFEST

COPY_TIMEOUT_S = 3600  # a bound on one copy of the job's outputs (checkpoints of many GB, over 1 GbE)

SKIP = {".git", "__pycache__", ".venv", ".kit", ".pytest_cache"}


def manifest(folder: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under folder (without VCS and cache folders)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not SKIP.intersection(rel.parts):
            out[rel.as_posix()] = file_sha256(path)  # in blocks: a job's folder may hold GB files
    return out


def in_container(container: str, script: str, *, stdin: bool = False) -> str:
    """A shell script run in the cluster's container (with stdin attached when it reads it)."""
    return command(["docker", "exec", *(["-i"] if stdin else []), container, "sh", "-c", script])


def remote_manifest_command(container: str, workspace: str) -> str:
    return in_container(container, MANIFEST.format(workspace=shlex.quote(workspace)))


UNTAR = "mkdir -p {ws} && tar -xzf - -C {ws} --no-same-owner"


def untar_command(container: str, workspace: str) -> str:
    return in_container(container, UNTAR.format(ws=shlex.quote(workspace)), stdin=True)


def parse_manifest(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if name:
            out[name.removeprefix("./")] = digest
    return out


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


def sync(node: Node, folder: Path, workspace: str, local: dict[str, str]) -> tuple[int, dict[str, str]]:
    """Send what differs; returns the number of files sent and the host's manifest now."""
    remote = read_manifest(node, workspace)
    names = changed(local, remote)
    if names:
        with tempfile.TemporaryDirectory(prefix="kit-job-") as tmp:
            path = tarball(folder, names, Path(tmp) / "job.tar.gz")
            node.runner.stream_in(untar_command(node.place.container, workspace), chunks(path),
                                  lambda n: None).check(
                f"cannot copy the job's files to {workspace}", hint="check free disk space on the host")
    return len(names), {**remote, **local}


# ---------------------------------------------------------------- after the job

def written(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """Files the job made or changed on one host (not Python's caches)."""
    return {name: digest for name, digest in after.items()
            if before.get(name) != digest and not SKIP.intersection(name.split("/"))}


def spread_plan(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> dict[str, tuple[list[str], list[str]]]:
    """host -> (files it wrote that others lack, the hosts that lack any of them). Hosts in rank order, primary
    first: when several hosts wrote one file, the first one's copy wins. Pure."""
    winner: dict[str, tuple[str, str]] = {}  # file -> (host, digest)
    for host in before:
        for name, digest in written(before[host], after[host]).items():
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
