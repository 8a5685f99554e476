"""The image on every host without a registry: `docker save | gzip | ssh host 'gunzip | docker load'`.

Hosts that already hold the image ID are skipped. The compressed archive is
made once per image ID and kept in kit's cache, so a host that failed mid-way
is served again without saving the image again.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import docker
import docker.errors

from kit.commands.docker import load_command
from kit.config import FLAVORS
from kit.errors import BadInput, KitError
from kit.steps.node import Node

CHUNK = 1 << 20


@dataclass(frozen=True)
class LocalImage:
    tag: str
    id: str
    size: int
    flavor: str | None = None  # what `kit build` labelled it with; None for an image kit did not build


def local_image(client: docker.DockerClient, tag: str) -> LocalImage:
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        raise BadInput(f"image {tag} is not on this machine",
                       hint="run `kit build` first with the same kit.yaml, or set cluster.image_tag") from None
    flavor = (image.attrs["Config"].get("Labels") or {}).get("io.kit.flavor")
    return LocalImage(tag, image.id, image.attrs["Size"], flavor if flavor in FLAVORS else None)


@dataclass(frozen=True)
class Archive:
    path: Path
    sha256: str  # of the file: checked before it is reused here, and by each host before it loads it

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def archive(client: docker.DockerClient, image: LocalImage, cache: Path) -> Archive:
    """The image as a gzip'd `docker save` tarball, made once per image ID (and again if it no longer matches
    the checksum it was made with)."""
    path = cache / f"{image.id.removeprefix('sha256:')[:32]}.tar.gz"
    sums = path.with_name(path.name + ".sha256")
    if path.exists() and sums.exists() and file_sha256(path) == sums.read_text().strip():
        return Archive(path, sums.read_text().strip())
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    for old in list(cache.glob("*.tar.gz")) + list(cache.glob("*.sha256")):  # one archive is enough
        old.unlink()
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{path.name}.", suffix=".part")  # two ups: two files
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=_Hashing(raw, h), mode="wb", compresslevel=1) as out:
            for chunk in client.images.get(image.tag).save(chunk_size=CHUNK, named=True):
                out.write(chunk)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sums.write_text(h.hexdigest() + "\n")
    return Archive(path, h.hexdigest())


class _Hashing:
    """A file that hashes what is written to it."""

    def __init__(self, f, h) -> None:
        self.f, self.h = f, h

    def write(self, data: bytes) -> int:
        self.h.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            yield block


def needs_image(node: Node, image: LocalImage) -> bool:
    return node.facts.image_id != image.id


def send(node: Node, image: LocalImage, archive: Archive, on_bytes: Callable[[int], None]) -> None:
    result = node.runner.stream_in(load_command(archive.sha256), chunks(archive.path), on_bytes)
    result.check(f"loading image {image.tag} failed",
                 hint="check free disk space and that Docker runs on the host, then run kit up again")
    node.changes.append(f"loaded image {image.tag} ({archive.size / 1e6:,.0f} MB compressed)")


def loaded_id(node: Node, image: LocalImage) -> str:
    r = node.runner.run(f"docker image inspect --format '{{{{.Id}}}}' {image.tag}")
    return r.stdout.strip() if r.ok else ""


def check_same(nodes: list[Node], image: LocalImage, dry_run: bool) -> None:
    """Every host must end with the very image ID built here."""
    wrong = {n.name: got for n in nodes if (got := (image.id if dry_run else loaded_id(n, image))) != image.id}
    if wrong:
        listed = ", ".join(f"{h} has {i[:19] or 'none'}" for h, i in wrong.items())
        raise KitError(f"hosts hold a different image than {image.tag} ({image.id[:19]}): {listed}",
                       hint="run kit up again to replace it; if it persists, remove the tag on those hosts")
