"""A job for failure tests: every rank allreduces in a loop; one rank may exit on purpose.

    python allreduce_loop.py [--seconds 300] [--fail-rank 2 --exit-code 3]   (horovodrun)
    torchrun ... allreduce_loop.py --ddp [...]                                (torch.distributed, gloo)
"""

import argparse
import os
import sys
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=300)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=3)
parser.add_argument("--ddp", action="store_true", help="torch.distributed from torchrun's environment")
args = parser.parse_args()

torch.set_num_threads(1)
if args.ddp:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def allreduce(t: torch.Tensor, name: str) -> None:
        dist.all_reduce(t)
else:
    import horovod.torch as hvd

    hvd.init()
    rank = hvd.rank()

    def allreduce(t: torch.Tensor, name: str) -> None:
        hvd.allreduce(t, name=name)

allreduce(torch.zeros(1), name="ready")  # every rank is up before anyone reports it
print(f"started rank {rank} on {os.environ.get('HOROVOD_HOSTNAME', os.uname().nodename)} "
      f"job {os.environ.get('KIT_JOB')}", flush=True)
deadline, step = time.monotonic() + args.seconds, 0
while time.monotonic() < deadline:
    if rank == args.fail_rank and step == 5:
        print(f"rank {rank} fails on purpose with exit code {args.exit_code}", flush=True)
        sys.exit(args.exit_code)
    allreduce(torch.ones(1), name=f"step{step}")
    step += 1
    time.sleep(0.1)
print(f"rank {rank} done after {step} steps", flush=True)
