"""A job for failure tests: every rank allreduces in a loop; one rank may exit on purpose.

    python allreduce_loop.py [--seconds 300] [--fail-rank 2 --exit-code 3]
"""

import argparse
import os
import sys
import time

import horovod.torch as hvd
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=300)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=3)
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
hvd.allreduce(torch.zeros(1), name="ready")  # every rank is up before anyone reports it
print(f"started rank {hvd.rank()} on {os.environ.get('HOROVOD_HOSTNAME')} job {os.environ.get('KIT_JOB')}",
      flush=True)
deadline, step = time.monotonic() + args.seconds, 0
while time.monotonic() < deadline:
    if hvd.rank() == args.fail_rank and step == 5:
        print(f"rank {hvd.rank()} fails on purpose with exit code {args.exit_code}", flush=True)
        sys.exit(args.exit_code)
    hvd.allreduce(torch.ones(1), name=f"step{step}")
    step += 1
    time.sleep(0.1)
print(f"rank {hvd.rank()} done after {step} steps", flush=True)
