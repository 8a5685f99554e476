"""kit.yaml's build section: every input of the training image, validated once (BuildConfig)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from kit.image.flavors import CONTENTS, CUDA_LINES, FLAVOR_DEFAULTS, default_torch_index, framework, uses_gpus
from kit.redact import has_credentials, redact

# The settings that only one framework's image reads.
ONLY_FOR = {"torch": "horovod", "torch_index_url": "horovod", "horovod_version": "horovod",
            "horovod_source": "horovod", "with_mpi": "horovod", "tensorflow": "tensorflow"}
GPU_ONLY = ("cuda", "cuda_archs")  # the gpu flavor's alone: tf-gpu's TensorFlow brings the CUDA it was built with

# An image reference: optional registry host[:port]/, path components, optional :tag, optional @digest.
_IMAGE_REF = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
_REPOSITORY = re.compile(r"^[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*$")
_APT_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9.+:~-]+)?$")
_PYTHON = re.compile(r"^3\.\d{1,2}$")
_VERSION = re.compile(r"^\d+(?:\.\d+){1,2}(?:[a-z]+\d*)?(?:\+[a-z0-9.]+)?$")
_URL = re.compile(r"^(?:https?|file)://[^\s'\"`$;|&<>(){}\\]+$")  # no shell or Jinja characters

# Settings are written into the image (its labels, its history): a credential goes in pip's own configuration.
NO_CREDENTIALS = ("settings end up in the image's labels and history; keep it in pip's configuration "
                  "(pip.conf, ~/.netrc or a keyring), which kit uses on this machine only")

# The fix shown for a bad value of each setting: the expected form, with an example.
HINTS: dict[str, str] = {
    "flavor": "use one of: auto (the default: gpu when every host has NVIDIA GPUs, cpu when none has), cpu, gpu, "
              "tf (tf-gpu or tf-cpu by the same rule), tf-cpu, tf-gpu",
    "image": "use a lower-case repository name without a tag, e.g. kit-horovod or registry:5000/team/kit",
    "base_image": "use an image reference, e.g. debian:bookworm-slim",
    "builder_image": "use an image reference, e.g. nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04",
    "python": "use a Python minor version such as 3.11",
    "torch": "use a torch version such as 2.13.0 (optionally with a local tag: 2.13.0+cpu)",
    "torch_index_url": "use an http(s) or file URL, e.g. https://download.pytorch.org/whl/cpu",
    "pip_index_urls": "use http(s) or file URLs, e.g. https://pypi.org/simple",
    "wheelhouse": "pass a folder that holds .whl files",
    "ca_bundle": "pass a readable PEM file of CA certificates, e.g. /etc/ssl/certs/ca-certificates.crt",
    "horovod_version": "use a Horovod release such as 0.28.1",
    "tensorflow": "use a TensorFlow release such as 2.21.0",
    "horovod_source": "use a pip requirement URL, e.g. git+https://github.com/horovod/horovod@<commit>",
    "pip_packages": "use pip requirement specifiers, e.g. numpy or 'tqdm>=4'",
    "apt_packages": "use Debian package names, e.g. htop or vim=2:9.0.1378-2",
    "with_mpi": "use true or false",
    "cuda": "use one of: 13.0 (default: Turing to Blackwell), 12.8 (Volta to Blackwell)",
    "cuda_archs": "use compute capabilities such as [90, 120] (H100, RTX 50xx), or leave it out for every GPU",
}


class BuildConfig(BaseModel):
    """Every input of the training image. Equal configs render equal images."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flavor: Literal["cpu", "gpu", "tf-cpu", "tf-gpu"] = "cpu"
    image: str = "kit-horovod"
    base_image: str
    builder_image: str | None = None
    python: str
    torch: str | None = None
    torch_index_url: str | None = None
    tensorflow: str | None = None
    pip_index_urls: tuple[str, ...] = ()
    wheelhouse: Path | None = None
    ca_bundle: Path | None = None
    horovod_version: str | None = None
    horovod_source: str | None = None
    pip_packages: tuple[str, ...] = ()
    apt_packages: tuple[str, ...] = ()
    with_mpi: bool = False
    cuda: str | None = None                 # gpu: the CUDA line of torch's build (CUDA_LINES)
    cuda_archs: tuple[str, ...] = ()         # gpu: Horovod's kernels for these only (default: all nvcc knows)

    @model_validator(mode="before")
    @classmethod
    def _apply_flavor_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        defaults = FLAVOR_DEFAULTS.get(data.get("flavor", "cpu"), FLAVOR_DEFAULTS["cpu"])
        merged = {**defaults, **{k: v for k, v in data.items() if v is not None}}
        if "torch_index_url" not in data:  # torch's own index for the flavor and its CUDA line
            merged["torch_index_url"] = default_torch_index(merged.get("flavor", "cpu"), merged.get("cuda"))
        return merged

    @field_validator("image")
    @classmethod
    def _repository(cls, v: str) -> str:
        if not _REPOSITORY.match(v):
            raise ValueError(f"'{v}' is not a repository name (the tag is derived by kit)")
        return v

    @field_validator("base_image", "builder_image")
    @classmethod
    def _image_ref(cls, v: str | None) -> str | None:
        if v is not None and not _IMAGE_REF.match(v):
            raise ValueError(f"'{v}' is not an image reference")
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not _PYTHON.match(v):
            raise ValueError(f"'{v}' is not a Python minor version")
        return v

    @field_validator(*ONLY_FOR, mode="before")
    @classmethod
    def _for_the_flavor(cls, v: Any, info: ValidationInfo) -> Any:
        flavor = info.data.get("flavor")
        if flavor and v and framework(flavor) != ONLY_FOR[info.field_name]:
            raise ValueError(f"does not apply to flavor {flavor} (its image has {CONTENTS[framework(flavor)]})")
        return v

    @field_validator(*GPU_ONLY, mode="before")
    @classmethod
    def _for_gpu(cls, v: Any, info: ValidationInfo) -> Any:
        flavor = info.data.get("flavor")
        if v and flavor and flavor != "gpu":
            raise ValueError(f"does not apply to flavor {flavor} (only the gpu flavor builds with a CUDA line "
                             "of its choice)")
        return v

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, v: str | None) -> str | None:
        if v is not None and str(v) not in CUDA_LINES:
            raise ValueError(f"'{v}' is not a CUDA line kit builds for")
        return str(v) if v is not None else v

    @field_validator("cuda_archs", mode="before")
    @classmethod
    def _cuda_archs(cls, v: Any) -> Any:
        found = tuple(str(a).removeprefix("sm_") for a in (v if isinstance(v, (list, tuple)) else [v]))
        bad = [a for a in found if not re.fullmatch(r"[1-9]\d{1,2}", a)]
        if bad:
            raise ValueError(f"'{bad[0]}' is not a compute capability")
        return found

    @field_validator("torch", "horovod_version", "tensorflow")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None and not _VERSION.match(v):
            raise ValueError(f"'{v}' is not a version")
        return v

    @field_validator("torch_index_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if not v:  # "" turns the separate torch index off: torch then comes from the wheelhouse or pip's index
            return None
        if not _URL.match(v):
            raise ValueError(f"'{v}' is not a URL")
        return v

    @field_validator("pip_index_urls")
    @classmethod
    def _urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for url in v:
            cls._url(url)
        return v

    @field_validator("horovod_source")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        if v is not None and has_credentials(v.removeprefix("git+")):
            raise ValueError(f"'{redact(v)}' holds a user or token: {NO_CREDENTIALS}")
        if v is not None and (not _URL.match(v.removeprefix("git+")) or any(c in v for c in "'\"`$;")):
            raise ValueError(f"'{v}' is not a requirement URL")
        return v

    @field_validator("pip_packages")
    @classmethod
    def _pip_packages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for spec in v:
            try:
                Requirement(spec)
            except InvalidRequirement:
                raise ValueError(f"'{spec}' is not a pip requirement") from None
            if any(c in spec for c in "'\"`$;\\"):
                raise ValueError(f"'{spec}' contains shell characters")
            url = Requirement(spec).url
            if url and has_credentials(url.removeprefix("git+")):
                raise ValueError(f"'{spec.replace(url, redact(url))}' holds a user or token: {NO_CREDENTIALS}")
        return v

    @field_validator("apt_packages")
    @classmethod
    def _apt_packages(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not _APT_PACKAGE.match(name):
                raise ValueError(f"'{name}' is not a Debian package name")
        return v

    @field_validator("wheelhouse")
    @classmethod
    def _wheelhouse(cls, v: Path | None) -> Path | None:
        if v is None:
            return v
        if not v.is_dir():
            raise ValueError(f"folder {v} does not exist")
        try:
            wheels = [p for p in v.iterdir() if p.suffix == ".whl"]
        except OSError as e:
            raise ValueError(f"folder {v} cannot be read ({e.strerror})") from None
        if not wheels:
            raise ValueError(f"folder {v} holds no .whl files")
        return v.resolve()

    @field_validator("ca_bundle")
    @classmethod
    def _ca_bundle(cls, v: Path | None) -> Path | None:
        if v is None:
            return v
        try:
            text = v.read_text(errors="replace")
        except OSError as e:
            raise ValueError(f"file {v} cannot be read ({e.strerror})") from None
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise ValueError(f"file {v} holds no PEM certificate")
        return v.resolve()

    @property
    def tag_prefix(self) -> str:
        return f"{self.image}:{self.flavor}"

    @property
    def framework(self) -> str:
        return framework(self.flavor)

    @property
    def gpu(self) -> bool:
        return uses_gpus(self.flavor)
