"""Judging a host's GPU health (kit.doctor.gpufacts reads it): a GPU with an Xid of hardware trouble since boot, an
uncorrectable ECC error since the driver loaded, a page or a row waiting for a reset to be retired or remapped, or a
remapping that failed, is named with its host, its index and bus, the figure and the fix. Pure, and free of doctor's
reading: `kit doctor` and a preflight judge alike.

What each Xid asks for follows NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, its "Resolution Bucket"),
its memory error guides (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt: 48, 63, 64, 94, 95) and dynamic page
retirement (docs.nvidia.com/deploy/dynamic-page-retirement). Xids an application causes (13, 31, 43, 45: its own
fault, a job killed) say nothing of the host: they are told, never warned of.
"""

from __future__ import annotations

from kit.doctor.finding import FAIL, OK, WARN, Finding
from kit.doctor.gpufacts import GpuHealth, GpuState, Xid, bus_key

REBOOT, RESET, WATCH = "reboot", "reset", "watch"
# code -> (what it means, what it asks for). REBOOT: the GPU is gone until the host restarts; RESET: a GPU reset
# (or a reboot) brings it back; WATCH: nothing to do now, but a GPU that keeps at it is failing.
HARDWARE: dict[int, tuple[str, str]] = {
    48: ("double-bit ECC error", RESET),
    61: ("internal micro-controller breakpoint", RESET),
    62: ("internal micro-controller halt", RESET),
    64: ("a page retirement or row remapping could not be recorded", RESET),
    74: ("NVLink error", RESET),
    79: ("fallen off the bus", REBOOT),
    92: ("high single-bit ECC error rate", WATCH),
    95: ("uncontained ECC error", RESET),
    119: ("GSP firmware did not answer", RESET),
    120: ("GSP firmware error", RESET),
}
# Said in the ok line, never warned of: an application's own fault, or an event whose state nvidia-smi reads itself
# (63: a retirement or remap recorded, its pending flag says whether it still waits; 94: a contained ECC error, the
# application that met it ended, the row's pending flag again).
TOLD: dict[int, str] = {
    13: "graphics engine exception (an application's)",
    31: "memory page fault (an application's)",
    43: "GPU stopped processing (an application's)",
    45: "preemptive cleanup (a job ended)",
    63: "page retirement or row remapping recorded",
    94: "contained ECC error",
}
MEMORY = {48, 95}  # memory errors whose page or row, pending, is the finding that names them
CHECK = "gpu health"


def judge_health(host: str, health: GpuHealth | None) -> list[Finding]:
    """A host's GPU health -> one finding for each GPU in trouble (warn, or fail for a GPU that fell off the bus or
    whose memory can no longer be repaired), or one ok line. None (not read) and a host without GPUs: nothing."""
    if health is None or not (health.gpus or health.xids or health.lost):
        return []
    named = {g.key: g for g in health.gpus}
    xids: dict[str, list[Xid]] = {}
    for x in health.xids:
        xids.setdefault(x.key, []).append(x)
    lost = {bus_key(bus): said for bus, said in health.lost}
    out = []
    for key in dict.fromkeys([*named, *lost, *xids]):  # a GPU gone from nvidia-smi is named by its bus
        out += _gpu(host, named.get(key), key, xids.get(key, []))
        if key in lost and not any(x.code == 79 for x in xids.get(key, [])):
            out.append(Finding(host, CHECK, FAIL, f"{_name(host, None, key)}: nvidia-smi cannot reach it "
                               f"({lost[key] or 'no reason given'}): jobs on it fail", f"drain {host} and reboot it; "
                               "if it stays unreachable, take the GPU out of service (reseat it, or have it replaced)"))
    if not [f for f in out if f.level != OK]:
        out = [_clean(host, health)]
    return out


def _name(host: str, gpu: GpuState | None, key: str) -> str:
    return f"GPU {gpu.index} ({gpu.bus}) on {host}" if gpu else f"the GPU at {key} on {host}, which nvidia-smi " \
        "does not list"


def _reset(host: str, gpu: GpuState | None) -> str:
    """A GPU nvidia-smi lists is reset by its index; one it does not list has no index to trust: the host reboots."""
    return f"reset it (nvidia-smi -r -i {gpu.index}, as root, with no process on it) or reboot {host}" if gpu else \
        f"reboot {host}"


