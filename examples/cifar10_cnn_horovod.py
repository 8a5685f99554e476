"""CIFAR-10 CNN with Horovod: a single-GPU script converted the usual way.

    horovodrun -np 3 -H a:1,b:1,c:1 python cifar10_cnn_horovod.py --epochs 2
    kit run examples/cifar10_cnn_horovod.py --np 3 -- --epochs 2

Reads the real CIFAR-10 python batches (data_batch_1..5, test_batch) when
--data holds them; otherwise it generates data of the same shape (32x32 RGB,
10 classes, learnable) and says so. Rank 0 prints loss, accuracy and images/sec
per epoch and saves a checkpoint after each. Started again by `kit run --restarts N` (KIT_RESTART > 0), it
resumes after the last epoch its checkpoint holds, on however many ranks it now has.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:  # kit's rank launcher: the loop's steps and its waits for data, for kit's watch of each rank's pace
    import kit_pace
except ImportError:  # run without kit: nothing is counted
    class kit_pace:  # noqa: N801
        data = staticmethod(lambda loader: loader)
        step = staticmethod(lambda count=1: None)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/cifar-10-batches-py", help="folder of the CIFAR-10 python batches")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3, help="for one rank; scaled by the number of ranks")
    p.add_argument("--samples", type=int, default=0, help="use only this many training images (0: all)")
    p.add_argument("--checkpoint", default="checkpoints/cifar10_cnn.pt")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--fp16-allreduce", action="store_true", default=os.environ.get("KIT_FP16_ALLREDUCE") == "1",
                   help="compress gradients to fp16 for the allreduce (kit run --fp16-allreduce sets it)")
    return p.parse_args()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return images, np.asarray(batch[b"labels"], dtype=np.int64)


def cifar10(folder: Path) -> tuple[TensorDataset, TensorDataset] | None:
    train_files = [folder / f"data_batch_{i}" for i in range(1, 6)]
    if not all(p.is_file() for p in train_files + [folder / "test_batch"]):
        return None
    parts = [read_batch(p) for p in train_files]
    train_x, train_y = np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
    test_x, test_y = read_batch(folder / "test_batch")
    mean = train_x.reshape(-1, 3, 32 * 32).mean(axis=(0, 2)).reshape(1, 3, 1, 1) / 255
    std = train_x.reshape(-1, 3, 32 * 32).std(axis=(0, 2)).reshape(1, 3, 1, 1) / 255

    def tensors(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        return TensorDataset(torch.from_numpy(((x / 255 - mean) / std).astype(np.float32)), torch.from_numpy(y))
    return tensors(train_x, train_y), tensors(test_x, test_y)


def generated(train: int, test: int, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Images of CIFAR-10's shape: a fixed pattern per class plus noise, so there is something to learn."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 3, 32, 32, generator=g)

    def make(n: int) -> TensorDataset:
        labels = torch.randint(0, 10, (n,), generator=g)
        return TensorDataset(0.5 * patterns[labels] + torch.randn(n, 3, 32, 32, generator=g), labels)
    return make(train), make(test)


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    else:
        torch.set_num_threads(1)  # one rank a core: threads of ranks on one host would fight
        device = torch.device("cpu")
    host = os.environ.get("HOROVOD_HOSTNAME", socket.gethostname())
    print(f"rank {hvd.rank()}/{hvd.size()} (local {hvd.local_rank()}) on {host} ({socket.gethostname()}), "
          f"device {device}", flush=True)

    data = cifar10(Path(args.data))
    if data is None:
        if hvd.rank() == 0:
            print(f"no CIFAR-10 batches in {args.data}: using generated data of the same shape", flush=True)
        data = generated(args.samples or 50000, 2000, args.seed)
    train_set, test_set = data
    if args.samples:
        train_set = TensorDataset(*(t[:args.samples] for t in train_set.tensors))

    sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    model = Net().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)

    first = resume(args.checkpoint, model, optimizer) if int(os.environ.get("KIT_RESTART", "0")) else 1
    for epoch in range(first, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        started, seen, total_loss = time.monotonic(), 0, 0.0
        for images, labels in kit_pace.data(loader):
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            kit_pace.step()
            seen += len(images)
            total_loss += loss.item() * len(images)
        rate = hvd.allreduce(torch.tensor(seen / (time.monotonic() - started)), op=hvd.Sum, name="rate").item()
        mean_loss = hvd.allreduce(torch.tensor(total_loss / seen), name="loss").item()
        accuracy = evaluate(model, test_set, device)
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {mean_loss:.4f} accuracy {accuracy:.3f} images/sec {rate:.1f}", flush=True)
            save(args.checkpoint, model, optimizer, epoch)
    if hvd.rank() == 0:
        print(f"saved checkpoint {Path(args.checkpoint).resolve()}", flush=True)


def save(checkpoint: str, model: nn.Module, optimizer, epoch: int) -> None:
    """Rank 0's model, optimizer and epoch; written aside and renamed, so a rank killed meanwhile leaves the last."""
    path = Path(checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epochs": epoch},
               path.with_suffix(".new"))
    os.replace(path.with_suffix(".new"), path)


def resume(checkpoint: str, model: nn.Module, optimizer) -> int:
    """After a restart: rank 0 loads the checkpoint, every rank gets its weights and state; the epoch to go on from."""
    done = 0
    if hvd.rank() == 0 and Path(checkpoint).is_file():
        saved = torch.load(checkpoint, map_location="cpu")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        done = saved["epochs"]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    done = hvd.broadcast_object(done, root_rank=0)
    if hvd.rank() == 0:
        print(f"resumed from {checkpoint} after epoch {done} (restart {os.environ['KIT_RESTART']}, "
              f"{hvd.size()} ranks)" if done else f"no checkpoint at {checkpoint}: starting over", flush=True)
    return done + 1


def evaluate(model: nn.Module, test_set: TensorDataset, device: torch.device) -> float:
    """Accuracy on this rank's share of the test set, averaged over ranks."""
    model.eval()
    sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    correct = total = 0
    with torch.no_grad():
        for images, labels in DataLoader(test_set, batch_size=256, sampler=sampler):
            correct += (model(images.to(device)).argmax(1) == labels.to(device)).sum().item()
            total += len(labels)
    return hvd.allreduce(torch.tensor(correct / max(total, 1)), name="accuracy").item()


if __name__ == "__main__":
    main()
