"""Does a built image really train across processes? Checked in a throwaway container.

Each fact is parsed from the image's own output. Horovod flavors: `horovodrun
--check-build` lists the frameworks, controllers and tensor operations the
flavor needs, and a 2-process Horovod allreduce returns the right sum.
TensorFlow flavors: two MultiWorkerMirroredStrategy workers all-reduce the
right sum, and a tf-gpu image's TensorFlow is a CUDA build. Then the versions
for the summary.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kit.config.settings import framework, uses_gpus
from kit.errors import VerifyFailed
from kit.image.recipe import EXPECTED_BUILD

if TYPE_CHECKING:  # (imported where it is used: `kit run`, `logs`, `exec` never need the docker SDK)
    import docker

VERIFY_HOST = "kit-verify"
CHECK_TIMEOUT_S = 180  # bounds each command in the container (coreutils `timeout`)

_SECTION = re.compile(r"^Available (Frameworks|Controllers|Tensor Operations):\s*$")
_ENTRY = re.compile(r"^\s*\[(X| )\]\s+(\S.*?)\s*$")
_VERSION = re.compile(r"^Horovod v(\S+?):?\s*$")
_ALLREDUCE = re.compile(r"kit-allreduce rank=(\d+) size=(\d+) sum=(\S+) expected=(\S+) (ok|WRONG)((?: [\w.]+=\S+)*)")

# Per framework: the versions an image reports (a JSON object, in the order shown).
VERSIONS_PY = {
    "horovod": "import json, platform, torch, horovod, horovod.torch as hvd; c = torch.version.cuda; "
               "print(json.dumps({'Python': platform.python_version(), 'torch': torch.__version__, "
               "'Horovod': horovod.__version__, 'cuda': c or '', "
               "'archs': torch._C._cuda_getArchFlags() if c else '', 'nccl_built': bool(hvd.nccl_built()), "
               "'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if c else ''}))",
    "tensorflow": "import json, platform, tensorflow as tf; print(json.dumps({'Python': platform.python_version(), "
                  "'TensorFlow': tf.__version__, 'cuda_build': str(tf.test.is_built_with_cuda())}))",
}


# GPU images: libibverbs loaded as NCCL's IB transport loads it (libibverbs.so, else libibverbs.so.1, then its device
# list), and its providers (mlx5: ConnectX, InfiniBand and RoCE): without them NCCL falls back to sockets in silence.
RDMA_PY = ("import ctypes, glob, json, os\n"
           "lib = name = None\n"
           "for name in ('libibverbs.so', 'libibverbs.so.1'):\n"
           "    try:\n        lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL); break\n"
           "    except OSError:\n        pass\n"
           "count = ctypes.c_int(-1)\n"
           "if lib:\n    lib.ibv_get_device_list.restype = ctypes.c_void_p\n"
           "    found = lib.ibv_get_device_list(ctypes.byref(count))\n"
           "    if found:\n        lib.ibv_free_device_list(ctypes.c_void_p(found))\n"  # NULL (no devices): freeing it crashes
           "providers = sorted(os.path.basename(p).split('-rdmav')[0].removeprefix('lib') "
           "for p in glob.glob('/usr/lib/*/libibverbs/*.so') + glob.glob('/usr/lib64/libibverbs/*.so'))\n"
           "print(json.dumps({'verbs': name if lib else '', 'devices': count.value, 'providers': providers}))")


def rdma_problem(found: dict) -> str:
    """What RDMA_PY found, as the reason NCCL could not use InfiniBand or RoCE in the image ("": it can). Pure."""
    if not found.get("verbs"):
        return "NCCL cannot load libibverbs (libibverbs1 is not installed)"
    if found.get("devices", -1) < 0:
        return f"{found['verbs']} loads, but its ibv_get_device_list does not answer"
    if "mlx5" not in found.get("providers", []):
        return "libibverbs has no mlx5 provider (ibverbs-providers is not installed): ConnectX ports are not seen"
    return ""


def versions_argv(kind: str) -> list[str]:
    """Isolated (-I): the versions are those of the image's own modules, whatever its working folder holds."""
    return ["python", "-I", "-c", VERSIONS_PY[kind]]


@dataclass(frozen=True)
class CheckBuild:
    """What `horovodrun --check-build` says was compiled in."""

    version: str
    frameworks: frozenset[str]
    controllers: frozenset[str]
    operations: frozenset[str]

    def missing(self, flavor: str) -> list[str]:
        frameworks, controllers, operations = EXPECTED_BUILD[flavor]
        return [f"{kind} {name}" for kind, want, have in (
            ("framework", frameworks, self.frameworks),
            ("controller", controllers, self.controllers),
            ("tensor operation", operations, self.operations),
        ) for name in sorted(want - have)]


