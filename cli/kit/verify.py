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
import uuid
from dataclasses import dataclass

import docker
import docker.errors

from kit.config import framework, uses_gpus
from kit.errors import VerifyFailed
from kit.recipe import EXPECTED_BUILD

VERIFY_HOST = "kit-verify"
CHECK_TIMEOUT_S = 180  # bounds each command in the container (coreutils `timeout`)

_SECTION = re.compile(r"^Available (Frameworks|Controllers|Tensor Operations):\s*$")
_ENTRY = re.compile(r"^\s*\[(X| )\]\s+(\S.*?)\s*$")
_VERSION = re.compile(r"^Horovod v(\S+?):?\s*$")
_ALLREDUCE = re.compile(r"kit-allreduce rank=(\d+) size=(\d+) sum=(\S+) expected=(\S+) (ok|WRONG)")

# Per framework: the versions an image reports (a JSON object, in the order shown).
VERSIONS_PY = {
    "horovod": "import json, platform, torch, horovod; print(json.dumps({'Python': platform.python_version(), "
               "'torch': torch.__version__, 'Horovod': horovod.__version__}))",
    "tensorflow": "import json, platform, tensorflow as tf; print(json.dumps({'Python': platform.python_version(), "
                  "'TensorFlow': tf.__version__, 'cuda_build': str(tf.test.is_built_with_cuda())}))",
}


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


def parse_allreduce(text: str) -> list[AllreduceRank]:
    return sorted((AllreduceRank(int(m[1]), int(m[2]), float(m[3]), float(m[4]), m[5] == "ok")
                   for m in _ALLREDUCE.finditer(text)), key=lambda r: r.rank)


@dataclass(frozen=True)
class ImageReport:
    tag: str
    image_id: str
    size_bytes: int
    versions: dict[str, str]
    check: CheckBuild | None      # Horovod flavors: what --check-build listed
    allreduce: tuple[AllreduceRank, ...]


def allreduce_argv(kind: str, ranks: int) -> list[str]:
    """The check of an image's framework (horovod or tensorflow) with `ranks` processes."""
    if kind == "tensorflow":
        return ["python", "/opt/kit/tf_check.py", str(ranks)]
    return ["horovodrun", "-np", str(ranks), "-H", f"localhost:{ranks}",
            "python", "/opt/kit/allreduce_check.py"]


def verify_image(client: docker.DockerClient, tag: str, flavor: str, ranks: int = 2) -> ImageReport:
    kind = framework(flavor)
    image = client.images.get(tag)
    # No network: the check proves the image alone and sends nothing anywhere. Gloo binds to
    # the address of the hostname, so the hostname must resolve (to loopback) or ranks crash.
    box = client.containers.run(tag, ["sleep", "infinity"], detach=True, network_mode="none",
                                hostname=VERIFY_HOST, extra_hosts={VERIFY_HOST: "127.0.0.1"}, shm_size="256m",
                                name=f"kit-verify-{uuid.uuid4().hex[:8]}", labels={"io.kit.role": "verify"})
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
        versions = json.loads(_run(box, ["python", "-c", VERSIONS_PY[kind]], tag).strip().splitlines()[-1])
    finally:
        box.remove(force=True)
    if versions.pop("cuda_build", None) == "False" and uses_gpus(flavor):
        raise VerifyFailed(f"image {tag}: its TensorFlow {versions['TensorFlow']} is not built with CUDA",
                           command=VERSIONS_PY[kind],
                           hint="the GPU flavor needs tensorflow[and-cuda], not tensorflow-cpu")
    return ImageReport(tag=tag, image_id=image.id, size_bytes=image.attrs["Size"], versions=versions, check=check,
                       allreduce=tuple(allreduce))


def _check_allreduce(ranks_seen: list[AllreduceRank], kind: str, ranks: int, tag: str) -> None:
    wrong = [r for r in ranks_seen if not r.ok or r.size != ranks]
    if len(ranks_seen) != ranks or wrong:
        got = ", ".join(f"rank {r.rank}: {r.total:g} (expected {r.expected:g})" for r in ranks_seen) or "no rank"
        what = "Horovod" if kind == "horovod" else "TensorFlow's MultiWorkerMirroredStrategy"
        raise VerifyFailed(f"image {tag}: the {ranks}-process allreduce is wrong ({got})",
                           command=shlex.join(allreduce_argv(kind, ranks)),
                           hint=f"the image's {what} cannot allreduce; rebuild with --verbose and read the failing step")


def _run(box, argv: list[str], tag: str) -> str:
    code, out = box.exec_run(["timeout", str(CHECK_TIMEOUT_S)] + argv)
    text = out.decode(errors="replace")
    if code != 0:
        raise VerifyFailed(f"image {tag}: `{shlex.join(argv)}` exited {code}", command=shlex.join(argv),
                           output_tail="\n".join(text.splitlines()[-20:]),
                           hint="the image is broken; rebuild it with --verbose and read the failing step")
    return text
