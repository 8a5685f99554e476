"""`kit build`: recipe -> image on the local Docker engine, then verified.

The tag is the recipe's content hash, so an image that already carries it is
the result of identical inputs and is reused without building. Otherwise the
context is laid out in a temporary folder and built with the docker SDK; the
build stream is folded into steps (BuildLog) for a one-line-per-step display.
"""

from __future__ import annotations

import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import docker
import docker.errors

from kit.errors import BadInput, BuildFailed, KitError
from kit.recipe import Recipe

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
    """The local Docker engine, or a KitError that says how to start one."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except docker.errors.DockerException as e:
        raise KitError(f"the Docker engine does not answer ({e})",
                       hint="start it (`dockerd &` or `systemctl start docker`) or set DOCKER_HOST") from None


def check_base_images(client: docker.DockerClient, recipe: Recipe) -> None:
    """Each base must exist locally or in its registry; else it is bad input (exit 2)."""
    for ref in recipe.base_images:
        try:
            client.images.get(ref)
            continue
        except docker.errors.ImageNotFound:
            pass
        try:
            client.api.inspect_distribution(ref)
        except docker.errors.APIError as e:
            raise BadInput(f"base image '{ref}' is not on this machine and its registry does not have it "
                           f"({e.explanation or e})",
                           hint="check the name, `docker pull` or `docker import` it, or pass --base-image "
                                "with an image this machine has") from None


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_image(client: docker.DockerClient, recipe: Recipe, *,
                on_step: Callable[[Step], None] = lambda s: None,
                on_line: Callable[[str], None] | None = None) -> str:
    """Build the recipe under its tag; returns the image ID."""
    log = BuildLog(on_line)
    with tempfile.TemporaryDirectory(prefix="kit-build-") as ctx:
        recipe.write(Path(ctx))
        stream = client.api.build(path=ctx, tag=recipe.tag, rm=True, forcerm=True, pull=False,
                                  decode=True, timeout=BUILD_TIMEOUT_S,
                                  labels={"io.kit.recipe": recipe.digest})
        for chunk in stream:
            for step in log.feed(chunk):
                on_step(step)
        for step in log.finish():
            on_step(step)
    if log.error or not log.image_id:
        raise log.failure()
    return log.image_id
