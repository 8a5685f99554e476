"""What kit asks of a Kubernetes cluster for each pod of a job: its CPUs and memory (requests equal to limits), the
capabilities its containers keep, and how long its objects stay once it ended. kit.backends.k8s.manifests writes them in."""

from __future__ import annotations

import re

from kit.errors import BadInput

TTL_S = 7 * 24 * 3600           # a finished job's objects (and its pods' logs) are deleted a week after it ended
CPUS_PER_RANK, MEMORY_PER_RANK_GI = 2, 8   # each pod's default request and limit: this much for each rank it runs
CPUS = re.compile(r"(\d+(\.\d{1,3})?|\d+m)")              # --cpus: 4, 0.5, 500m
MEMORY = re.compile(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?")      # --memory: Kubernetes quantities, bytes without a unit
UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30,
         "Ti": 1 << 40}
# What a rank's container keeps of root's capabilities (all others are dropped): its own files' owner and mode, on a
# workspace volume another user may own. An MPIJob's worker runs sshd besides: on port 22, switching to the
# launcher's login, in its privilege-separation chroot, with PAM's audit records.
RANK_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"]
SSHD_CAPABILITIES = [*RANK_CAPABILITIES, "SETUID", "SETGID", "SYS_CHROOT", "NET_BIND_SERVICE", "AUDIT_WRITE", "KILL"]


def memory_bytes(quantity: str) -> int:
    m = MEMORY.fullmatch(quantity)
    return int(m[1]) * UNITS[m[2]]


def check_sizes(cpus: str | None, memory: str | None) -> None:
    """--cpus and --memory as Kubernetes reads them; bad input names the flag."""
    if cpus is not None and not (CPUS.fullmatch(cpus) and cpus not in ("0", "0m")):
        raise BadInput(f"--cpus: {cpus!r} is not a CPU count", hint="give each pod's CPUs: 8, 0.5 or 500m")
    if memory is not None and not (MEMORY.fullmatch(memory) and memory_bytes(memory) >= 64 << 20):
        raise BadInput(f"--memory: {memory!r} is not a memory size of 64Mi or more",
                       hint="give each pod's memory as Kubernetes writes it: 32Gi, 500Mi")
