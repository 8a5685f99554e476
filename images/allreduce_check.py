"""kit's image check: every rank contributes rank+1; the allreduced sum must be n(n+1)/2.

    horovodrun -np N ... python /opt/kit/allreduce_check.py          # CPU tensors, Gloo
    horovodrun -np N ... python /opt/kit/allreduce_check.py --cuda   # CUDA tensors, Horovod's NCCL path
    torchrun --nproc-per-node N /opt/kit/allreduce_check.py --ddp    # torch.distributed, nccl backend

Each rank prints one line that `kit` parses (with --cuda / --ddp also its GPU, driver, CUDA and NCCL);
a wrong sum exits 1.
"""

import argparse
import os
import socket
import subprocess
import sys

import torch

parser = argparse.ArgumentParser()
mode = parser.add_mutually_exclusive_group()
mode.add_argument("--cuda", action="store_true", help="allreduce a CUDA tensor with Horovod (NCCL)")
mode.add_argument("--ddp", action="store_true", help="allreduce a CUDA tensor with torch.distributed (nccl)")
args = parser.parse_args()


def gpu_facts(device: int) -> str:
    """The rank's GPU, the host's driver, torch's CUDA and NCCL, as key=value words."""
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", str(device)],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    name = torch.cuda.get_device_name(device).replace(" ", "_")
    return f"device=cuda:{device} gpu={name} driver={driver} cuda={torch.version.cuda} nccl={nccl}"


if args.ddp:
    import torch.distributed as dist
    dist.init_process_group("nccl")
    rank, size, local = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    tensor = torch.tensor([float(rank + 1)], device="cuda")
    dist.all_reduce(tensor)
    total = tensor.item()
    dist.destroy_process_group()
else:
    import horovod.torch as hvd
    hvd.init()
    rank, size, local = hvd.rank(), hvd.size(), hvd.local_rank()
    if args.cuda:
        torch.cuda.set_device(local)
    tensor = torch.tensor([float(rank + 1)], device="cuda" if args.cuda else "cpu")
    total = hvd.allreduce(tensor, op=hvd.Sum, name="kit_check").item()
expected = size * (size + 1) / 2
ok = total == expected
extra = f" host={socket.gethostname()} {gpu_facts(local)}" if args.cuda or args.ddp else ""
print(f"kit-allreduce rank={rank} size={size} sum={total:g} expected={expected:g} {'ok' if ok else 'WRONG'}{extra}",
      flush=True)
sys.exit(0 if ok else 1)
