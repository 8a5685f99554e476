"""The job's folder on every host, at the workspace path: only files that changed are sent.

Nothing is deleted there: checkpoints and outputs that ranks wrote stay.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
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


def sync(node: Node, folder: Path, workspace: str, local: dict[str, str]) -> int:
    """Send what differs; returns the number of files sent."""
    remote = parse_manifest(node.runner.run(remote_manifest_command(workspace)).stdout)
    names = changed(local, remote)
    if names:
        q = shlex.quote(workspace)
        node.runner.run(f"mkdir -p {q} && tar -xzf - -C {q}", stdin=tarball(folder, names), changes=True).check(
            f"cannot copy the job's files to {workspace}", hint="check free disk space on the host")
    return len(names)
