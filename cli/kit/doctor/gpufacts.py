"""The GPUs' health as a host tells it, read without changing anything: what nvidia-smi counts of each GPU's memory
errors (uncorrectable ECC errors, pages waiting to be retired, rows waiting to be remapped, a remapping that failed)
and the Xids the NVIDIA driver wrote in the kernel's log since boot. The script that reads them (host side, not the
container's) and the pure parsers of what it prints; kit.doctor.gpuhealth judges them. Nothing here imports doctor's
reading, so that a preflight can read and judge the same way.

The formats, as NVIDIA's tools print them (each parser is tested on such output, tests/unit/data/gpu_health_*.txt):
`nvidia-smi -q -d ...` prints a GPU line (`GPU 00000000:3B:00.0`) and under it, indented by 4 spaces a level, the
sections asked for: `ECC Errors` (Volatile, since the driver loaded, and Aggregate, over the board's life; Volta's
`Double Bit` > `Total`, Ampere's and later `SRAM Uncorrectable ...` and `DRAM Uncorrectable`), `Retired Pages`
(`Pending Page Blacklist`, `Pending` in older drivers; N/A on GPUs that remap rows instead) and `Remapped Rows`
(`Pending`, `Remapping Failure Occurred`; N/A before Ampere). The kernel's lines: `NVRM: Xid (PCI:0000:3b:00): 79,
pid=0, GPU has fallen off the bus.` (newer drivers leave out `pid=`, MIG adds ` GPU-I:05` after the bus).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kit.hostoutput import MARK, lines, sections

NVIDIA_SMI_TIMEOUT_S = 20   # a driver in a bad state can hang nvidia-smi: the host's other readings still come back
LOG_TIMEOUT_S = 10
QUERY_MAX = 256 * 1024      # bytes of nvidia-smi's answer kept (8 GPUs print about 12 KB)
XID_KINDS = 100             # (GPU, Xid) pairs kept, each with its count: one GPU's flood of Xid 13 hides no Xid 79
XID_TEXT = 300              # characters kept of each Xid line
QUERY = "ECC,PAGE_RETIREMENT,ROW_REMAPPER"
GPUQ, XID = "gpuq", "xid"   # the script's sections

_smi = f"timeout {NVIDIA_SMI_TIMEOUT_S} nvidia-smi -q -d"
# A line the driver wrote: the kernel's own prefix (dmesg's `[  269.517039] `, or journalctl's short-monotonic
# `[  269.517039] host kernel: `) and then at once `NVRM: Xid (PCI:0000:3b:00): 79`. A name a user chooses (a file run
# with an empty argv, a segfault's mapped file, a comm) the kernel prints inside its own lines, never there; a comm
# that starts a line is 15 characters, too few for a whole Xid. Read from the kernel facility only: what userspace
# writes to /dev/kmsg is never the kernel's (the kernel makes it `user`).
KERNEL_XID = (r"^\[ *[0-9]+\.[0-9]+\] ([^ ]+ kernel: )?NVRM: Xid \((PCI:)?[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
              r"( [^()]*)?\): [0-9]+")
# Each kind of Xid line once, in the order first seen, with how many there were: `3 Xid (PCI:0000:3b:00): 79, ...`
COUNT = (f"grep -E '{KERNEL_XID}' | sed -E 's/^[[][^]]*[]] ([^ ]+ kernel: )?NVRM: Xid/Xid/' | cut -c 1-{XID_TEXT} | "
         "awk '{k = $0; sub(/, .*/, \"\", k); if (!(k in n)) {o[++m] = k; f[k] = $0}; n[k]++} "
         "END {for (i = 1; i <= m; i++) print n[o[i]], f[o[i]]}' | head -n " + str(XID_KINDS))
SCRIPT = "\n".join([
    # A driver older than row remapping (R460) refuses ROW_REMAPPER at once: asked again without it; a hung one (124)
    # is not asked twice. No nvidia-smi: an empty section. Its stderr too: a GPU it cannot reach is said there.
    f"echo '{MARK}{GPUQ}'; if command -v nvidia-smi >/dev/null 2>&1; then q=$({_smi} {QUERY} 2>&1); rc=$?; "
    f"case \"$q\" in *'Attached GPUs'*) ;; *) [ $rc -eq 124 ] || q=$({_smi} ECC,PAGE_RETIREMENT 2>&1);; esac; "
    f"printf '%s\\n' \"$q\" | head -c {QUERY_MAX}; fi",
    # dmesg needs root where kernel.dmesg_restrict is set; the journal's kernel lines of this boot are the fallback.
    # The first line says which was read (`from ` alone: neither could be).
    f"echo '{MARK}{XID}'; if timeout {LOG_TIMEOUT_S} dmesg >/dev/null 2>&1; then k='dmesg -f kern'; "
    f"elif timeout {LOG_TIMEOUT_S} journalctl -k -b -n 1 -q --no-pager 2>/dev/null | grep -q .; then "
    "k='journalctl -k -b -q --no-pager -o short-monotonic'; else k=''; fi; echo \"from ${k%% *}\"; "
    f"[ -z \"$k\" ] || timeout {LOG_TIMEOUT_S} $k 2>/dev/null | {COUNT}",
])


@dataclass(frozen=True)
class GpuState:
    """One GPU as `nvidia-smi -q` tells it; a count is None where it says N/A (or nothing)."""

    index: int                       # nvidia-smi's own (its order: the PCI bus's), as `nvidia-smi -i` takes it
    bus: str                         # as nvidia-smi prints it: 00000000:3B:00.0
    uuid: str = ""                   # where the output has it (a full -q; -d leaves it out)
    ecc_volatile: int | None = None  # uncorrectable ECC errors since the driver loaded
    ecc_aggregate: int | None = None  # over the board's life
    retired: int | None = None       # pages retired (single and double bit)
    retire_pending: bool = False     # a page waits for the next reset to be retired
    remapped: int | None = None      # rows remapped (for correctable and uncorrectable errors)
    remap_pending: bool = False      # a row waits for the next reset to be remapped
    remap_failed: bool = False       # a remapping failed: the board is out of spare rows or worse
    reset_required: bool = False     # the driver's own `GPU Reset Status` (a full -q, newer drivers)

    @property
    def key(self) -> str:
        return bus_key(self.bus)


@dataclass(frozen=True)
class Xid:
    """Xid lines of one kind (one GPU, one code) in the kernel's log since boot."""

    bus: str      # as the kernel prints it: 0000:3b:00
    code: int
    text: str     # what follows the code: `GPU has fallen off the bus.`, `pid=.., name=.., ...`
    count: int = 1

    @property
    def key(self) -> str:
        return bus_key(self.bus)


