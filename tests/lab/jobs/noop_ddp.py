"""A job that does nothing but join torch.distributed's process group (gloo): for measuring torchrun's launch overhead."""

import os

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} up on {os.uname().nodename}", flush=True)
dist.destroy_process_group()
