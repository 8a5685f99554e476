"""The image's Python packages, resolved on this machine with its own pip into the build's wheelhouse.

Each stage of the image installs one group of files with `pip install --no-index`,
so the build needs no network and no credential ever reaches it. A group is
resolved for the image's Python and platform (`pip download --python-version
--platform --only-binary=:all:`), not this machine's. Groups follow the stages, so
that a change of the user's extra packages leaves torch's and Horovod's layers as
they were. So that they stay so when the index has moved on since (a new release
of one of torch's loose dependencies would change torch's layer, and every host
would be sent the whole image again), a group whose pip run and sources are those
of an image built before takes the very files it took then (pins, kept by the
group's key in state_root()/.wheels). A pin records the requirements it was
resolved for and each file's sha256: it serves only a group of the same
requirements, and a file that pip now gets under a pinned name with another
sha256 stops the build (an index that changed a release's file in place).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename

from kit.config.settings import CUDA_LINES, BuildConfig
from kit.errors import KitError
from kit.image.pipconfig import PipSettings, run_env
from kit.redact import text as redact_text

RESOLVE_TIMEOUT_S = 3600  # a bound on one pip run; multi-GB CUDA wheels over a slow proxy take long
TAIL_LINES = 15

# What the torch stage installs besides torch: Horovod's runtime needs, and numpy.
HOROVOD_RUNTIME = ("cloudpickle", "psutil", "pyyaml", "packaging", "numpy")
# What every image's last stage installs: py-spy, for the stacks of a hung job's ranks (`kit stacks`).
TOOLS = ("py-spy>=0.4,<0.5",)
# What Horovod's build needs besides torch (setup_requires asks for cffi when it builds the torch extension), and
# CMake from pip: the current one (4.x) on every base, not the distribution's.
HOROVOD_BUILD = ("setuptools", "wheel", "cffi", "cmake>=3.24")


@dataclass(frozen=True)
class Group:
    """One pip run: requirements resolved into the wheelhouse folder `folder`."""

    folder: str
    requirements: tuple[str, ...]
    no_deps: bool = False
    sdist: bool = False            # a source archive (Horovod's), not wheels
    along: tuple[str, ...] = ()    # resolved together with these (a lower stage's), whose files are not repeated


def build_requirements(config: BuildConfig) -> tuple[str, ...]:
    """Horovod's build: its tools, and for the gpu flavor the CUDA compiler, headers and CCCL of torch's own CUDA
    (resolved along with torch, so that pip takes the very version torch pins), unless a CUDA base brings them."""
    cuda = CUDA_LINES[config.cuda].compiler if config.cuda and not config.builder_image else ()
    return HOROVOD_BUILD + cuda


def torch_requirement(config: BuildConfig) -> str:
    """torch pinned; the cpu flavor asks for the +cpu build, so a CUDA build of several GB is never taken by chance,
    and a CUDA line that PyPI's torch is not asks for its own build (+cu128), never PyPI's of another CUDA."""
    version = config.torch or ""
    local = "cpu" if config.flavor == "cpu" else CUDA_LINES[config.cuda].torch_local if config.cuda else None
    if local and "+" not in version:
        version += f"+{local}"
    return f"torch=={version}"


def horovod_requirement(config: BuildConfig) -> str:
    return config.horovod_source or f"horovod=={config.horovod_version}"


def tensorflow_requirements(config: BuildConfig) -> tuple[str, str]:
    """(TensorFlow, tf-keras of the same minor). tf-cpu's tf-keras goes in without deps: it asks for `tensorflow`."""
    minor = ".".join((config.tensorflow or "").split(".")[:2])
    tf = f"tensorflow[and-cuda]=={config.tensorflow}" if config.gpu else f"tensorflow-cpu=={config.tensorflow}"
    return tf, f"tf-keras=={minor}.*"


def groups(config: BuildConfig) -> list[Group]:
    """The pip runs of a recipe, lowest stage first."""
    user = config.pip_packages
    if config.framework == "tensorflow":
        tf, keras = tensorflow_requirements(config)
        found = [Group("tf", (tf, keras))] if config.gpu else [Group("tf", (tf,)), Group("tf", (keras,), no_deps=True)]
        base = (tf, keras) if config.gpu else (tf,)
    else:
        base = (torch_requirement(config), *HOROVOD_RUNTIME)
        found = [Group("torch", base), Group("build", build_requirements(config), along=base),
                 Group("horovod", (horovod_requirement(config),), no_deps=True, sdist=True)]
    if user:
        found.append(Group("user", user, along=base))
    return found + [Group("tools", TOOLS)]


