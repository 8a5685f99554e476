"""The image a build starts FROM: this machine's copy, the registry's, or one made from this machine's mirror.

Many labs reach no container registry (air-gapped, or behind a proxy that only
passes their Debian/Ubuntu mirror and a Python index). For the official Debian
and Ubuntu images kit then makes the base itself: `debootstrap --variant=minbase`
from the mirror this machine's apt uses, imported as `kit-base/<distro>:<suite>`
and reused afterwards. This is the only place such a base is made; the test
command uses it too.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kit.errors import BadInput, KitError
from kit.image.pipconfig import PipSettings
from kit.redact import redact, text as redact_text
from kit.image.probe import probe

if TYPE_CHECKING:  # (imported where it is used: `kit run`, `logs`, `exec` never need the docker SDK)
    import docker

REGISTRY_PROBE_S = 15
DEBOOTSTRAP_TIMEOUT_S = 30 * 60
MADE_REPOSITORY = "kit-base"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))

DEBIAN = {"11": "bullseye", "12": "bookworm", "13": "trixie", "14": "forky"}
UBUNTU = {"20.04": "focal", "22.04": "jammy", "24.04": "noble", "26.04": "resolute"}
_OFFICIAL = re.compile(r"^(?:docker\.io/)?(?:library/)?(debian|ubuntu):([a-z0-9.]+?)(?:-slim)?$")
# The path-free image config of a debootstrapped tree, as the official images have it.
IMPORT_CHANGES = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["bash"]']


@dataclass(frozen=True)
class Distro:
    name: str    # debian or ubuntu
    suite: str   # bookworm, noble...

    @property
    def made_ref(self) -> str:
        return f"{MADE_REPOSITORY}/{self.name}:{self.suite}"

    @property
    def suites(self) -> dict[str, str]:
        return DEBIAN if self.name == "debian" else UBUNTU


def distro_of(ref: str) -> Distro | None:
    """The official Debian or Ubuntu image a reference names (debian:bookworm-slim, debian:12, ubuntu:24.04)."""
    m = _OFFICIAL.match(ref)
    if not m:
        return None
    name, tag = m[1], m[2]
    known = DEBIAN if name == "debian" else UBUNTU
    suite = known.get(tag, tag if tag in known.values() else "")
    return Distro(name, suite) if suite else None


# ---------------------------------------------------------------- this machine's apt sources

@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


def parse_apt_sources(files: dict[str, str]) -> list[AptSource]:
    """`deb` entries of one-line .list files and deb822 .sources files (name -> text)."""
    found = []
    for name, text in files.items():
        found += _deb822(text) if name.endswith(".sources") else _one_line(text)
    return found


def _one_line(text: str) -> list[AptSource]:
    found = []
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()  # options like [arch=amd64]
        if len(words) >= 3 and words[0] == "deb":
            found.append(AptSource(words[1].rstrip("/"), (words[2],), tuple(words[3:])))
    return found


def _deb822(text: str) -> list[AptSource]:
    found = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            found.append(AptSource(uri.rstrip("/"), tuple(fields.get("suites", "").split()),
                                   tuple(fields.get("components", "").split())))
    return found


def read_apt_sources() -> list[AptSource]:
    files = {}
    for path in APT_SOURCES:
        candidates = sorted(path.glob("*.list")) + sorted(path.glob("*.sources")) if path.is_dir() else [path]
        for f in candidates:
            try:
                files[str(f)] = f.read_text()
            except OSError:
                continue
    return parse_apt_sources(files)


@dataclass(frozen=True)
class Mirror:
    uri: str                 # the archive
    security: str | None     # the security archive, when this machine uses one


def mirror_for(distro: Distro, sources: list[AptSource]) -> Mirror | None:
    """This machine's mirror of the distribution: an http(s) source of the distribution's own archive (its
    suites are the distribution's, its components include main: not a third party's repository for it)."""
    def of_distro(s: AptSource, security: bool) -> bool:
        base = {x.split("-")[0].split("/")[0] for x in s.suites}
        return (s.uri.startswith(("http://", "https://")) and bool(base & set(distro.suites.values()))
                and "main" in s.components and any(("security" in x) == security for x in s.suites))
    main = next((s.uri for s in sources if of_distro(s, security=False)), None)
    security = next((s.uri for s in sources if of_distro(s, security=True)), None)
    return Mirror(main, security) if main else None


def image_sources(distro: Distro, mirror: Mirror) -> str:
    """The image's own apt sources (deb822): the release and its updates, and security when there is one. A
    user and password in a mirror's URL stay on this machine (apt reads them from its auth.conf in the image's
    users' hands, not from a layer)."""
    components = "main" if distro.name == "debian" else "main universe"
    updates = f"{distro.suite} {distro.suite}-updates"
    text = f"Types: deb\nURIs: {_bare(mirror.uri)}\nSuites: {updates}\nComponents: {components}\n"
    if mirror.security:
        text += (f"\nTypes: deb\nURIs: {_bare(mirror.security)}\nSuites: {distro.suite}-security\n"
                 f"Components: {components}\n")
    return text


