"""`kit build`: settings -> sources -> recipe -> image on the local Docker engine, then verified.

An image labelled with the settings' key (recipe.build_key) was built from the
same kit.yaml before and is reused without resolving anything. Otherwise the
base and the wheels are resolved from what this machine has (Sources), the
context is laid out in a temporary folder and built with the docker SDK; its
tag is the hash of that context. The build stream is folded into steps
(BuildLog) for a one-line-per-step display.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from kit.image import base as baseimage
from kit.image import pipconfig
from kit.image import probe
from kit.image import wheels
from kit.config.build import BuildConfig
from kit.errors import BuildFailed, KitError
from kit.image.flavors import default_torch_index
from kit.cluster.identity import state_root
from kit.image.pipconfig import PipSettings
from kit.redact import redact
from kit.image.recipe import Recipe
from kit.cluster.steps.facts import CONTAINERD_HINT, CONTAINERD_STORE, containerd_store

if TYPE_CHECKING:  # (imported where it is used: `kit run`, `logs`, `exec` never need the docker SDK)
    import docker

BUILD_TIMEOUT_S = 4 * 3600  # a silent compile step must not trip the HTTP read timeout
TAIL_LINES = 25

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the engine colours a step's stderr


@dataclass
class Step:
    number: int
    total: int
    instruction: str
    started: float = field(default_factory=time.monotonic)
    seconds: float = 0.0
    cached: bool = False
    lines: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.number}/{self.total} {self.instruction}"


class BuildLog:
    """Docker's (legacy builder) JSON stream -> steps, their output and the result.

    `feed` takes one decoded chunk and returns the steps it finished, so the
    caller can show each step once, when it is done.
    """

    def __init__(self, on_line: Callable[[str], None] | None = None) -> None:
        self.steps: list[Step] = []
        self.image_id: str | None = None
        self.error: str | None = None
        self._partial = ""
        self._on_line = on_line

    @property
    def current(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def feed(self, chunk: dict) -> list[Step]:
        done: list[Step] = []
        if "error" in chunk:
            self.error = chunk.get("errorDetail", {}).get("message") or chunk["error"]
        if "aux" in chunk and "ID" in chunk["aux"]:
            self.image_id = chunk["aux"]["ID"]
        text = self._partial + _ANSI.sub("", chunk.get("stream", ""))
        *lines, self._partial = text.split("\n")
        for line in lines:
            done += self._line(line.rstrip("\r"))
        return done

    def finish(self) -> list[Step]:
        """End of stream: the last step is done unless the build failed in it."""
        done = self._line(self._partial) if self._partial else []
        self._partial = ""
        if self.current and not self.error and self.current not in done:
            self._close(self.current)
            done.append(self.current)
        return done

    def _line(self, line: str) -> list[Step]:
        m = _STEP.match(line)
        if m:
            finished = [self._close(self.current)] if self.current else []
            self.steps.append(Step(int(m[1]), int(m[2]), m[3]))
            return finished
        if self._on_line:
            self._on_line(line)
        if self.current is not None:
            if line.strip() == "---> Using cache":
                self.current.cached = True
            self.current.lines.append(line)
        return []

    @staticmethod
    def _close(step: Step) -> Step:
        step.seconds = time.monotonic() - step.started
        return step

    def failure(self) -> BuildFailed:
        step = self.current
        where = f"at step {step.label}" if step else "before the first step"
        tail = "\n".join((step.lines if step else [])[-TAIL_LINES:])
        return BuildFailed(f"image build failed {where}: {self.error}", output_tail=tail,
                           hint="fix the cause in the log tail above; `kit build --verbose` shows the whole log")


def connect(timeout: int = 120) -> docker.DockerClient:
    """The local Docker engine, or a KitError that says how to start one (or leave containerd's image store)."""
    import docker.errors
    try:
        client = docker.from_env(timeout=timeout)
        info = client.info()
    except docker.errors.DockerException as e:
        raise KitError(f"the Docker engine does not answer ({e})",
                       hint="start it (`dockerd &` or `systemctl start docker`) or set DOCKER_HOST") from None
    if containerd_store(info.get("DriverStatus")):
        raise KitError(f"on this machine, {CONTAINERD_STORE}", hint=CONTAINERD_HINT)
    return client


# ---------------------------------------------------------------- what the build uses

@dataclass
class Sources:
    """Where a build's inputs came from, resolved on this machine; printed so the user knows."""

    base: baseimage.Base
    builder: baseimage.Base | None  # the gpu flavor's build stage
    pip: PipSettings
    target: wheels.Target
    wheelhouse: wheels.Wheelhouse
    ca_bundle: Path | None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[tuple[str, str]]:
        found = self.wheelhouse
        key_files = [f.name for f in map(found.find, ("torch-", "horovod-", "tensorflow-", "tensorflow_cpu-")) if f]
        rows = [("base", f"{self.base.ref}: {self.base.how}")]
        rows += [("builder", f"{self.builder.ref}: {self.builder.how}")] if self.builder else []
        rows.append(("pip", "; ".join(self.pip.describe())))
        rows += [("note", note) for note in self.notes]
        rows.append(("wheels", f"{found.count()} files, {found.size / 1e6:,.0f} MB, for {self.target.describe()}, "
                               f"resolved in {found.seconds:.0f} s" + (f": {', '.join(key_files)}" if key_files else "")))
        if found.pinned:
            rows.append(("pinned", f"{', '.join(found.pinned)}: the same files as the image built before from these "
                                   f"settings took (delete {wheel_pins().folder} to take the newest instead)"))
        if found.unhashed:
            rows.append(("pins", f"{', '.join(found.unhashed)}: resolved anew: an older kit kept no sha256 of the files "
                                 "the image built before took, so they could not be checked"))
        if self.ca_bundle:
            rows.append(("CA", f"{self.ca_bundle}, trusted in the image"))
        return rows


def wheel_pins() -> wheels.Pins:
    """The files each group of packages took in the images built here (see kit.image.wheels)."""
    return wheels.Pins(state_root() / ".wheels")


def resolve_sources(client: docker.DockerClient, config: BuildConfig, work: Path, *,
                    env: Mapping[str, str] | None = None, pins: wheels.Pins | None = None,
                    on_status: Callable[[str], None] = lambda s: None) -> Sources:
    """The base image and the wheels of a build, from what this machine has (see kit.image.base, kit.image.wheels)."""
    env = dict(os.environ if env is None else env)
    on_status("asking the package sources")  # first: a silent one is named in seconds, before anything slow
    settings, notes = package_sources(config, pipconfig.read(env=env), env)
    base = baseimage.ensure(client, config.base_image, on_status=on_status)
    builder = baseimage.ensure(client, config.builder_image, on_status=on_status) if config.builder_image else None
    target = image_target(client, base.ref, config.python)
    wheelhouse = wheels.resolve(config, target, settings, work / "wheels", env=env, on_status=on_status, pins=pins)
    return Sources(base, builder, settings, target, wheelhouse,
                   config.ca_bundle or pipconfig.ca_file(settings, env), notes)


def package_sources(config: BuildConfig, machine: PipSettings, env: Mapping[str, str],
                    probe_all: Callable[..., dict[str, str | None]] = probe.probe_all) -> tuple[PipSettings, list[str]]:
    """This machine's pip settings with kit.yaml's explicit sources on top, each source asked first, all at once:
    one that does not answer stops the build at once, naming it. torch's own index is used when it answers; the
    default one may be missing (then torch comes from pip's own sources), one that kit.yaml names may not."""
    settings = machine.with_overrides(index_urls=config.pip_index_urls,
                                      find_links=(str(config.wheelhouse),) if config.wheelhouse else ())
    torch_index = config.torch_index_url if config.framework == "horovod" else None
    remote = [u for u in settings.indexes + settings.find_links if u.startswith(("http://", "https://"))]
    answers = probe_all(remote + ([f"{torch_index.rstrip('/')}/torch/"] if torch_index else []), settings, env)
    silent = {u: why for u, why in answers.items() if why and u in remote}
    if silent:
        url, why = next(iter(silent.items()))
        if url in config.pip_index_urls:
            hint = "check the network or proxy to it, or remove it from kit.yaml's build.pip_index_urls"
        elif url == pipconfig.PYPI and "index-url" not in settings.values:
            hint = ("it is pip's default index: point pip at one this machine reaches (pip config set global.index-url "
                    "URL), or, with only folders of wheels here, set no-index = true in pip's configuration")
        else:
            hint = "check the network or proxy to it, or remove it from pip's configuration"
        raise KitError(f"the package source {redact(url)} does not answer: {why}",
                       hint=f"{hint} (`pip config list` shows pip's sources)")
    notes = [f"{path} (find-links) does not exist; pip skips it" for path in settings.find_links
             if not path.startswith(("http://", "https://")) and probe.probe(path, settings, env)]
    if torch_index:
        why = answers[f"{torch_index.rstrip('/')}/torch/"]
        if why is None:
            settings = settings.with_overrides(extra_index_urls=(torch_index,))
        elif torch_index != default_torch_index(config.flavor, config.cuda):
            raise KitError(f"build.torch_index_url {redact(torch_index)} does not answer: {why}",
                           hint="check the network or proxy to it, or set torch_index_url: '' in kit.yaml to take "
                                "torch from pip's own sources")
        else:
            notes.append(f"torch's index {redact(torch_index)} does not answer ({why}): torch comes from pip's sources")
    return settings, notes


def image_target(client: docker.DockerClient, base: str, python: str) -> wheels.Target:
    """The platform wheels must fit: the base's machine and its glibc (from `ldd --version` in it)."""
    import docker.errors
    image = client.images.get(base)
    machine = wheels.MACHINES.get(image.attrs.get("Architecture", ""), image.attrs.get("Architecture", "x86_64"))
    try:
        out = client.containers.run(base, ["--version"], entrypoint="ldd", network_mode="none", remove=True)
    except docker.errors.DockerException as e:
        raise KitError(f"cannot run `ldd --version` in the base image {base} ({e})",
                       hint="kit's images need a glibc-based Linux base such as debian:bookworm-slim") from None
    glibc = wheels.parse_glibc(out.decode(errors="replace"))
    if glibc is None:
        raise KitError(f"the base image {base} has no glibc (`ldd --version` says no version)",
                       hint="use a glibc-based Linux base such as debian:bookworm-slim or ubuntu:24.04")
    return wheels.Target(python, machine, glibc)


def find_built(client: docker.DockerClient, recipe: Recipe) -> str | None:
    """The newest image here that `kit build` made from the same settings (its io.kit.key label): its tag."""
    images = client.images.list(filters={"label": f"io.kit.key={recipe.key}"})
    tagged = [(i.attrs.get("Created", ""), t) for i in images for t in i.tags if t.startswith(recipe.config.tag_prefix)]
    return max(tagged)[1] if tagged else None


def scratch() -> str | None:
    """Where the wheels and the context are laid out: /var/tmp (on disk; /tmp may be memory), else the default."""
    return "/var/tmp" if os.path.isdir("/var/tmp") and os.access("/var/tmp", os.W_OK) else None


# Docker's predefined build arguments: the build's RUN steps see them, its history does not keep them.
PROXY_ARGS = ("HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "ftp_proxy",
              "no_proxy")


def proxy_args(env: Mapping[str, str]) -> dict[str, str]:
    """This machine's proxy settings, for apt in the build: it reaches the mirror the way this machine does."""
    return {k: env[k] for k in PROXY_ARGS if env.get(k)}


def build_image(client: docker.DockerClient, recipe: Recipe, *,
                on_step: Callable[[Step], None] = lambda s: None,
                on_line: Callable[[str], None] | None = None) -> str:
    """Build the recipe under its tag, labelled with its key; returns the image ID."""
    log = BuildLog(on_line)
    with tempfile.TemporaryDirectory(prefix="kit-context-", dir=scratch()) as ctx:
        recipe.write(Path(ctx))
        stream = client.api.build(path=ctx, tag=recipe.tag, rm=True, forcerm=True, pull=False,
                                  decode=True, timeout=BUILD_TIMEOUT_S, buildargs=proxy_args(os.environ),
                                  labels={"io.kit.recipe": recipe.digest, "io.kit.key": recipe.key})
        for chunk in stream:
            for step in log.feed(chunk):
                on_step(step)
        for step in log.finish():
            on_step(step)
    if log.error or not log.image_id:
        raise log.failure()
    return log.image_id
