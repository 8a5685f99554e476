"""The training image's recipe: BuildConfig -> a build context and its tag.

Rendering is pure and deterministic. The tag is a hash of everything that
goes into the build context (Dockerfile, assets, wheels, CA bundle), so equal
inputs give the equal tag (a cache hit) and any change gives a new one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from importlib.resources import files
from pathlib import Path

import jinja2

from kit import __version__
from kit.config import BuildConfig
from kit.errors import BadInput

# Per framework: the Dockerfile template, and the files from images/ its context carries (in kit/).
TEMPLATES = {"horovod": "Dockerfile.j2", "tensorflow": "Dockerfile.tf.j2"}
ASSETS = {
    "horovod": ("sshd_config", "ssh_config", "entrypoint.sh", "build_horovod.sh", "allreduce_check.py"),
    "tensorflow": ("sshd_config", "ssh_config", "entrypoint.sh", "tf_check.py"),
}

# What `horovodrun --check-build` must show for each flavor: (frameworks, controllers, operations).
EXPECTED_BUILD = {
    "cpu": ({"PyTorch"}, {"Gloo"}, {"Gloo"}),
    "gpu": ({"PyTorch"}, {"Gloo"}, {"NCCL", "Gloo"}),
}


@dataclass(frozen=True)
class ContextFile:
    """One file of the build context: its text, or a file on disk copied as is (wheels, CA)."""

    name: str
    text: str | None = None
    source: Path | None = None

    def digest(self) -> str:
        h = hashlib.sha256()
        if self.text is not None:
            h.update(self.text.encode())
        else:
            with open(self.source, "rb") as f:  # type: ignore[arg-type]
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        return h.hexdigest()

    def size(self) -> int:
        return len(self.text.encode()) if self.text is not None else self.source.stat().st_size  # type: ignore[union-attr]


@dataclass(frozen=True)
class Recipe:
    config: BuildConfig
    files: tuple[ContextFile, ...]
    single_stage: bool = False

    @property
    def dockerfile(self) -> str:
        return next(f.text for f in self.files if f.name == "Dockerfile")  # type: ignore[return-value]

    @cached_property
    def digest(self) -> str:
        h = hashlib.sha256()
        for f in sorted(self.files, key=lambda f: f.name):
            h.update(f"{f.name}\0{f.digest()}\n".encode())
        return h.hexdigest()

    @property
    def tag(self) -> str:
        stage = "-single" if self.single_stage else ""
        return f"{self.config.tag_prefix}{stage}-{self.digest[:12]}"

    @property
    def base_images(self) -> list[str]:
        return [i for i in (self.config.base_image, self.config.builder_image) if i]

    def write(self, directory: Path) -> None:
        """Lay the context out in an empty folder (wheels are hard-linked when possible)."""
        for f in self.files:
            dest = directory / f.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if f.text is not None:
                dest.write_text(f.text)
                if f.name.endswith(".sh"):
                    dest.chmod(0o755)
            else:
                _link_or_copy(f.source, dest)  # type: ignore[arg-type]


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _template_env() -> jinja2.Environment:
    loader = jinja2.FunctionLoader(lambda name: files("kit.templates").joinpath(name).read_text())
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def render_template(name: str, **values) -> str:
    return _template_env().get_template(name).render(**values)


def horovod_spec(config: BuildConfig) -> str:
    return config.horovod_source or f"horovod=={config.horovod_version}"


def render_dockerfile(config: BuildConfig, *, single_stage: bool = False, wheelhouse: bool = False) -> str:
    if single_stage and config.framework != "horovod":
        raise BadInput(f"--single-stage: the {config.flavor} image compiles nothing, so it has one way to build",
                       hint="drop --single-stage (it compares Horovod builds)")
    return _template_env().get_template(TEMPLATES[config.framework]).render(
        c=config,
        kit_version=__version__,
        single_stage=single_stage,
        wheelhouse=wheelhouse,
        horovod_spec=horovod_spec(config) if config.framework == "horovod" else None,
    )


def make_recipe(config: BuildConfig, *, single_stage: bool = False) -> Recipe:
    wheels = tuple(sorted(p.name for p in config.wheelhouse.iterdir() if p.suffix == ".whl")) \
        if config.wheelhouse else ()
    ctx = [ContextFile("Dockerfile", text=render_dockerfile(config, single_stage=single_stage, wheelhouse=bool(wheels)))]
    ctx += [ContextFile(f"kit/{name}", text=files("kit.images").joinpath(name).read_text())
            for name in ASSETS[config.framework]]
    # Sources are resolved: a symlinked wheel must reach the context as the file, not the link.
    ctx += [ContextFile(f"wheelhouse/{name}", source=(config.wheelhouse / name).resolve())  # type: ignore[operator]
            for name in wheels]
    if config.ca_bundle:
        ctx.append(ContextFile("kit/extra-ca.crt", source=config.ca_bundle.resolve()))
    return Recipe(config=config, files=tuple(ctx), single_stage=single_stage)