def _bare(uri: str) -> str:
    """The URL without a user and password."""
    scheme, sep, rest = uri.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"


def debootstrap_argv(distro: Distro, mirror: Mirror, root: Path) -> list[str]:
    components = "main" if distro.name == "debian" else "main,universe"
    # minbase has no CA certificates: apt in the image could not verify an https mirror without them.
    include = ["--include=ca-certificates"] if mirror.uri.startswith("https://") else []
    return ["debootstrap", "--variant=minbase", f"--components={components}", *include, distro.suite, str(root),
            mirror.uri]


# ---------------------------------------------------------------- the base of a build

@dataclass(frozen=True)
class Base:
    ref: str            # what the Dockerfile starts FROM
    how: str            # for the summary: where it came from


def ensure(client: docker.DockerClient, ref: str, *, on_status: Callable[[str], None] = lambda s: None,
           registry_answers: Callable[[str], str | None] | None = None,
           answers: Callable[[str], str | None] | None = None,
           make: Callable[[Distro, Mirror], None] | None = None) -> Base:
    """The base for `ref`: here already, else the registry's, else (Debian, Ubuntu) made from this machine's mirror."""
    import docker.errors
    import requests
    if _local(client, ref):
        return Base(ref, "on this machine")
    distro = distro_of(ref)
    if distro and _local(client, distro.made_ref):
        return Base(distro.made_ref, f"made before from this machine's {distro.name} mirror ({ref}: not here)")
    on_status(f"asking the registry for {ref}")
    why_not = (registry_answers or registry_error)(ref)
    if why_not is None:
        on_status(f"pulling {ref}")
        try:
            client.images.pull(ref)
            return Base(ref, "pulled from its registry")
        except (docker.errors.DockerException, requests.RequestException) as e:
            why_not = f"the pull failed: {e}"
            if distro is None:
                raise KitError(f"pulling the base image {ref} failed ({e})",
                               hint="try again, or `docker pull` it yourself and run kit build again") from None
    if distro is None:
        raise BadInput(f"base image '{ref}' is not on this machine and its registry does not have it ({why_not})",
                       hint="check the name, `docker pull` or `docker load` it, or pass --base-image with an image "
                            "this machine has (debian:<release> and ubuntu:<version> kit makes from your mirror)")
    mirror = mirror_for(distro, read_apt_sources())
    if mirror is None:
        raise KitError(f"base image '{ref}' is not here, no registry has it ({why_not}), and this machine's apt "
                       f"sources name no {distro.name} mirror to make it from",
                       hint=f"add a {distro.name} mirror to /etc/apt/sources.list.d, `docker load` a {ref} "
                            "image, or pass --base-image with an image this machine has")
    release = f"{mirror.uri}/dists/{distro.suite}/Release"
    if why_silent := (answers or _answers)(release):  # debootstrap's wget would retry for many minutes
        raise KitError(f"this machine's {distro.name} mirror {redact(mirror.uri)} does not answer for "
                       f"{distro.suite} ({redact(release)}: {why_silent})",
                       hint=f"check the network or proxy to the mirror, or `docker load` a {ref} image and run "
                            "kit build again")
    on_status(f"making {distro.made_ref} from {redact(mirror.uri)} with debootstrap")
    started = time.monotonic()
    (make or (lambda d, m: make_base(client, d, m)))(distro, mirror)
    return Base(distro.made_ref, f"made from {redact(mirror.uri)} with debootstrap in "
                                 f"{time.monotonic() - started:.0f} s ({ref}: no registry answers: {why_not})")


def _answers(url: str) -> str | None:
    return probe(url, PipSettings(), os.environ)