def parse_check_build(text: str) -> CheckBuild:
    version, section = "", None
    found: dict[str, set[str]] = {"Frameworks": set(), "Controllers": set(), "Tensor Operations": set()}
    for line in text.splitlines():
        if m := _VERSION.match(line.strip()):
            version = m[1]
        elif m := _SECTION.match(line.strip()):
            section = m[1]
        elif (m := _ENTRY.match(line)) and section:
            if m[1] == "X":
                found[section].add(m[2])
    if not version:
        raise ValueError("no 'Horovod vX.Y.Z:' line in the output of horovodrun --check-build")
    return CheckBuild(version, frozenset(found["Frameworks"]), frozenset(found["Controllers"]),
                      frozenset(found["Tensor Operations"]))


@dataclass(frozen=True)
class AllreduceRank:
    rank: int
    size: int
    total: float
    expected: float
    ok: bool
    facts: tuple[tuple[str, str], ...] = ()  # --cuda / --ddp: host, device, gpu, driver, cuda, nccl

    def fact(self, name: str) -> str:
        return dict(self.facts).get(name, "")


def parse_allreduce(text: str) -> list[AllreduceRank]:
    return sorted((AllreduceRank(int(m[1]), int(m[2]), float(m[3]), float(m[4]), m[5] == "ok",
                                 tuple(tuple(w.split("=", 1)) for w in m[6].split()))
                   for m in _ALLREDUCE.finditer(text)), key=lambda r: r.rank)


@dataclass(frozen=True)
class CudaFacts:
    """What a gpu image is, read from it without a GPU: torch's CUDA, its GPU architectures, NCCL in Horovod."""

    cuda: str
    archs: tuple[str, ...]
    nccl: str
    nccl_built: bool

    def problems(self, line: str) -> list[str]:
        found = [] if self.cuda == line else [f"its torch is built for CUDA {self.cuda or 'none'}, not {line}"]
        found += [] if self.archs else ["its torch lists no GPU architecture"]
        found += [] if self.nccl_built else ["its Horovod was built without NCCL"]
        return found


@dataclass(frozen=True)
class GpuCheck:
    """The NCCL path, run on this machine's GPUs, or why it was not."""

    verified: bool
    why_not: str = ""
    horovod: tuple[AllreduceRank, ...] = ()   # horovodrun --cuda, one rank a GPU
    ddp: tuple[AllreduceRank, ...] = ()       # torchrun, torch.distributed with the nccl backend


def gpu_check_plan(gpus: int, nvidia_runtime: bool) -> str | None:
    """None when the build machine can run the NCCL check; else why not, said plainly (never a silent pass)."""
    if gpus == 0:
        return "no GPU is visible on this machine (nvidia-smi lists none)"
    if not nvidia_runtime:
        return (f"{gpus} GPU(s) here, but Docker has no nvidia runtime to give them to a container (kit prepare "
                "installs the NVIDIA Container Toolkit)")
    return None


@dataclass(frozen=True)
class ImageReport:
    tag: str
    image_id: str
    size_bytes: int
    versions: dict[str, str]
    check: CheckBuild | None      # Horovod flavors: what --check-build listed
    allreduce: tuple[AllreduceRank, ...]
    cuda: CudaFacts | None = None     # the gpu flavor
    gpu_check: GpuCheck | None = None


def allreduce_argv(kind: str, ranks: int) -> list[str]:
    """The check of an image's framework (horovod or tensorflow) with `ranks` processes."""
    if kind == "tensorflow":
        return ["python", "/opt/kit/tf_check.py", str(ranks)]
    return ["horovodrun", "-np", str(ranks), "-H", f"localhost:{ranks}",
            "python", "/opt/kit/allreduce_check.py"]


def verify_image(client: docker.DockerClient, tag: str, flavor: str, ranks: int = 2, cuda: str | None = None,
                 gpus: tuple[int, bool] | None = None) -> ImageReport:
    """cuda: the CUDA line the gpu flavor was built for; gpus: this machine's GPUs and whether Docker has the nvidia
    runtime (None: ask them)."""
    kind = framework(flavor)
    image = client.images.get(tag)
    box = _verify_box(client, tag)
    try:
        check = None
        if kind == "horovod":
            check = parse_check_build(_run(box, ["horovodrun", "--check-build"], tag))
            if missing := check.missing(flavor):
                raise VerifyFailed(f"image {tag} was built without {', '.join(missing)}",
                                   command="horovodrun --check-build",
                                   hint="the Horovod build did not find them; see the builder step with --verbose")
        allreduce = parse_allreduce(_run(box, allreduce_argv(kind, ranks), tag))
        _check_allreduce(allreduce, kind, ranks, tag)
        versions = json.loads(_run(box, versions_argv(kind), tag).strip().splitlines()[-1])
        rdma = json.loads(_run(box, ["python", "-I", "-c", RDMA_PY], tag).strip().splitlines()[-1]) \
            if uses_gpus(flavor) else None
    finally:
        box.remove(force=True)
    if rdma is not None:
        if problem := rdma_problem(rdma):
            raise VerifyFailed(f"image {tag}: {problem}", command="python -c RDMA_PY (kit.image.verify)",
                               hint="the GPU image's base step installs rdma-core's libraries; rebuild it with --verbose")
        versions["libibverbs"] = f"{rdma['verbs']} ({len(rdma['providers'])} providers, mlx5 among them)"
    if versions.pop("cuda_build", None) == "False" and uses_gpus(flavor):
        raise VerifyFailed(f"image {tag}: its TensorFlow {versions['TensorFlow']} is not built with CUDA",
                           command=VERSIONS_PY[kind],
                           hint="the GPU flavor needs tensorflow[and-cuda], not tensorflow-cpu")
    facts = CudaFacts(versions.pop("cuda", ""), tuple(versions.pop("archs", "").split()), versions.pop("nccl", ""),
                      bool(versions.pop("nccl_built", False))) if kind == "horovod" else None
    gpu_check = None
    if flavor == "gpu":
        if problems := facts.problems(cuda or facts.cuda):
            raise VerifyFailed(f"image {tag}: {'; '.join(problems)}", command=VERSIONS_PY[kind],
                               hint="rebuild it with --verbose and read the torch and builder steps")
        gpu_check = check_gpus(client, tag, *(gpus if gpus is not None else gpus_here(client)))
    return ImageReport(tag=tag, image_id=image.id, size_bytes=image.attrs["Size"], versions=versions, check=check,
                       allreduce=tuple(allreduce), cuda=facts if flavor == "gpu" else None, gpu_check=gpu_check)


