"""`kit bench allreduce`'s job: allreduce tensors of growing size and time it, as nccl-tests' all_reduce_perf does.

    horovodrun -np N ... python allreduce.py horovod --min-bytes 1024 --max-bytes 268435456
    torchrun ... allreduce.py torch ...

CPU tensors go over Gloo; where a GPU is visible, CUDA tensors go over NCCL (Horovod's NCCL path, or
torch.distributed's nccl backend). For each size: warm-up, one timed op to choose how many make about --seconds, then
that many back to back; each figure is the slowest rank's. Rank 0 prints one line a size:

    @@kit-bench {"backend": "horovod", "transport": "gloo", "ranks": 3, "bytes": 1024, "iters": 200, "seconds": ...}

("seconds": one allreduce, averaged over the timed ones). kit turns them into bandwidths.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

MARK = "@@kit-bench "


class Horovod:
    def __init__(self) -> None:
        import horovod.torch as hvd
        hvd.init()
        self.hvd, self.rank, self.size, local = hvd, hvd.rank(), hvd.size(), hvd.local_rank()
        cuda = torch.cuda.is_available() and hvd.nccl_built()
        self.device = torch.device("cuda", local) if cuda else torch.device("cpu")
        self.transport = "nccl" if cuda else "gloo"
        if cuda:
            torch.cuda.set_device(self.device)

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.hvd.allreduce_(tensor, op=self.hvd.Sum, name="kit_bench")

    def barrier(self) -> None:
        self.hvd.barrier()

    def slowest(self, value: float) -> float:
        return self.hvd.allreduce(torch.tensor([value], dtype=torch.float64), op=self.hvd.Max, name="kit_max").item()

    def close(self) -> None:
        self.hvd.shutdown()


class Torch:
    def __init__(self) -> None:
        import torch.distributed as dist
        cuda = torch.cuda.is_available()
        self.transport = "nccl" if cuda else "gloo"
        dist.init_process_group(self.transport)
        self.dist, self.rank, self.size = dist, dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(self.device)

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.dist.all_reduce(tensor)

    def barrier(self) -> None:
        self.dist.barrier()

    def slowest(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.item()

    def close(self) -> None:
        # without it, a rank may abort at exit ("terminate called without an active exception", seen on the lab)
        self.dist.barrier()
        self.dist.destroy_process_group()


def timed(backend, tensor: torch.Tensor, iters: int) -> float:
    """Seconds for `iters` allreduces back to back, the slowest rank's."""
    backend.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        backend.allreduce(tensor)
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)
    return backend.slowest(time.perf_counter() - started)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("backend", choices=("horovod", "torch"))
    p.add_argument("--min-bytes", type=int, default=1 << 10)
    p.add_argument("--max-bytes", type=int, default=1 << 28)
    p.add_argument("--factor", type=int, default=4, help="each size is the last one times this")
    p.add_argument("--seconds", type=float, default=1.0, help="timed ops of a size take about this long")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max-iters", type=int, default=1000)
    args = p.parse_args()
    if args.backend == "torch":
        torch.set_num_threads(1)
    backend = Horovod() if args.backend == "horovod" else Torch()
    size = args.min_bytes
    while size <= args.max_bytes:
        tensor = torch.zeros(max(size // 4, 1), dtype=torch.float32, device=backend.device)  # zeros: sums stay finite
        for _ in range(args.warmup):
            backend.allreduce(tensor)
        one = timed(backend, tensor, 1)  # the same on every rank: how many to time is agreed without a message
        iters = int(min(max(args.seconds / max(one, 1e-6), 3), args.max_iters))
        seconds = timed(backend, tensor, iters) / iters
        if backend.rank == 0:
            print(MARK + json.dumps({"backend": args.backend, "transport": backend.transport, "ranks": backend.size,
                                     "bytes": tensor.numel() * 4, "iters": iters, "seconds": seconds}), flush=True)
        del tensor
        size *= args.factor
    backend.close()


if __name__ == "__main__":
    main()
