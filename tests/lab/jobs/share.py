"""Ranks share files through the workspace: rank 2 writes a text file, rank 0 saves a checkpoint,
then every rank reads both at the same path and prints what it read.

  share.py write   write only (copy storage: kit spreads the files after the job)
  share.py read    read only (the next job)
  share.py both    write, wait for every rank, read (shared storage: at once)
"""

import argparse
import os
import socket

import horovod.torch as hvd
import torch

parser = argparse.ArgumentParser()
parser.add_argument("phase", choices=["write", "read", "both"])
phase = parser.parse_args().phase

hvd.init()
rank, folder = hvd.rank(), os.path.abspath("shared")
text_path, checkpoint_path = os.path.join(folder, "from-rank-2.txt"), os.path.join(folder, "checkpoint.pt")
if phase in ("write", "both"):
    os.makedirs(folder, exist_ok=True)
    if rank == 2:
        with open(text_path, "w") as f:
            f.write(f"written by rank 2 on {socket.gethostname()}")
    if rank == 0:
        torch.save({"step": 7, "weights": torch.arange(10.0)}, checkpoint_path)
    hvd.allreduce(torch.zeros(1), name="written")  # every rank waits until both files are written
if phase in ("read", "both"):
    with open(text_path) as f:
        text = f.read()
    state = torch.load(checkpoint_path)
    print(f"rank {rank} on {socket.gethostname()} read {text_path}: {text!r}; "
          f"{checkpoint_path}: step {state['step']}, weights sum {float(state['weights'].sum()):g}", flush=True)
