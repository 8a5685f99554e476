"""kit's image check: every rank contributes rank+1; the allreduced sum must be n(n+1)/2.

Run with `horovodrun -np N ... python /opt/kit/allreduce_check.py`. Each rank
prints one line that `kit` parses; a wrong sum exits 1.
"""

import sys

import horovod.torch as hvd
import torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum, name="kit_check").item()
expected = size * (size + 1) / 2
ok = total == expected
print(f"kit-allreduce rank={rank} size={size} sum={total:g} expected={expected:g} {'ok' if ok else 'WRONG'}",
      flush=True)
sys.exit(0 if ok else 1)
