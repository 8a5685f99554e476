"""The image, as layers, on the machine that built it: what each host needs to load it without a registry.

A layer is gzip'd once and kept in kit's cache by its digest, so an image that
changed only on top (the user's extra packages) reuses the rest, and a host
that failed mid-way is served again without saving the image again. How the
layers reach the hosts: steps/distribute.py.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from kit.config.settings import FLAVORS
from kit.errors import BadInput, KitError
from kit.cluster.steps.node import Node

if TYPE_CHECKING:  # (imported where it is used: `kit run`, `logs`, `exec` never need the docker SDK)
    import docker

CHUNK = 1 << 20


@dataclass(frozen=True)
class LocalImage:
    tag: str
    id: str
    size: int
    flavor: str | None = None  # what `kit build` labelled it with; None for an image kit did not build
    diff_ids: tuple[str, ...] = ()  # its layers, bottom first
    cuda: str | None = None   # its CUDA line (the io.kit.cuda label): which NVIDIA drivers run it


def local_image(client: docker.DockerClient, tag: str) -> LocalImage:
    import docker.errors
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        raise BadInput(f"image {tag} is not on this machine",
                       hint="run `kit build` first with the same kit.yaml, or set cluster.image_tag") from None
    labels = image.attrs["Config"].get("Labels") or {}
    flavor = labels.get("io.kit.flavor")
    return LocalImage(tag, image.id, image.attrs["Size"], flavor if flavor in FLAVORS else None,
                      tuple(image.attrs["RootFS"]["Layers"]), labels.get("io.kit.cuda") or None)


@dataclass(frozen=True)
class Blob:
    """One layer as it travels: its tar, gzip'd once on this machine and kept in kit's cache."""

    diff_id: str   # sha256:... of the layer's tar, as the image's config names it
    path: Path
    size: int
    sha256: str    # of the gzip'd file: checked here before it is reused, and by each host as it arrives

    @property
    def name(self) -> str:
        return layer_name(self.diff_id)


def layer_name(diff_id: str) -> str:
    return diff_id.removeprefix("sha256:") + ".tar.gz"


@dataclass(frozen=True)
class Layers:
    """What a host needs to load the image: its config, and the gzip'd layers from `start` up."""

    image: LocalImage
    diff_ids: tuple[str, ...]   # every layer of the image, bottom first
    config: bytes               # the image's config; its sha256 is the image ID
    blobs: tuple[Blob, ...]     # diff_ids[start:], in order
    start: int

    def stream(self, start: int) -> tuple[Blob, ...]:
        """The blobs a host whose first `start` layers are there needs."""
        return self.blobs[start - self.start:]

    def manifest(self) -> list[str]:
        return [layer_name(d) for d in self.diff_ids]


def present(diff_ids: tuple[str, ...], chains: tuple[tuple[str, ...], ...]) -> int:
    """How many of the image's bottom layers a host holds: the longest start of the image's layer chain that one
    of its images shares (Docker keeps a layer by its chain, so a layer further up counts only on the same base)."""
    best = 0
    for chain in chains:
        n = 0
        while n < min(len(chain), len(diff_ids)) and chain[n] == diff_ids[n]:
            n += 1
        best = max(best, n)
    return best


def layers(client: docker.DockerClient, image: LocalImage, cache: Path, start: int = 0) -> Layers:
    """The image's config and its layers from `start` up, gzip'd: from kit's cache (by the layer's digest, so an
    image that changed only on top reuses the rest), else from one `docker save`, each layer compressed in a pool
    beside the save. Cached layers of other images not used for a day go."""
    ids = image.diff_ids
    folder, configs = cache / "layers", cache / "configs"
    for f in (folder, configs):
        f.mkdir(mode=0o700, parents=True, exist_ok=True)
    for old in cache.glob("*.tar.gz*"):  # whole-image archives of an older kit
        old.unlink()
    config_path = configs / (image.id.removeprefix("sha256:") + ".json")
    wanted = ids[start:]
    found = {d: b for d in wanted if (b := _cached(folder, d))}
    config = config_path.read_bytes() if config_path.exists() else b""
    if "sha256:" + hashlib.sha256(config).hexdigest() != image.id or len(found) < len(set(wanted)):
        config = _from_save(client, image, folder, {d for d in wanted if d not in found}, found)
        config_path.write_bytes(config)
    _evict(folder, set(ids))
    return Layers(image, ids, config, tuple(found[d] for d in wanted), start)