def _verify_box(client: docker.DockerClient, tag: str, gpus: bool = False):
    """A throwaway container of the image. No network: the check proves the image alone and sends nothing anywhere.
    Gloo binds to the address of the hostname, so the hostname must resolve (to loopback) or ranks crash."""
    import docker.types
    devices = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None
    return client.containers.run(tag, ["sleep", "infinity"], detach=True, network_mode="none",
                                 hostname=VERIFY_HOST, extra_hosts={VERIFY_HOST: "127.0.0.1"}, shm_size="1g",
                                 name=f"kit-verify-{uuid.uuid4().hex[:8]}", labels={"io.kit.role": "verify"},
                                 device_requests=devices)


def gpus_here(client: docker.DockerClient) -> tuple[int, bool]:
    """This machine's GPUs (nvidia-smi's list), and whether Docker has the nvidia runtime to give them."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    return (len([line for line in listed.splitlines() if line.startswith("GPU ")]),
            "nvidia" in (client.info().get("Runtimes") or {}))


def check_gpus(client: docker.DockerClient, tag: str, gpus: int, nvidia_runtime: bool) -> GpuCheck:
    """CUDA tensors allreduced through NCCL on every GPU here: by Horovod (horovodrun) and by torch.distributed
    (torchrun, nccl backend). Without a GPU: a GpuCheck that says why it was not run."""
    why = gpu_check_plan(gpus, nvidia_runtime)
    if why:
        return GpuCheck(False, why)
    box = _verify_box(client, tag, gpus=True)
    try:
        horovod = parse_allreduce(_run(box, cuda_allreduce_argv("horovod", gpus), tag))
        ddp = parse_allreduce(_run(box, cuda_allreduce_argv("ddp", gpus), tag))
    finally:
        box.remove(force=True)
    for seen, how in ((horovod, "horovod"), (ddp, "ddp")):
        _check_allreduce(seen, how, gpus, tag, command=cuda_allreduce_argv(how, gpus))
    return GpuCheck(True, horovod=tuple(horovod), ddp=tuple(ddp))


def cuda_allreduce_argv(how: str, gpus: int) -> list[str]:
    """One rank a GPU: Horovod over NCCL (--cuda), or DDP's nccl backend under torchrun (--ddp)."""
    if how == "ddp":
        return ["torchrun", "--standalone", "--nproc-per-node", str(gpus), "/opt/kit/allreduce_check.py", "--ddp"]
    return ["horovodrun", "-np", str(gpus), "-H", f"localhost:{gpus}", "python", "/opt/kit/allreduce_check.py",
            "--cuda"]


def _check_allreduce(ranks_seen: list[AllreduceRank], kind: str, ranks: int, tag: str,
                     command: list[str] | None = None) -> None:
    wrong = [r for r in ranks_seen if not r.ok or r.size != ranks]
    if len(ranks_seen) != ranks or wrong:
        got = ", ".join(f"rank {r.rank}: {r.total:g} (expected {r.expected:g})" for r in ranks_seen) or "no rank"
        what = {"horovod": "Horovod", "ddp": "torch.distributed (nccl backend)"}.get(
            kind, "TensorFlow's MultiWorkerMirroredStrategy")
        raise VerifyFailed(f"image {tag}: the {ranks}-process allreduce is wrong ({got})",
                           command=shlex.join(command or allreduce_argv(kind, ranks)),
                           hint=f"the image's {what} cannot allreduce; rebuild with --verbose and read the failing step")


def _run(box, argv: list[str], tag: str) -> str:
    code, out = box.exec_run(["timeout", str(CHECK_TIMEOUT_S)] + argv)
    text = out.decode(errors="replace")
    if code != 0:
        raise VerifyFailed(f"image {tag}: `{shlex.join(argv)}` exited {code}", command=shlex.join(argv),
                           output_tail="\n".join(text.splitlines()[-20:]),
                           hint="the image is broken; rebuild it with --verbose and read the failing step")
    return text