@dataclass(frozen=True)
class Target:
    """The image's Python and platform, for which wheels are chosen."""

    python: str          # "3.11"
    machine: str         # x86_64, aarch64
    glibc: tuple[int, int]

    def pip_options(self) -> list[str]:
        major, minor = self.python.split(".")
        tags = [f"manylinux_2_{m}_{self.machine}" for m in range(self.glibc[1], 4, -1)] if self.glibc[0] == 2 else []
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        tags += [f"{name}_{self.machine}" for m, name in legacy.items() if self.glibc >= (2, m)]
        tags.append(f"linux_{self.machine}")
        return ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp",
                "--abi", f"cp{major}{minor}", *(arg for tag in tags for arg in ("--platform", tag))]

    def describe(self) -> str:
        return f"CPython {self.python}, glibc {self.glibc[0]}.{self.glibc[1]}, {self.machine}"


_GLIBC = re.compile(r"^ldd .*?(\d+)\.(\d+)\s*$", re.M)
MACHINES = {"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le", "s390x": "s390x"}


def parse_glibc(ldd_version: str) -> tuple[int, int] | None:
    """The glibc version from `ldd --version` (its first line ends with it)."""
    m = _GLIBC.search(ldd_version)
    return (int(m[1]), int(m[2])) if m else None


def download_argv(python: str, group: Group, target: Target, dest: Path) -> list[str]:
    """The pip run of one group. Pure: tested by exact equality."""
    argv = [python, "-m", "pip", "download", "--no-input", "--progress-bar", "off", "--dest", str(dest)]
    if group.sdist:
        # No build isolation: pip would start a second pip for setuptools, with the indexes (and their
        # credentials) on its command line, and need setuptools as a source archive too. kit's own setuptools
        # (a dependency of kit) prepares the archive's metadata instead.
        argv += ["--no-binary", ":all:", "--no-build-isolation"]
    else:
        argv += target.pip_options()
    if group.no_deps:
        argv.append("--no-deps")
    return argv + list(group.along) + list(group.requirements)


def group_key(group: Group, target: Target, settings: PipSettings) -> str:
    """What a group's files depend on: its pip run (requirements, flags, the image's platform) and pip's sources as
    `kit build` names them (credentials hidden: a token that rotates keeps the key)."""
    run = [group.folder, group.requirements, group.no_deps, group.sdist, group.along, target.pip_options(),
           settings.describe()]
    return hashlib.sha256(json.dumps(run).encode()).hexdigest()[:32]


def pinned(group: Group, names: list[str]) -> Group:
    """The group's pip run for exactly these files (a resolution of it kept from before): each wheel by its name and
    its whole version string (===: 2.4.6 is not 2.4.6+cpu), nothing else."""
    pins = []
    for name in names:
        dist, version, _, _ = parse_wheel_filename(name)
        pins.append(f"{dist}==={version}")
    return Group(group.folder, tuple(pins), no_deps=True)


def can_pin(group: Group) -> bool:
    """Wheels only, each from an index or folder: a source archive's group is one exact release already, and a
    package from a URL is not found by its version."""
    return not group.sdist and not any(Requirement(r).url for r in group.requirements + group.along)


def pin(group: Group, files: Mapping[str, str]) -> dict:
    """What a pin keeps of a group's resolution: the requirements it was for, and each file's name and sha256."""
    return {"requirements": list(group.requirements), "along": list(group.along),
            "files": [[name, digest] for name, digest in files.items()]}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for part in iter(lambda: f.read(1 << 20), b""):
            digest.update(part)
    return digest.hexdigest()