def _cached(folder: Path, diff_id: str) -> Blob | None:
    path = folder / layer_name(diff_id)
    meta = path.with_suffix(".sha256")
    if not (path.exists() and meta.exists()):
        return None
    digest = meta.read_text().strip()
    if file_sha256(path) != digest:
        path.unlink()
        return None
    os.utime(path)  # used: kept by _evict
    return Blob(diff_id, path, path.stat().st_size, digest)


def _from_save(client: docker.DockerClient, image: LocalImage, folder: Path, missing: set[str],
               found: dict[str, Blob]) -> bytes:
    """Read `docker save` once: each member is hashed as it passes; a layer kit lacks (its tar's sha256 is its
    diff ID, whatever the format names it) is compressed in the pool; the config is the member whose sha256 is the
    image ID."""
    config = b""
    with tempfile.TemporaryDirectory(dir=folder, prefix=".save-") as tmp, \
            ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        jobs = []
        stream = io.BufferedReader(_Chunks(client.images.get(image.tag).save(chunk_size=CHUNK, named=True)), CHUNK)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for n, member in enumerate(tar):
                if not member.isfile():
                    continue
                raw, digest = Path(tmp) / str(n), hashlib.sha256()
                with tar.extractfile(member) as src, open(raw, "wb") as out:
                    while block := src.read(CHUNK):
                        digest.update(block)
                        out.write(block)
                diff_id = "sha256:" + digest.hexdigest()
                if diff_id == image.id:
                    config = raw.read_bytes()
                if diff_id in missing:
                    missing.discard(diff_id)
                    jobs.append(pool.submit(_compress, raw, folder, diff_id))
                else:
                    raw.unlink()
        for job in jobs:
            blob = job.result()
            found[blob.diff_id] = blob
    if missing or not config:
        what = f"layer {sorted(missing)[0][:19]}" if missing else "its config"
        raise KitError(f"`docker save {image.tag}` did not give {what}",
                       hint="this Docker saves images in a form kit does not read; tell kit's maintainers its version")
    return config


def _compress(raw: Path, folder: Path, diff_id: str) -> Blob:
    path = folder / layer_name(diff_id)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".part")  # two ups: two files
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as raw_out, gzip.GzipFile(fileobj=_Hashing(raw_out, h), mode="wb", compresslevel=1,
                                                           mtime=0) as out, open(raw, "rb") as src:
            while block := src.read(CHUNK):
                out.write(block)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        raw.unlink(missing_ok=True)
    path.with_suffix(".sha256").write_text(h.hexdigest() + "\n")
    return Blob(diff_id, path, path.stat().st_size, h.hexdigest())


def _evict(folder: Path, keep: set[str], unused_s: float = 86400) -> None:
    now = time.time()
    for path in folder.glob("*.tar.gz"):
        if "sha256:" + path.name.removesuffix(".tar.gz") not in keep and now - path.stat().st_mtime > unused_s:
            path.unlink(missing_ok=True)
            path.with_suffix(".sha256").unlink(missing_ok=True)


class _Chunks(io.RawIOBase):
    """A file to read from a generator of byte strings (docker save's stream), without copying them around."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.left = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.left:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.left = memoryview(chunk)
        n = min(len(buffer), len(self.left))
        buffer[:n], self.left = self.left[:n], self.left[n:]
        return n


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


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
