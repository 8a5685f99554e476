"""Before a long job (`kit run --preflight`, `kit doctor --deep`): every host's compute and links measured in a few
seconds, each compared with the others', and the host that would hold the job back named with its figure.

- Compute: a matrix product of fixed size timed in each host's container, all at once (torch, on the GPU where the
  container has one; on a CPU, one core's). A host FACTOR times slower than the median of the others is named.
- Links: a ring first, every host sending to the next at once (one round, one link a host each way, so each figure
  is that link's alone). A ring link slower than the median ring link by FACTOR names two suspects, its ends; each
  suspect is then measured with a host whose ring links were fine (the halves: suspects on one side, good hosts on
  the other, all pairs at once), both ways, and a suspect slow with a good partner too is the bad host. With no good
  host to pair with (two hosts), the host every slow link touches is named.
- GPUs: their health since boot (kit.doctor.gpuhealth), where the hosts have GPUs.
- Against the cluster's baseline (`kit bench baseline`: the same measurements, kept): a host whose matrix product,
  or whose fastest ring link, runs FACTOR times slower than its own figure there is named too, so a host is named
  even where it has no other to be compared with, or all are slow alike.

The measuring runs through kit.bench.net's helper (TCP between the containers, on the training network).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from kit.bench import net as netbench
from kit.cluster.fanout import fan_out
from kit.cluster.identity import write_file
from kit.cluster.steps.node import Node
from kit.doctor import gpufacts
from kit.doctor.finding import FAIL, OK, WARN, Finding
from kit.doctor.gpufacts import GpuHealth
from kit.doctor.gpuhealth import judge_health
from kit.errors import KitError
from kit.jobs.commands.docker import command, exec_argv

FACTOR = 1.5         # slower than the others' median by this much: named
LINK_S = 1.0         # each link measured this long
SIZE = 512           # the matrix product's side
TIMEOUT_S = 60       # the compute check on one host

COMPUTE = r"""
import json, os, sys, time
n = int(sys.argv[1])
for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # on a CPU: one core's figure, as on
    os.environ[name] = "1"                                                   # every host (no thread fights another)
try:  # torch (on the GPU where there is one); a TensorFlow image's numpy else
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(1)
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    product, done = torch.mm, (torch.cuda.synchronize if device == "cuda" else lambda: None)
except ImportError:
    import numpy
    device, done = "cpu, numpy", lambda: None
    a, b = numpy.random.rand(n, n).astype("float32"), numpy.random.rand(n, n).astype("float32")
    product = numpy.matmul
product(a, b)
done()
reps, began = 0, time.perf_counter()
while time.perf_counter() - began < 1.0:
    product(a, b)
    reps += 1