@dataclass(frozen=True)
class GpuHealth:
    """What one host said of its GPUs' health."""

    gpus: tuple[GpuState, ...] = ()
    xids: tuple[Xid, ...] = ()
    log: str = ""   # where the Xids were read: dmesg or journalctl; "" where the kernel's log could not be read
    lost: tuple[tuple[str, str], ...] = ()  # (bus, what nvidia-smi said) of each GPU it could not reach


def bus_key(bus: str) -> str:
    """One spelling of a PCI address, domain:bus:device (the function left out, hex in lower case): nvidia-smi's
    `00000000:3B:00.0` and the kernel's `0000:3b:00` are both `0000:3b:00`. Pure."""
    found = re.fullmatch(r"(?:PCI:)?(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?",
                         bus.strip())
    if not found:
        return bus.strip().lower()
    domain, b, d = found.groups()
    return f"{int(domain or '0', 16):04x}:{int(b, 16):02x}:{int(d, 16):02x}"


_GPU_LINE = re.compile(r"GPU ((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s*")
_ENTRY = re.compile(r"( *)([^:]*?)\s*(?::\s*(.*?))?\s*")


def parse_query(text: str) -> list[GpuState]:
    """`nvidia-smi -q` (whole, or some of its sections with -d) -> each GPU's state, in nvidia-smi's order. What
    is not a GPU's section (the header, a failing GPU's complaint) is left out. Pure."""
    gpus: list[tuple[str, dict[tuple[str, ...], str]]] = []
    path: list[tuple[int, str]] = []
    for line in lines(text):
        if found := _GPU_LINE.fullmatch(line):
            gpus.append((found[1], {}))
            path = []
            continue
        entry = _ENTRY.fullmatch(line)
        if not gpus or not line.strip() or not line.startswith(" ") or not entry:
            continue
        indent, name, value = len(entry[1]), entry[2], entry[3]
        path = [(i, n) for i, n in path if i < indent]
        if value is None:
            path.append((indent, name))
        else:
            gpus[-1][1][(*(n for _, n in path), name)] = value
    return [_state(i, bus, values) for i, (bus, values) in enumerate(gpus)]


