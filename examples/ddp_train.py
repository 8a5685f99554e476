"""PyTorch DistributedDataParallel, written the way PyTorch's DDP tutorials do it, started by torchrun.

    torchrun --nnodes 3 --nproc-per-node 1 --node-rank N --master-addr A --master-port P ddp_train.py
    kit run --launcher torchrun examples/ddp_train.py -- --epochs 5

init_process_group reads torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...); the model is
wrapped in DistributedDataParallel; a DistributedSampler (set_epoch every epoch) gives each rank its
share; each rank's batch is the global batch / world size; the loss is all-reduced for logging; the
learning-rate scheduler steps each epoch; rank 0 saves model.module.state_dict() to the workspace after each
epoch. Started again by `kit run --restarts N` (KIT_RESTART > 0), it resumes after the last epoch saved there.
The data is generated (a fixed pattern per class plus noise), so there is something to learn.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

# kit's rank launcher counts the loop's steps and its waits for data (`kit jobs ID --ranks`). DDP's own wait for the
# other ranks is inside loss.backward(), where kit cannot tell it from computing: it names no slow rank of this job.
try:
    import kit_pace
except ImportError:  # run without kit: nothing is counted
    class kit_pace:  # noqa: N801
        data = staticmethod(lambda loader: loader)
        step = staticmethod(lambda count=1: None)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--global-batch", type=int, default=96, help="split evenly over the ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--samples", type=int, default=6144)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--checkpoint", default="checkpoints/ddp_model.pt")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def generated(samples: int, features: int, seed: int) -> TensorDataset:
    """The same data on every rank (same seed): the sampler, not the data, differs between ranks."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, features, generator=g)
    labels = torch.randint(0, 10, (samples,), generator=g)
    return TensorDataset(patterns[labels] + 3.0 * torch.randn(samples, features, generator=g), labels)


def main() -> None:
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        torch.set_num_threads(1)  # one rank a core
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} (local {local_rank}) on {socket.gethostname()}, device {device}", flush=True)
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} does not split evenly over {world} ranks")

    torch.manual_seed(args.seed)
    dataset = generated(args.samples, args.features, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.global_batch // world, sampler=sampler)
    model = nn.Sequential(nn.Linear(args.features, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    done = resume(args.checkpoint, model, rank) if int(os.environ.get("KIT_RESTART", "0")) else 0
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)  # rank 0's weights to all
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    with warnings.catch_warnings():  # (stepped before any optimizer.step(), on purpose)
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(done):
            scheduler.step()  # the learning rate of the epoch it goes on from

    for epoch in range(done + 1, args.epochs + 1):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        model.train()
        started, total, batches = time.monotonic(), torch.zeros(1, device=device), 0
        for x, y in kit_pace.data(loader):
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # DDP averages the gradients across ranks here
            optimizer.step()
            kit_pace.step()
            total += loss.detach()
            batches += 1
        mean = total / batches
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)  # for logging: the mean over ranks
        mean /= world
        scheduler.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {mean.item():.4f} lr {scheduler.get_last_lr()[0]:.4f} "
                  f"({time.monotonic() - started:.1f} s)", flush=True)
            path = Path(args.checkpoint)  # written aside and renamed: a rank killed meanwhile leaves the last
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "epochs": epoch}, path.with_suffix(".new"))
            os.replace(path.with_suffix(".new"), path)

    if rank == 0:
        print(f"saved checkpoint {Path(args.checkpoint).resolve()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def resume(checkpoint: str, model: nn.Module, rank: int) -> int:
    """After a restart: rank 0 loads the checkpoint (DDP then gives its weights to every rank); the epochs done."""
    done = [0]
    if rank == 0 and Path(checkpoint).is_file():
        saved = torch.load(checkpoint, map_location="cpu")
        model.load_state_dict(saved["model"])
        done = [saved["epochs"]]
    dist.broadcast_object_list(done, src=0)
    if rank == 0:
        print(f"resumed from {checkpoint} after epoch {done[0]} (restart {os.environ['KIT_RESTART']}, "
              f"{dist.get_world_size()} ranks)" if done[0] else f"no checkpoint at {checkpoint}: starting over",
              flush=True)
    return done[0]


if __name__ == "__main__":
    main()
    # Done: the checkpoint is written and the process group destroyed. Leave without the interpreter's teardown,
    # where torch (2.13, over Gloo) at times aborts a finished rank ("terminate called without an active exception",
    # SIGABRT), which torchrun reports as a failed job: seen on kit's lab in 2 of 144 runs of this example over 3
    # hosts; with Python's faulthandler on, the rank aborted after destroy_process_group had returned.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