def _local(client: docker.DockerClient, ref: str) -> bool:
    import docker.errors
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def registry_error(ref: str) -> str | None:
    """None when the image's registry has it; else the engine's reason, asked within a bound."""
    import docker.errors
    quick = docker.from_env(timeout=REGISTRY_PROBE_S)  # the engine kit.image.build.connect reached, with a short timeout
    try:
        quick.api.inspect_distribution(ref)
        return None
    except docker.errors.APIError as e:
        return (e.explanation or str(e)).strip()
    except Exception as e:  # noqa: BLE001 - a timeout or a broken connection: the registry does not answer
        return f"no answer within {REGISTRY_PROBE_S} s ({type(e).__name__})"
    finally:
        quick.close()


def make_base(client: docker.DockerClient, distro: Distro, mirror: Mirror) -> None:
    """debootstrap a minimal tree from the mirror and import it as distro.made_ref."""
    if shutil.which("debootstrap") is None:
        raise KitError(f"making {distro.made_ref} needs debootstrap, which is not installed",
                       hint="apt-get install debootstrap (cli/demo and tests/run install it), or `docker load` a "
                            "base image and pass --base-image")
    if os.geteuid() != 0:
        raise KitError(f"making {distro.made_ref} with debootstrap needs root",
                       hint="run kit build as root once (the base is kept), or pass --base-image with an image "
                            "this machine has")
    with tempfile.TemporaryDirectory(prefix="kit-rootfs-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "root"
        argv = debootstrap_argv(distro, mirror, root)
        log = Path(tmp) / "debootstrap.log"
        try:
            code = _debootstrap(argv, log)
        finally:
            _unmount_below(root)  # a debootstrap stopped half-way leaves /proc, /sys... mounted in the tree
        if code != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise KitError(f"debootstrap could not make {distro.made_ref} (exit {code})",
                           command=redact_text(" ".join(argv)), output_tail=tail,
                           hint=f"check that {redact(mirror.uri)} serves {distro.suite}; the tail above says why")
        _tidy(root, distro, mirror)
        _import(client, root, distro, mirror)


def _debootstrap(argv: list[str], log: Path) -> int:
    """Run it in a session of its own; past the bound, stop it as a whole (SIGTERM: its traps unmount)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=DEBOOTSTRAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.write(f"\nkit: stopped after {DEBOOTSTRAP_TIMEOUT_S} s\n".encode())
            return 124


def _unmount_below(root: Path) -> None:
    """Unmount whatever is mounted inside root, deepest first, before anything removes the tree."""
    mounted = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
               if line.split()[4] == str(root) or line.split()[4].startswith(f"{root}/")]
    for point in sorted(mounted, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    if any(line.split()[4].startswith(f"{root}/") for line in Path("/proc/self/mountinfo").read_text().splitlines()):
        raise KitError(f"cannot unmount what debootstrap mounted under {root}",
                       hint=f"unmount it by hand (grep {root} /proc/mounts), then remove {root.parent}")


def _tidy(root: Path, distro: Distro, mirror: Mirror) -> None:
    """What the official images leave out: downloaded packages, apt lists, this machine's resolver and name."""
    for folder in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (root / folder).glob("*"):
            if f.is_file():
                f.unlink()
    for name in ("etc/resolv.conf", "etc/hostname", "etc/apt/sources.list"):
        (root / name).unlink(missing_ok=True)
    sources = root / "etc/apt/sources.list.d" / f"{distro.name}.sources"
    sources.parent.mkdir(parents=True, exist_ok=True)
    sources.write_text(image_sources(distro, mirror))


def _import(client: docker.DockerClient, root: Path, distro: Distro, mirror: Mirror) -> None:
    repository, tag = distro.made_ref.split(":")
    changes = IMPORT_CHANGES + [f'LABEL io.kit.base="debootstrap {distro.name} {distro.suite}" '
                                f'io.kit.mirror="{_bare(mirror.uri)}"']
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    try:
        client.api.import_image_from_stream(tar.stdout, repository=repository, tag=tag, changes=changes)
    finally:
        tar.stdout.close()
        code = tar.wait()
    if code != 0 or not _local(client, distro.made_ref):
        raise KitError(f"importing the debootstrapped tree as {distro.made_ref} failed (tar exit {code})",
                       hint="check free disk space in Docker's data root, then run kit build again")