class Pins:
    """The files each group took in an image that was built (its key -> pin(): requirements, names and sha256), in
    `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str, group: Group) -> dict[str, str] | None:
        """The files kept for the key (name -> sha256) if they were resolved for the group's requirements; None for
        none, for another group's, or for a file that is not a pin (an older kit's names without hashes among them)."""
        try:
            kept = json.loads(self.path(key).read_text())
            if not isinstance(kept, dict) or (kept.get("requirements"), kept.get("along")) != (
                    list(group.requirements), list(group.along)):
                return None
            files = {name: digest for name, digest in kept["files"]}
            for name, digest in files.items():
                parse_wheel_filename(name)
                if not re.fullmatch(r"[0-9a-f]{64}", digest):
                    return None
            return files
        except (OSError, ValueError, KeyError, TypeError):  # InvalidWheelFilename is a ValueError
            return None

    def unhashed(self, key: str) -> bool:
        """Whether the key's pin is an older kit's: a list of names, with no hash to check the files against."""
        try:
            return isinstance(json.loads(self.path(key).read_text()), list)
        except (OSError, ValueError):
            return False

    def keep(self, resolved: Mapping[str, dict]) -> None:
        """Each key's pin, written whole (a file of its own, then renamed: builds side by side each write theirs)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for key, kept in resolved.items():
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.")
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(kept))
            os.replace(tmp, self.path(key))


@dataclass
class Wheelhouse:
    """The resolved files, per folder of the build context's wheelhouse."""

    root: Path
    files: dict[str, list[Path]]
    seconds: float = 0.0
    resolved: dict[str, dict] = field(default_factory=dict)  # each pinnable group's key -> its pin (see pin())
    pinned: tuple[str, ...] = ()  # the folders whose files are all those of an image built before
    unhashed: tuple[str, ...] = ()  # the folders resolved anew because their pins were an older kit's, without hashes

    @property
    def size(self) -> int:
        return sum(f.stat().st_size for fs in self.files.values() for f in fs)

    def count(self) -> int:
        return sum(len(fs) for fs in self.files.values())

    def find(self, prefix: str) -> Path | None:
        return next((f for fs in self.files.values() for f in fs if f.name.lower().startswith(prefix)), None)


Run = Callable[..., subprocess.CompletedProcess]


def resolve(config: BuildConfig, target: Target, settings: PipSettings, root: Path, *,
            env: Mapping[str, str] | None = None, python: str = sys.executable, run: Run = subprocess.run,
            on_status: Callable[[str], None] = lambda s: None, pins: Pins | None = None) -> Wheelhouse:
    """Every group's files into root/<folder>, with this machine's pip and the given settings; a group `pins` knows
    takes the files it took before."""
    env = dict(os.environ if env is None else env)
    started = time.monotonic()
    files: dict[str, list[Path]] = {}
    resolved: dict[str, dict] = {}
    unhashed: list[str] = []
    kept: dict[str, bool] = {}  # folder -> whether each of its groups kept its files
    fresh_below = False  # a group below, that could have kept its files, was resolved anew
    with tempfile.TemporaryDirectory(prefix="kit-pip-") as tmp:
        conf = Path(tmp) / "pip.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold an index's credentials
        with os.fdopen(fd, "w") as f:
            f.write(settings.config_file())
        pip_env = run_env(env, conf)
        for group in groups(config):
            on_status(redact_text(f"resolving {group.folder}: {' '.join(group.requirements)}"))
            dest = root / group.folder
            dest.mkdir(parents=True, exist_ok=True)
            key = group_key(group, target, settings) if can_pin(group) else None
            # A group resolved along the groups below keeps its files only while they keep theirs: its files were
            # what those lacked.
            names = pins.get(key, group) if pins and key and not (group.along and fresh_below) else None
            if names is None and pins and key and pins.unhashed(key):
                unhashed.append(group.folder)
            if names is not None and _download_pinned(python, group, names, target, dest, pip_env, run, files,
                                                      pins.path(key)):
                kept.setdefault(group.folder, True)
                resolved[key] = pin(group, names)  # each file checked against it
                continue
            kept[group.folder] = False
            fresh_below = fresh_below or key is not None
            # Files of the groups this one is resolved along with are already there: pip skips them.
            along = [f for g in files.values() for f in g] if group.along else []
            scratch = root / ".along" if along else dest
            if along:  # anew for each group: only the files of the groups below, none of another's run
                _remove_tree(scratch)
                scratch.mkdir()
                for f in along:
                    _link(f, scratch / f.name)
            before = set(scratch.iterdir())
            _pip(download_argv(python, group, target, scratch), pip_env, run, group)
            new = sorted(set(scratch.iterdir()) - before)
            if along:
                for f in new:
                    f.rename(dest / f.name)
                new = [dest / f.name for f in new]
            files.setdefault(group.folder, []).extend(new)
            if key:
                resolved[key] = pin(group, {f.name: sha256(f) for f in new})
        _remove_tree(root / ".along")
    return Wheelhouse(root, files, time.monotonic() - started, resolved,
                     tuple(folder for folder, every in kept.items() if every), tuple(dict.fromkeys(unhashed)))


