"""The job's folder on every host, at the workspace path (storage: copy): only files that changed are
sent. After the job, what its ranks wrote on each host is copied to every other host, so rank 0's
checkpoint and rank 2's log are at the same path everywhere.

Nothing is deleted there: checkpoints and outputs that ranks wrote stay.
"""

from __future__ import annotations

import base64
import hashlib
import io
import shlex
import tarfile
from collections import defaultdict
from pathlib import Path

from kit.steps.node import Node

SKIP = {".git", "__pycache__", ".venv", ".kit", ".pytest_cache"}


def manifest(folder: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under folder (without VCS and cache folders)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not SKIP.intersection(rel.parts):
            out[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def remote_manifest_command(workspace: str) -> str:
    return (f"cd {shlex.quote(workspace)} 2>/dev/null && find . -type f -print0 | xargs -0 -r sha256sum")


def parse_manifest(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        if name:
            out[name.removeprefix("./")] = digest
    return out


def changed(local: dict[str, str], remote: dict[str, str]) -> list[str]:
    return [name for name, digest in local.items() if remote.get(name) != digest]


def tarball(folder: Path, names: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in names:
            tar.add(folder / name, arcname=name, recursive=False)
    return buf.getvalue()


def read_manifest(node: Node, workspace: str) -> dict[str, str]:
    return parse_manifest(node.runner.run(remote_manifest_command(workspace)).stdout)


def untar(node: Node, workspace: str, data: bytes, what: str) -> None:
    q = shlex.quote(workspace)
    node.runner.run(f"mkdir -p {q} && tar -xzf - -C {q}", stdin=data, changes=True).check(
        f"cannot copy {what} to {workspace}", hint="check free disk space on the host")


def sync(node: Node, folder: Path, workspace: str, local: dict[str, str]) -> tuple[int, dict[str, str]]:
    """Send what differs; returns the number of files sent and the host's manifest now."""
    remote = read_manifest(node, workspace)
    names = changed(local, remote)
    if names:
        untar(node, workspace, tarball(folder, names), "the job's files")
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


def pack_command(workspace: str, names: list[str]) -> str:
    """The files as a base64 gzip tarball on stdout (the runners return text); fails as tar fails."""
    return (f'tmp=$(mktemp) && tar -czf "$tmp" -C {shlex.quote(workspace)} -- {shlex.join(names)} '
            '&& base64 -w0 "$tmp"; rc=$?; rm -f "$tmp"; exit $rc')


def fetch(node: Node, workspace: str, names: list[str]) -> bytes:
    r = node.runner.run(pack_command(workspace, names), timeout=None).check(
        f"cannot read what the job wrote in {workspace}")
    return base64.b64decode(r.stdout)