done()
took = time.perf_counter() - began
print(json.dumps({"gflops": 2 * n ** 3 * reps / took / 1e9, "device": device}))
"""


@dataclass(frozen=True)
class Compute:
    host: str
    gflops: float
    device: str


@dataclass(frozen=True)
class Figures:
    """A host's figures, as the checks measure them: its matrix product, and its fastest ring link (a host's ring
    links are to and from two others: its fastest one is its own speed where a neighbour is slow)."""

    gflops: float | None = None
    device: str = ""
    gbits: float | None = None


def figures_of(compute: list[Compute], ring_links: list[netbench.Link], names: list[str]) -> dict[str, Figures]:
    """host -> its figures. Pure."""
    cpu = {c.host: c for c in compute}
    out = {}
    for name in names:
        mine = [l.gbits for l in ring_links if name in (l.source, l.target)]
        c = cpu.get(name)
        out[name] = Figures(c.gflops if c else None, c.device if c else "", max(mine) if mine else None)
    return out


BASELINE = "baseline.json"  # in the cluster's folder on this machine (kit bench baseline)


def save_baseline(folder: Path, figures: dict[str, Figures], when: float | None = None) -> Path:
    """The cluster's baseline, written anew (0600 in kit's own folder, as its other records)."""
    path = folder / BASELINE
    data = {"taken": when if when is not None else time.time(), "hosts": {h: asdict(f) for h, f in figures.items()}}
    write_file(path, (json.dumps(data, indent=2) + "\n").encode(), 0o600)
    return path


def load_baseline(folder: Path) -> tuple[float, dict[str, Figures]] | None:
    """(when it was taken, host -> its figures), or None where there is none (or it is not one: kit wrote it, but a
    user may have edited it)."""
    try:
        raw = json.loads((folder / BASELINE).read_text())
        hosts = {str(h): Figures(_positive(f.get("gflops")), str(f.get("device") or ""), _positive(f.get("gbits")))
                 for h, f in raw["hosts"].items()}
        return float(raw["taken"]), hosts
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _positive(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1e9 else None


def against_baseline(now: dict[str, Figures], baseline: tuple[float, dict[str, Figures]] | None,
                     factor: float = FACTOR) -> dict[str, list[tuple[str, str, str]]]:
    """host -> [(check, its figure, its share of its baseline's)], for each figure `factor` times below its
    baseline's (a matrix product on another device than the baseline's is not compared). Pure."""
    if baseline is None:
        return {}
    taken, base = baseline
    day = time.strftime("%Y-%m-%d", time.localtime(taken))
    out: dict[str, list[tuple[str, str, str]]] = {}
    for host, f in now.items():
        b = base.get(host)
        if b is None:
            continue
        if f.gflops and b.gflops and f.device == b.device and f.gflops * factor <= b.gflops:
            out.setdefault(host, []).append((
                "compute", f"its {SIZE}x{SIZE} matrix product ({f.device}) runs at {f.gflops:.1f} GFLOP/s",
                f"{f.gflops / b.gflops:.2f} of its baseline ({b.gflops:.1f} on {day})"))
        if f.gbits and b.gbits and f.gbits * factor <= b.gbits:
            out.setdefault(host, []).append((
                "links", f"its fastest link runs at {f.gbits:.2f} Gbit/s",
                f"{f.gbits / b.gbits:.2f} of its baseline ({b.gbits:.2f} on {day})"))
    return out


def ring(names: list[str]) -> list[tuple[str, str]]:
    """Each host sends to the next, the last to the first: one link a host each way, all at once. Pure."""
    if len(names) < 2:
        return []
    return [(names[i], names[(i + 1) % len(names)]) for i in range(len(names))] if len(names) > 2 else \
        [(names[0], names[1]), (names[1], names[0])]


def reference(links: list[netbench.Link]) -> float:
    """What a link runs at here: the median of the faster half (a bad host slows two links of a ring: in a ring of
    three or four, half of them). Pure."""
    fast = sorted((l.gbits for l in links), reverse=True)[:max(1, (len(links) + 1) // 2)]
    return statistics.median(fast) if fast else 0.0


def slow_links(links: list[netbench.Link], factor: float = FACTOR) -> list[netbench.Link]:
    """The links slower than the others (reference) by `factor`. Pure."""
    if len(links) < 2:
        return []
    return [l for l in links if l.gbits * factor <= reference(links)]


def halves(names: list[str], slow: list[netbench.Link]) -> list[tuple[str, str]]:
    """Each suspect (an end of a slow ring link) with a host none of whose ring links was slow, both ways, each
    good host in one pair at most where there are enough (so all pairs run at once). Pure."""
    suspects = sorted({end for l in slow for end in (l.source, l.target)}, key=names.index)
    good = [n for n in names if n not in suspects]
    if not good:
        return []
    pairs = []
    for i, suspect in enumerate(suspects):
        partner = good[i % len(good)]
        pairs += [(suspect, partner), (partner, suspect)]
    return pairs


def bad_hosts(names: list[str], ring_links: list[netbench.Link], pair_links: list[netbench.Link],
              factor: float = FACTOR) -> dict[str, str]:
    """host -> its figure, for each host that holds the links back: a suspect slow with a good host too; with no
    good host to pair with, the one every slow ring link touches. Pure."""
    slow = slow_links(ring_links, factor)
    if not slow:
        return {}
    middle = statistics.median(l.gbits for l in ring_links if l not in slow)
    if pair_links:
        found = {}
        for suspect in {end for l in slow for end in (l.source, l.target)}:
            mine = [l for l in pair_links if suspect in (l.source, l.target)]
            if mine and all(l.gbits * factor <= middle for l in mine):
                low = min(mine, key=lambda l: l.gbits)
                found[suspect] = (f"its links run at {low.gbits:.2f} Gbit/s ({low.source} -> {low.target}), the "
                                  f"others' at {middle:.2f}")
        return found
    common = set.intersection(*({l.source, l.target} for l in slow))
    if len(common) == 1 and len(slow) > 1:
        (host,) = common
        low = min(slow, key=lambda l: l.gbits)
        return {host: f"its links run at {low.gbits:.2f} Gbit/s ({low.source} -> {low.target}), the others' at "
                      f"{middle:.2f}"}
    return {}


def slow_compute(found: list[Compute], factor: float = FACTOR) -> dict[str, str]:
    """host -> its figure, for each host whose matrix product is `factor` times slower than the others' median. Pure."""
    out = {}
    for c in found:
        others = [o.gflops for o in found if o.host != c.host]
        if others and c.gflops * factor <= statistics.median(others):
            out[c.host] = (f"its {SIZE}x{SIZE} matrix product ({c.device}) runs at {c.gflops:.1f} GFLOP/s, the "
                           f"others' at {statistics.median(others):.1f}")
    return out


def measure_compute(nodes: list[Node]) -> list[Compute]:
    """The matrix product timed in every host's container at once."""
    def one(node: Node) -> Compute:
        r = node.runner.run(command(["timeout", str(TIMEOUT_S), *exec_argv(
            node.place.container, ["python", "-I", "-c", COMPUTE, str(SIZE)])]), timeout=TIMEOUT_S + 10)
        r.check("kit's compute check failed", hint="`kit doctor` says whether the host's container and its image "
                "are as kit made them")
        return compute_of(node.name, r.stdout)
    return fan_out("the compute check", nodes, one, lambda n: n.name)


GFLOPS_MAX = 1e7   # 10 PFLOP/s: a hundred times the fastest GPU's dense product; a figure above it is no measurement


def compute_of(host: str, stdout: str) -> Compute:
    """The compute check's last line -> the host's figure. What the host's image says is not taken on trust: a
    figure that is no finite, positive number below GFLOPS_MAX (`Infinity` made every other host slow against it,
    and `--exclude-bad` dropped the good ones) is that host's 0.0, said as such. Pure."""
    try:
        raw = json.loads((stdout.strip().splitlines() or [""])[-1])
        gflops, device = float(raw["gflops"]), "".join(c for c in str(raw["device"])[:40] if c.isprintable())
    except (ValueError, KeyError, TypeError, AttributeError):
        raise KitError("kit's compute check printed no figure", host=host, output_tail=stdout[-500:],
                       hint="`kit doctor` says whether the host's container and its image are as kit made them")
    if not (math.isfinite(gflops) and 0 < gflops < GFLOPS_MAX):
        return Compute(host, 0.0, f"{device}; its check said {raw['gflops']!r}, not a figure")
    return Compute(host, gflops, device)


def measure_links(nodes: list[Node], at: dict[str, str],
                  measure: Callable[..., netbench.Link] = netbench.measure) -> tuple[list[netbench.Link],
                                                                                  list[netbench.Link]]:
    """The ring's links, then the halves' where the ring has a slow one: (ring links, pair links)."""
    by_name = {n.name: n for n in nodes}
    names = [n.name for n in nodes]

    def each(pairs: list[tuple[str, str]]) -> list[netbench.Link]:
        return fan_out("the link check", pairs, lambda p: measure(by_name[p[0]], by_name[p[1]], LINK_S,
                                                                  at.get(p[1], "")),
                       lambda p: f"{p[0]} -> {p[1]}")
    ring_links = each(ring(names))
    slow = slow_links(ring_links)
    return ring_links, each(halves(names, slow)) if slow else []


def measure_gpu_health(nodes: list[Node]) -> dict[str, GpuHealth | None]:
    """Each host's GPUs' health since boot, read on the host (kit.doctor.gpufacts), all at once."""
    def one(node: Node) -> GpuHealth | None:
        bound = gpufacts.NVIDIA_SMI_TIMEOUT_S * 2 + gpufacts.LOG_TIMEOUT_S * 3 + 10
        r = node.runner.run(gpufacts.SCRIPT, timeout=bound)
        return gpufacts.parse_health(r.stdout) if r.ok else None
    return dict(zip((n.name for n in nodes), fan_out("the GPUs' health", nodes, one, lambda n: n.name)))


def findings(compute: list[Compute], ring_links: list[netbench.Link], pair_links: list[netbench.Link],
             names: list[str], gpus: dict[str, GpuHealth | None] | None = None,
             baseline: tuple[float, dict[str, Figures]] | None = None) -> list[Finding]:
    """What the preflight says of each host: ok, or the figure that names it (its GPUs' health too, where read; and
    its figures against the cluster's baseline, where there is one)."""
    out = [f for name in names for f in judge_health(name, (gpus or {}).get(name)) if f.level != OK]
    slow_links_of = bad_hosts(names, ring_links, pair_links)
    slow_cpu = slow_compute(compute)
    below = against_baseline(figures_of(compute, ring_links, names), baseline)
    for name in names:
        for check, figure, share in below.get(name, ()):
            named = slow_links_of if check == "links" else slow_cpu
            if name in named:  # (slower than the others too: said once, with both)
                named[name] += f"; {share}"
            else:
                out.append(Finding(name, check, WARN, f"{figure}, {share}",
                                   "`kit doctor` on the host (its devices, its NIC's speed); `kit bench baseline` "
                                   "records the cluster anew once it changed for good"))
        if name in slow_links_of:
            out.append(Finding(name, "links", FAIL, slow_links_of[name],
                               "look at its NIC and cable (`ethtool` on the host: its speed, errors); "
                               "`kit run --exclude-bad` runs the job on the other hosts"))
        if name in slow_cpu:
            out.append(Finding(name, "compute", WARN, slow_cpu[name],
                               "another job on its CPUs or GPUs, a throttled or failing device (`kit doctor`); "
                               "`kit run --exclude-bad` runs the job on the other hosts"))
        if name not in slow_links_of and name not in slow_cpu and not any(f.host == name for f in out):
            mine = [l.gbits for l in ring_links if name in (l.source, l.target)]
            cpu = next((c for c in compute if c.host == name), None)
            out.append(Finding(name, "preflight", OK, ", ".join(filter(None, [
                f"links {min(mine):.2f} Gbit/s" if mine else "", f"{cpu.gflops:.1f} GFLOP/s" if cpu else ""]))))
    return out


def measure_all(nodes: list[Node], at: dict[str, str], gpus: bool = False) -> tuple[
        list[Compute], list[netbench.Link], list[netbench.Link], dict[str, GpuHealth | None] | None]:
    """(compute, ring links, pair links, GPUs' health or None): what the preflight measures, on these hosts (links
    only where there are two or more)."""
    compute = measure_compute(nodes)
    ring_links, pairs = measure_links(nodes, at) if len(nodes) > 1 else ([], [])
    return compute, ring_links, pairs, measure_gpu_health(nodes) if gpus else None