def _download_pinned(python: str, group: Group, names: Mapping[str, str], target: Target, dest: Path,
                     env: dict[str, str], run: Run, files: dict[str, list[Path]], kept_in: Path) -> bool:
    """The files a group took before (name -> sha256), into dest; False (and none of them) where the sources no longer
    have one or now give another file for it (a wheel of the same version for another platform tag). Raises when a
    file has a pinned name and another sha256: the same release's file changed under kit (none of them is kept)."""
    before = set(dest.iterdir())
    got: list[Path] = []
    try:
        if names:  # none: its stage's files were all the stages' below
            _pip(download_argv(python, pinned(group, list(names)), target, dest), env, run, group)
        got = sorted(set(dest.iterdir()) - before)
    except KitError:
        pass
    if sorted(f.name for f in got) == sorted(names):
        changed = next(((f, digest) for f in got if (digest := sha256(f)) != names[f.name]), None)
        if changed is None:
            files.setdefault(group.folder, []).extend(got)
            return True
        _remove_new(dest, before)
        raise KitError(f"{changed[0].name}: pip's sources now give another file of this name than the image built "
                       f"before took (sha256 {changed[1]}, pinned {names[changed[0].name]})",
                       hint=f"check that your package index is the one you trust; if that release's file was replaced "
                            f"on purpose, delete {kept_in} and build again to resolve the {group.folder} group anew")
    _remove_new(dest, before)
    return False


def _remove_new(dest: Path, before: set[Path]) -> None:
    for f in set(dest.iterdir()) - before:
        f.unlink()


def _pip(argv: list[str], env: dict[str, str], run: Run, group: Group) -> None:
    try:
        done = run(argv, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        what = redact_text(" ".join(group.requirements))
        raise KitError(f"resolving {what} with pip took over {RESOLVE_TIMEOUT_S} s", command=redact_text(" ".join(argv)),
                       hint="check the speed of your package index or proxy") from None
    if done.returncode != 0:
        raise KitError(redact_text(f"pip could not resolve {' '.join(group.requirements)} for the image"),
                       command=redact_text(" ".join(argv)), output_tail=redact_text(_tail(done.stderr or done.stdout)),
                       hint=_hint(done.stderr + done.stdout, group))


def _tail(text: str) -> str:
    lines = [line for line in text.splitlines() if not line.startswith("WARNING: Location ")]
    return "\n".join(lines[-TAIL_LINES:])


def _hint(output: str, group: Group) -> str:
    # With a constraint file (pip's configuration may have one) a missing package reads as a conflict.
    if not any(words in output for words in ("No matching distribution", "Could not find a version",
                                              "ResolutionImpossible")):
        return "the tail above says why; `pip config list` shows the sources kit used"
    local = next((r.partition("+")[2] for r in group.requirements if r.startswith("torch==") and "+" in r), "")
    if local and "torch" in output:
        index = "https://download.pytorch.org/whl/" + local
        return (f"torch's {local} build (+{local}) is on PyTorch's own index, not on PyPI or its mirrors: make "
                f"{index} reachable, set build.torch_index_url to a mirror of it, or "
                f"put the torch-*+{local} wheel in a folder and name it as build.wheelhouse")
    if group.sdist:
        return ("none of this machine's pip sources has its source archive: add an index or find-links folder "
                "that has it (pip.conf, or build.wheelhouse in kit.yaml)")
    return ("none of this machine's pip sources has a wheel of it for the image's Python and platform: "
            "add an index or find-links folder that has one (pip.conf, or build.wheelhouse in kit.yaml)")


def _link(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _remove_tree(path: Path) -> None:
    if path.exists():
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
