"""The training image's recipe: BuildConfig (+ the resolved base and wheels) -> a build context and its tag.

Rendering is pure and deterministic. The tag is a hash of everything that
goes into the build context (Dockerfile, assets, wheels, CA bundle), so equal
inputs give the equal tag (a cache hit) and any change gives a new one. The
key (build_key) is a hash of the settings alone: it finds the image that a
kit.yaml made before, without resolving its wheels again.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from importlib.resources import files
from pathlib import Path

import jinja2
from packaging.requirements import Requirement

from kit import __version__
from kit.image import wheels
from kit.config.build import BuildConfig
from kit.errors import BadInput
from kit.image.flavors import cuda_line
from kit.redact import harmless, redact, text as redact_text

# Per framework: the Dockerfile template, and the files from images/ its context carries (in kit/).
TEMPLATES = {"horovod": "Dockerfile.j2", "tensorflow": "Dockerfile.tf.j2"}
ASSETS = {
    "horovod": ("sshd_config", "ssh_config", "entrypoint.sh", "build_horovod.sh", "allreduce_check.py",
                "venv_delta.py"),
    "tensorflow": ("sshd_config", "ssh_config", "entrypoint.sh", "tf_check.py", "venv_delta.py"),
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
    key: str = ""      # build_key: how `kit up` and a second `kit build` find the image of these settings

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


def render_dockerfile(config: BuildConfig, *, single_stage: bool = False, base: str | None = None,
                      builder: str | None = None, extra_ca: bool = False) -> str:
    """The Dockerfile: every pip install takes the build's wheelhouse, never an index (see kit.image.wheels)."""
    if single_stage and config.framework != "horovod":
        raise BadInput(f"--single-stage: the {config.flavor} image compiles nothing, so it has one way to build",
                       hint="drop --single-stage (it compares Horovod builds)")
    if config.framework == "horovod":
        framework = dict(torch_requirements=wheels.groups(config)[0].requirements, build_requirements=wheels.build_requirements(config),
                         horovod_spec=redact(wheels.horovod_requirement(config)))  # a label: only a harmless URL
    else:
        framework = dict(tensorflow_requirements=wheels.tensorflow_requirements(config))
    # For the image's users' own `pip install`: the indexes go in only when every one is harmless (kit.redact.harmless);
    # one with a user, a token or a query is used on this machine only (the build itself installs from the wheelhouse).
    image_indexes = config.pip_index_urls if all(map(harmless, config.pip_index_urls)) else ()
    return _template_env().get_template(TEMPLATES[config.framework]).render(
        c=config, cuda_line=cuda_line(config.flavor, config.cuda), base=base or config.base_image, builder=builder or config.builder_image, kit_version=__version__,
        single_stage=single_stage, extra_ca=extra_ca, image_indexes=image_indexes,
        user_requirements=[image_requirement(spec) for spec in config.pip_packages], tool_requirements=wheels.TOOLS, **framework)


def image_requirement(spec: str) -> str:
    """How the image's pip asks for a user package: as given, but a direct URL by its name (its file is in the
    wheelhouse: the build fetches nothing)."""
    r = Requirement(spec)
    return f"{r.name}{'[' + ','.join(sorted(r.extras)) + ']' if r.extras else ''}" if r.url else spec


def build_key(config: BuildConfig, *, single_stage: bool = False) -> str:
    """What an image of these settings is found by (its io.kit.key label), without resolving anything: the
    settings (credentials left out), kit's version, the Dockerfile kit renders from them and kit's image files,
    and the user's own files (wheelhouse listing, CA bundle). A kit that renders or resolves otherwise gives
    another key."""
    settings = redact_text(config.model_dump_json())
    h = hashlib.sha256(f"{settings}\0{__version__}\0{'single' if single_stage else 'multi'}\0".encode())
    h.update(render_dockerfile(config, single_stage=single_stage, extra_ca=config.ca_bundle is not None).encode())
    h.update(inspect.getsource(wheels).encode())  # how the wheels are resolved: groups, platforms, pip options
    for name in ASSETS[config.framework]:
        h.update(f"{name}\0".encode() + files("kit.images").joinpath(name).read_bytes())
    if config.wheelhouse:
        for wheel in sorted(config.wheelhouse.glob("*.whl")):
            stat = wheel.stat()
            h.update(f"{wheel.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    if config.ca_bundle:
        h.update(config.ca_bundle.read_bytes())
    return h.hexdigest()[:24]


def make_recipe(config: BuildConfig, *, single_stage: bool = False, base: str | None = None,
                builder: str | None = None, wheelhouse: wheels.Wheelhouse | None = None,
                ca_bundle: Path | None = None) -> Recipe:
    """The build context: Dockerfile, kit's files, the resolved wheels (none for a plan) and the CA the image trusts."""
    ca = config.ca_bundle or ca_bundle
    ctx = [ContextFile("Dockerfile", text=render_dockerfile(config, single_stage=single_stage, base=base,
                                                            builder=builder, extra_ca=ca is not None))]
    ctx += [ContextFile(f"kit/{name}", text=files("kit.images").joinpath(name).read_text())
            for name in ASSETS[config.framework]]
    for folder, found in sorted(wheelhouse.files.items()) if wheelhouse else ():
        # Every folder is in the context, even one with no file of its own (its COPY needs it).
        ctx.append(ContextFile(f"wheelhouse/{folder}/.resolved", text="".join(f"{f.name}\n" for f in sorted(found))))
        # Sources are resolved: a symlinked wheel must reach the context as the file, not the link.
        ctx += [ContextFile(f"wheelhouse/{folder}/{f.name}", source=f.resolve()) for f in sorted(found)]
    if ca is not None:
        ctx.append(ContextFile("kit/extra-ca.crt", source=ca.resolve()))
    return Recipe(config=config, files=tuple(ctx), single_stage=single_stage,
                  key=build_key(config, single_stage=single_stage))
