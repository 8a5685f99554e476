"""`kit demo`: what the CIFAR-10 example's rank 0 said, gathered for the closing summary. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SCRIPT = "cifar10_cnn_horovod.py"
_EPOCH = re.compile(r"^epoch (\d+): loss ([\d.]+) accuracy ([\d.]+) images/sec ([\d.]+)$")
_CHECKPOINT = re.compile(r"^saved checkpoint (\S+)$")
_GENERATED = "using generated data"


@dataclass(frozen=True)
class Epoch:
    number: int
    loss: float
    accuracy: float
    images_per_sec: float


@dataclass
class Training:
    epochs: list[Epoch] = field(default_factory=list)
    checkpoint: str = ""
    generated_data: bool = False

    def feed(self, rank: int | None, text: str) -> None:
        """One line of the job's output (rank 0's lines carry the figures)."""
        if rank != 0:
            return
        if m := _EPOCH.match(text):
            self.epochs.append(Epoch(int(m[1]), float(m[2]), float(m[3]), float(m[4])))
        elif m := _CHECKPOINT.match(text):
            self.checkpoint = m[1]
        elif _GENERATED in text:
            self.generated_data = True

    @property
    def loss_fell(self) -> bool:
        return len(self.epochs) > 1 and self.epochs[-1].loss < self.epochs[0].loss

    def rows(self) -> list[tuple[str, str]]:
        if not self.epochs:
            return [("training", "no epoch finished")]
        first, last = self.epochs[0], self.epochs[-1]
        data = "generated images of CIFAR-10's shape" if self.generated_data else "CIFAR-10"
        return [("training", f"{len(self.epochs)} epochs on {data}"),
                ("loss", f"{first.loss:.4f} -> {last.loss:.4f}" + (" (fell)" if self.loss_fell else " (did not fall)")),
                ("accuracy", f"{last.accuracy:.3f} on the test set after the last epoch"),
                ("speed", f"{last.images_per_sec:,.0f} images/sec, all ranks together"),
                ("checkpoint", self.checkpoint or "not saved")]
