"""A job for failure tests: every rank allreduces in a loop; one rank may exit on purpose.

    python allreduce_loop.py [--seconds 300] [--fail-rank 2 --exit-code 3] [--hang-rank 2]   (horovodrun)
    torchrun ... allreduce_loop.py --ddp [...]                                (torch.distributed, gloo)
    TF_CONFIG=... python allreduce_loop.py --tf [...]                         (MultiWorkerMirroredStrategy)
"""

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=300)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=3)
parser.add_argument("--hang-rank", type=int, default=-1, help="this rank blocks forever before its 5th allreduce")
parser.add_argument("--ddp", action="store_true", help="torch.distributed from torchrun's environment")
parser.add_argument("--tf", action="store_true", help="TensorFlow's collectives from TF_CONFIG")
args = parser.parse_args()

if args.tf:
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

    @tf.function
    def _sum(x):
        return strategy.run(lambda v: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v + 0),
                            args=(x,))

    def allreduce(value: float, name: str) -> None:
        _sum(tf.constant(value))
else:
    import torch

    torch.set_num_threads(1)
    if args.ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()

        def allreduce(value: float, name: str) -> None:
            dist.all_reduce(torch.tensor([value]))
    else:
        import horovod.torch as hvd

        hvd.init()
        rank = hvd.rank()

        def allreduce(value: float, name: str) -> None:
            hvd.allreduce(torch.tensor([value]), name=name)

allreduce(0.0, name="ready")  # every rank is up before anyone reports it
print(f"started rank {rank} on {os.environ.get('HOROVOD_HOSTNAME', os.uname().nodename)} "
      f"job {os.environ.get('KIT_JOB')}", flush=True)
deadline, step = time.monotonic() + args.seconds, 0
while time.monotonic() < deadline:
    if rank == args.fail_rank and step == 5:
        print(f"rank {rank} fails on purpose with exit code {args.exit_code}", flush=True)
        sys.exit(args.exit_code)
    if rank == args.hang_rank and step == 5:
        print(f"rank {rank} blocks on purpose", flush=True)
        time.sleep(10 ** 6)  # the others wait for it in the allreduce below
    allreduce(1.0, name=f"step{step}")
    step += 1
    time.sleep(0.1)
print(f"rank {rank} done after {step} steps", flush=True)
