"""The figures of `kit bench allreduce` and `kit bench train`, and their plots. Pure but for the plots' files.

Allreduce bandwidths as nccl-tests defines them: algbw = size / time; busbw = algbw x 2(n-1)/n, what each rank's
link carries in a ring allreduce, so busbw near the link rate means the network is used to the full. kit compares it
with the slowest link `kit bench net` measured: busbw / link is the headline.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from kit.errors import BadInput

MARK = "@@kit-bench "      # what the allreduce job's rank 0 puts before each figure (bench/jobs/allreduce.py)
HEADLINE_BYTES = 64 << 20  # the size the headline ratio is read at
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str, flag: str) -> int:
    """1K, 64M, 256MiB, 4096 -> bytes (powers of 1024): whole float32 elements, 4 bytes to 1 GiB."""
    m = re.fullmatch(r"(\d{1,10})\s*([KMG]?)(i?B)?", text.strip(), re.IGNORECASE)
    size = int(m[1]) * _UNITS[m[2].upper()] if m else 0
    if not 4 <= size <= 1 << 30 or size % 4:
        raise BadInput(f"{flag}: '{text}' is not a size of float32 elements from 4 bytes to 1 GiB",
                       hint=f"give e.g. {flag} 1K, 64M or 1G")
    return size


def size_text(size: int) -> str:
    for unit in ("G", "M", "K"):
        if size >= _UNITS[unit] and size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]} {unit}iB"
    return f"{size} B"


@dataclass(frozen=True)
class Allreduce:
    backend: str      # horovod or torch
    transport: str    # gloo or nccl
    ranks: int
    bytes: int
    iters: int
    seconds: float    # one allreduce

    @property
    def algbw_gbits(self) -> float:
        return self.bytes * 8 / self.seconds / 1e9

    @property
    def busbw_gbits(self) -> float:
        return self.algbw_gbits * 2 * (self.ranks - 1) / self.ranks

    @property
    def label(self) -> str:
        return f"{'Horovod' if self.backend == 'horovod' else 'torch.distributed'} ({self.transport})"

    def as_dict(self, link_gbits: float | None) -> dict:
        return {**asdict(self), "algbw_gbits": self.algbw_gbits, "busbw_gbits": self.busbw_gbits,
                "busbw_per_link": self.busbw_gbits / link_gbits if link_gbits else None}


def parse_result(text: str) -> Allreduce | None:
    """One figure from the job's rank 0, or None for any other line; a figure that does not add up is an error."""
    if not text.startswith(MARK):
        return None
    try:
        d = json.loads(text[len(MARK):])
        found = Allreduce(d["backend"], d["transport"], d["ranks"], d["bytes"], d["iters"], float(d["seconds"]))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"the allreduce job printed a figure kit cannot read: {text[:200]!r} ({e})") from None
    whole = all(type(x) is int for x in (found.ranks, found.bytes, found.iters))
    if not (found.backend in ("horovod", "torch") and found.transport in ("gloo", "nccl") and whole
            and found.ranks >= 2 and found.bytes > 0 and found.iters > 0 and 0 < found.seconds < math.inf):
        raise ValueError(f"the allreduce job printed a figure that does not add up: {text[:200]!r}")
    return found


def headline_size(results: list[Allreduce]) -> int:
    """The size the headline is read at: 64 MiB, or the nearest measured below it (else the smallest)."""
    below = [r.bytes for r in results if r.bytes <= HEADLINE_BYTES]
    return max(below) if below else min(r.bytes for r in results)


def headline(results: list[Allreduce], link_gbits: float | None) -> dict[str, float]:
    """label -> busbw / link at the headline size."""
    at = headline_size(results) if results else 0
    return {r.label: r.busbw_gbits / link_gbits for r in results if r.bytes == at} if link_gbits else {}


@dataclass(frozen=True)
class TrainRun:
    hosts: int
    ranks: int
    images_per_sec: float
    job: str


def scaling(runs: list[TrainRun]) -> list[dict]:
    """Each run's speedup over the first (fewest hosts) and its efficiency: speedup / (its ranks / the first's)."""
    base = runs[0]
    rows = []
    for r in runs:
        speedup = r.images_per_sec / base.images_per_sec
        rows.append({**asdict(r), "speedup": speedup, "efficiency": speedup / (r.ranks / base.ranks)})
    return rows


@contextlib.contextmanager
def _plot(path: Path, title: str, xlabel: str, ylabel: str, width: float):
    """A figure's axes for the block to draw on; then its title, labels, grid and legend, saved as a PNG at path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(width, 4.8), dpi=110)
    try:
        yield ax
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def plot_allreduce(results: list[Allreduce], link_gbits: float | None, title: str, path: Path) -> Path:
    """busbw against message size, a line per backend, the link rate dashed."""
    with _plot(path, title, "message size", "bus bandwidth, Gbit/s", 8) as ax:
        for label in dict.fromkeys(r.label for r in results):
            mine = sorted((r for r in results if r.label == label), key=lambda r: r.bytes)
            ax.plot([r.bytes for r in mine], [r.busbw_gbits for r in mine], marker="o", label=f"{label} busbw")
        if link_gbits:
            ax.axhline(link_gbits, color="grey", linestyle="--", label=f"slowest link {link_gbits:.2f} Gbit/s")
        ax.set_xscale("log", base=2)
        sizes = sorted({r.bytes for r in results})
        ax.set_xticks(sizes, [size_text(s).replace(" ", "") for s in sizes], rotation=45)
    return path


def plot_train(rows: list[dict], title: str, path: Path) -> Path:
    """images/s against hosts, with perfect scaling dashed and each run's efficiency written by its point."""
    with _plot(path, title, "hosts", "images/s (all ranks)", 7) as ax:
        hosts = [r["hosts"] for r in rows]
        ideal = [rows[0]["images_per_sec"] * r["ranks"] / rows[0]["ranks"] for r in rows]
        ax.plot(hosts, ideal, color="grey", linestyle="--", label="perfect scaling")
        ax.plot(hosts, [r["images_per_sec"] for r in rows], marker="o", label="measured")
        for r in rows:
            ax.annotate(f"{r['images_per_sec']:,.0f}/s, {r['efficiency']:.0%}", (r["hosts"], r["images_per_sec"]),
                        textcoords="offset points", xytext=(6, -14))
        ax.set_xticks(hosts)
        ax.set_xlim(hosts[0] - 0.3, hosts[-1] + 0.6)  # room for the last point's label
        ax.set_ylim(bottom=0)
    return path