def _gpu(host: str, gpu: GpuState | None, key: str, xids: list[Xid]) -> list[Finding]:
    """One GPU's findings: its Xids of hardware trouble, then its memory's state."""
    name, out = _name(host, gpu, key), []
    pending = gpu is not None and (gpu.remap_pending or gpu.retire_pending)
    for x in sorted((x for x in xids if x.code in HARDWARE), key=lambda x: x.code):
        if not (pending and x.code in MEMORY):  # (the pending page or row is that error's: said with it)
            out.append(_xid(host, gpu, name, x))
    if gpu is None:
        return out
    if gpu.remap_failed:
        out.append(Finding(host, CHECK, FAIL, f"{name}: a row remapping failed ({_figure(gpu.remapped, 'row')} "
                           "remapped): its memory can no longer be repaired",
                           f"take GPU {gpu.index} out of service (CUDA_VISIBLE_DEVICES without it, or drain {host}) "
                           "and have it replaced (NVIDIA's field diagnostic confirms an RMA)"))
    elif gpu.remap_pending or gpu.retire_pending:
        what = "a row waits to be remapped" if gpu.remap_pending else "a page waits to be retired"
        figure = _figure(gpu.remapped, "row") + " remapped" if gpu.remap_pending else _figure(gpu.retired, "page") + \
            " retired"
        errors = _figure(gpu.ecc_volatile, "uncorrectable ECC error")
        after = "".join(f" after Xid {x.code} ({HARDWARE[x.code][0]})" for x in xids if x.code in MEMORY)
        out.append(Finding(host, CHECK, WARN, f"{name}: {what}{after} ({figure}; {errors} since the driver loaded)",
                           f"it happens at the GPU's next reset: drain {host}, then {_reset(host, gpu)}"))
    elif gpu.ecc_volatile:
        out.append(Finding(host, CHECK, WARN, f"{name}: {_figure(gpu.ecc_volatile, 'uncorrectable ECC error')} since "
                           "the driver loaded: a job on it read wrong data or was ended", f"{_reset(host, gpu)}; if the "
                           "count grows again, take it out of service"))
    if gpu.reset_required and not any(f.level != OK for f in out):
        out.append(Finding(host, CHECK, WARN, f"{name}: the driver says it needs a reset",
                           _reset(host, gpu)))
    return out


def _xid(host: str, gpu: GpuState | None, name: str, x: Xid) -> Finding:
    what, asks = HARDWARE[x.code]
    said = f"{name}: Xid {x.code} ({what}) since boot" + (f", {x.count} times" if x.count > 1 else "")
    index = f"GPU {gpu.index}" if gpu else "the GPU"
    again = f"if it happens again, take {index} out of service (reseat it, or have it replaced)"
    if asks == REBOOT:
        return Finding(host, CHECK, FAIL, f"{said}: jobs on it fail until it is back", f"drain {host} and reboot "
                       f"it (a GPU off the bus seldom comes back with a reset); {again}")
    if asks == RESET:
        return Finding(host, CHECK, WARN, said, f"{_reset(host, gpu)}; {again} (the kernel's log keeps the line "
                       "until the host reboots)")
    return Finding(host, CHECK, WARN, f"{said}: its memory is wearing", f"watch it; {again}")


def _figure(n: int | None, what: str) -> str:
    return f"? {what}s" if n is None else f"{n} {what}{'' if n == 1 else 's'}"


def _clean(host: str, health: GpuHealth) -> Finding:
    """The ok line: the GPUs read, where the Xids were read from, and the Xids told but not warned of."""
    told = sorted({x.code for x in health.xids if x.code not in HARDWARE})
    said = ", ".join(f"{c} ({TOLD[c]})" if c in TOLD else str(c) for c in told)
    gpus = f"{len(health.gpus)} GPU{'s' if len(health.gpus) != 1 else ''}: no uncorrectable ECC error, nothing " \
        "waits to be retired or remapped" if health.gpus else "nvidia-smi -q told nothing of the GPUs"
    if not health.log:
        return Finding(host, CHECK, OK, f"{gpus}; the kernel's log could not be read (dmesg and journalctl "
                       "refused): Xids not checked")
    return Finding(host, CHECK, OK, f"{gpus}; " + (f"Xid {said} since boot, none of them the hardware's" if told
                                                   else f"no Xid since boot ({health.log})"))
