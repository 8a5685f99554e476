"""What a container needs for RDMA (InfiniBand, RoCE): the host's verbs devices, where it has ports. Pure."""

from __future__ import annotations

from kit.network.links import Reading

DEVICES = "/dev/infiniband"


def rdma_devices(reading: Reading) -> tuple[str, ...]:
    """The host's RDMA device files for `docker run --device` (uverbs*, rdma_cm...), where it has an RDMA port;
    none where it has no port (a leftover device file is nothing NCCL could use)."""
    if not reading.ports:
        return ()
    return tuple(f"{DEVICES}/{name}" for name in sorted(reading.devices))
