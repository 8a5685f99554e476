"""A job that does nothing but start Horovod: for measuring launch overhead."""

import horovod.torch as hvd

hvd.init()
print(f"rank {hvd.rank()} of {hvd.size()} up", flush=True)