def _state(index: int, bus: str, v: dict[tuple[str, ...], str]) -> GpuState:
    def yes(*key: str) -> bool:
        return v.get(key, "").strip().lower() == "yes"
    return GpuState(
        index, bus, uuid=v.get(("GPU UUID",), ""),
        ecc_volatile=_uncorrectable(v, "Volatile"), ecc_aggregate=_uncorrectable(v, "Aggregate"),
        retired=_total(v, [k for k in v if k[:1] == ("Retired Pages",) and k[-1].endswith("Bit ECC")]),
        retire_pending=any(yes(*k) for k in v if k[:1] == ("Retired Pages",) and k[-1].startswith("Pending")),
        remapped=_total(v, [("Remapped Rows", "Correctable Error"), ("Remapped Rows", "Uncorrectable Error")]),
        remap_pending=yes("Remapped Rows", "Pending"), remap_failed=yes("Remapped Rows", "Remapping Failure Occurred"),
        reset_required=yes("GPU Reset Status", "Reset Required"))


def _uncorrectable(v: dict[tuple[str, ...], str], scope: str) -> int | None:
    """Volta's `Double Bit` > `Total`, else the sum of Ampere's and later `SRAM Uncorrectable ...` and `DRAM
    Uncorrectable` (the `Aggregate Uncorrectable SRAM Sources` split the same errors again: not counted)."""
    if ("ECC Errors", scope, "Double Bit", "Total") in v:
        return _total(v, [("ECC Errors", scope, "Double Bit", "Total")])
    return _total(v, [k for k in v if len(k) == 3 and k[:2] == ("ECC Errors", scope) and "Uncorrectable" in k[2]])


def _total(v: dict[tuple[str, ...], str], keys: list[tuple[str, ...]]) -> int | None:
    """The sum of the counts of keys, None where none is a number (N/A, absent)."""
    counts = [int(v[k]) for k in keys if re.fullmatch(r"[0-9]+", v.get(k, "").strip())]
    return sum(counts) if counts else None


# The script's counted lines (`3 Xid (PCI:...): 79, ...`), or the kernel's own as KERNEL_XID has them, or a bare
# message (`NVRM: Xid ...`, as `journalctl -o cat` prints it): never a line where NVRM comes after other text.
_XID = re.compile(r"(?:\s*([0-9]+) +|\[ *[0-9]+\.[0-9]+\] (?:[^ ]+ kernel: )?NVRM: |(?:[A-Z][a-z]{2} [ 0-9]{2} [0-9:]{8} "
                  r"[^ ]+ kernel: )?NVRM: )Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?: [^()]*)?\): "
                  r"([0-9]+),? ?(.*)")


def parse_xids(text: str) -> list[Xid]:
    """Xid lines -> one Xid for each GPU and code, with its count: the script's counted lines (`3 Xid (PCI:...): 79,
    ...`) or the kernel's own (dmesg, journalctl, syslog). The text kept is the first line's. Pure."""
    found: dict[tuple[str, int], Xid] = {}
    for line in lines(text):
        if not (m := _XID.match(line)):
            continue
        count, bus, code, said = int(m[1] or 1), m[2].lower(), int(m[3]), m[4].strip()
        had = found.get((bus_key(bus), code))
        found[(bus_key(bus), code)] = Xid(bus, code, had.text if had else said, count + (had.count if had else 0))
    return list(found.values())


# nvidia-smi of a GPU it cannot reach (one that fell off the bus): `Unable to determine the device handle for
# GPU0000:08:00.0: Unknown Error`, or `... for GPU1: 0000:34:00.0: Unknown Error`
_LOST = re.compile(r"Unable to determine the device handle for GPU ?(?:[0-9]+: )?((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}"
                   r":[0-9a-fA-F]{2}\.[0-7]): *(.*)")


def parse_lost(text: str) -> list[tuple[str, str]]:
    """(bus, what nvidia-smi said) of each GPU nvidia-smi could not reach. Pure."""
    return [(m[1], m[2].strip()) for line in lines(text) if (m := _LOST.search(line))]


def parse_health(text: str) -> GpuHealth | None:
    """SCRIPT's sections -> GpuHealth; None where the script did not run (neither section is there). Pure."""
    s = sections(text)
    if GPUQ not in s and XID not in s:
        return None
    log_lines = lines(s.get(XID, ""))
    source = log_lines[0].removeprefix("from").strip() if log_lines and log_lines[0].startswith("from") else ""
    return GpuHealth(tuple(parse_query(s.get(GPUQ, ""))), tuple(parse_xids("\n".join(log_lines[1:]))),
                     source if source in ("dmesg", "journalctl") else "", tuple(parse_lost(s.get(GPUQ, ""))))
