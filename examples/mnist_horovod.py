"""A small MNIST CNN with Horovod.

    horovodrun -np 3 -H a:1,b:1,c:1 python mnist_horovod.py --epochs 3
    kit run examples/mnist_horovod.py --np 3 -- --epochs 3

Reads the MNIST idx files (train-images-idx3-ubyte, train-labels-idx1-ubyte, optionally .gz) from
--data when they are there; otherwise it generates 28x28 digits-like data (a fixed pattern per class
plus noise) and says so. Rank 0 prints the loss and accuracy per epoch and saves the model.
"""

from __future__ import annotations

import argparse
import gzip
import socket
import struct
from pathlib import Path

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
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
    p.add_argument("--data", default="data/mnist", help="folder of the MNIST idx files")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="for one rank; scaled by the number of ranks")
    p.add_argument("--samples", type=int, default=6000, help="training images to use (0: all)")
    p.add_argument("--checkpoint", default="checkpoints/mnist_cnn.pt")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def read_idx(path: Path) -> np.ndarray:
    """An idx file (MNIST's format): magic, dimensions, then unsigned bytes."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        _, _, kind, dims = struct.unpack(">BBBB", f.read(4))
        shape = struct.unpack(">" + "I" * dims, f.read(4 * dims))
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(shape)


def mnist(folder: Path) -> TensorDataset | None:
    def find(name: str) -> Path | None:
        return next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None)
    images, labels = find("train-images-idx3-ubyte"), find("train-labels-idx1-ubyte")
    if images is None or labels is None:
        return None
    x = torch.from_numpy(read_idx(images).astype(np.float32) / 255).unsqueeze(1)
    return TensorDataset((x - 0.1307) / 0.3081, torch.from_numpy(read_idx(labels).astype(np.int64)))


def generated(samples: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (samples,), generator=g)
    return TensorDataset(0.5 * patterns[labels] + torch.randn(samples, 1, 28, 28, generator=g), labels)


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    print(f"rank {hvd.rank()}/{hvd.size()} on {socket.gethostname()}, device {device}", flush=True)

    dataset = mnist(Path(args.data))
    if dataset is None:
        if hvd.rank() == 0:
            print(f"no MNIST idx files in {args.data}: using generated data of the same shape", flush=True)
        dataset = generated(args.samples or 60000, args.seed)
    if args.samples:
        dataset = TensorDataset(*(t[:args.samples] for t in dataset.tensors))

    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        total_loss, correct, seen = 0.0, 0, 0
        for x, y in kit_pace.data(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            optimizer.step()
            kit_pace.step()
            total_loss += loss.item() * len(x)
            correct += (out.argmax(1) == y).sum().item()
            seen += len(x)
        loss = hvd.allreduce(torch.tensor(total_loss / seen), name="loss").item()
        accuracy = hvd.allreduce(torch.tensor(correct / seen), name="accuracy").item()
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {loss:.4f} accuracy {accuracy:.3f}", flush=True)

    if hvd.rank() == 0:
        path = Path(args.checkpoint)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
        print(f"saved checkpoint {path.resolve()}", flush=True)


if __name__ == "__main__":
    main()
