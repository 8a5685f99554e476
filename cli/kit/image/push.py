"""`kit push`: a local image tagged REGISTRY/REPO[:TAG] and pushed with the Docker SDK.

The name is checked against Docker's reference grammar before anything is asked of the engine. Credentials are the
Docker config's (DOCKER_CONFIG or ~/.docker/config.json, credential helpers included), which docker-py reads and
hands to the engine: kit never reads or shows them. The engine's stream is parsed here (a pure parser): one state per
layer, the pushed digest from its aux record, and an error record turned into a KitError that names the registry and
the fix, with only the engine's words about the failure, made safe to show."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable

from kit import redact
from kit.errors import BadInput, KitError
from kit.shown import visible

# Docker's reference grammar (github.com/distribution/reference, regexp.go), as an allow-list: a registry host
# (a domain or an IPv4 address, optional port), then path components of lower-case letters and digits with
# separators, then an optional tag.
_HOST_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_REFERENCE = re.compile(rf"(?P<host>{_HOST})/(?P<repo>{_PATH_PART}(?:/{_PATH_PART})*)(?::(?P<tag>{_TAG}))?",
                        re.ASCII)
_NAME_MAX = 255  # the grammar's limit on host/repo
# Any image a pod or a container may name: the registry optional (Docker Hub's then), a tag, a digest, or both.
_IMAGE = re.compile(rf"(?:{_HOST}/)?{_PATH_PART}(?:/{_PATH_PART})*(?::{_TAG})?(?:@sha256:[0-9a-f]{{64}})?", re.ASCII)


def is_image_reference(text: str) -> bool:
    return len(text) <= _NAME_MAX + 200 and bool(_IMAGE.fullmatch(text))
FORM = "REGISTRY/REPO[:TAG], e.g. registry.example.org:5000/team/horovod:cpu"


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port]
    repository: str  # registry/path, as Docker names the repository it pushes
    tag: str | None

    def __str__(self) -> str:
        return f"{self.repository}:{self.tag}" if self.tag else self.repository


def parse_reference(text: str) -> Reference:
    """REGISTRY/REPO[:TAG] as Docker reads it, with a registry named (a host with a dot or a port, or localhost);
    anything else is BadInput before the engine is asked."""
    found = _REFERENCE.fullmatch(text)
    why = _why_not(text, found)
    if why:
        raise BadInput(f"REGISTRY/REPO:TAG {visible(text, one_line=True, cap=300)!r}: {why}", hint=f"give {FORM}")
    return Reference(found["host"], f"{found['host']}/{found['repo']}", found["tag"])


def _why_not(text: str, found: re.Match | None) -> str | None:
    if "@" in text:
        return "a digest (@sha256:...) or a user@ cannot be pushed to: name a repository and a tag"
    if found is None:
        if "/" not in text:
            return "no registry: a name without REGISTRY/ would go to Docker Hub"
        if any(c.isupper() for c in text.split("/", 1)[1].rsplit(":", 1)[0]):
            return "a repository name is lower case"
        return "not a Docker image reference (repository: lower-case letters, digits and . _ -; tag: letters, " \
               "digits and . _ -, at most 128, not starting with . or -)"
    host = found["host"]
    if "." not in host and ":" not in host and host != "localhost":
        return f"no registry: {host!r} is read as part of a Docker Hub name (a registry has a dot or a port, or " \
               "is localhost)"
    if len(found["host"]) + 1 + len(found["repo"]) > _NAME_MAX:
        return f"the name is longer than {_NAME_MAX} characters"
    return None


def source_tag(image: str) -> str:
    """The tag of a local image's reference (the default tag of the push): the part after the last ':' that is
    not a registry's port, else latest."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.rsplit(":", 1)[1] if ":" in last else "latest"


# ---------------------------------------------------------------- the engine's stream

ALREADY = ("Layer already exists", "Mounted from")  # the registry had the blob: nothing was sent


@dataclass
class Layer:
    id: str
    state: str = "Preparing"
    current: int = 0
    total: int | None = None

    @property
    def sent(self) -> bool:
        return self.state == "Pushed"

    @property
    def present(self) -> bool:
        return self.state.startswith(ALREADY)


@dataclass
class Pushed:
    reference: Reference
    digest: str
    layers: dict[str, Layer]

    @property
    def sent(self) -> int:
        return sum(1 for layer in self.layers.values() if layer.sent)

    @property
    def present(self) -> int:
        return sum(1 for layer in self.layers.values() if layer.present)


OnLayer = Callable[[Layer], None]


def read_stream(events: Iterable[dict], ref: Reference, on_layer: OnLayer = lambda layer: None) -> Pushed:
    """The engine's decoded push stream: each layer's last state (on_layer sees every change), the digest of its aux
    record; an error record is a KitError naming the registry and the fix."""
    layers: dict[str, Layer] = {}
    digest = None
    for event in events:
        if "error" in event or "errorDetail" in event:
            detail = event.get("errorDetail") or {}
            raise push_error(ref, str(detail.get("message") or event.get("error") or "the push failed"))
        if isinstance(event.get("aux"), dict) and event["aux"].get("Digest"):
            digest = str(event["aux"]["Digest"])
        elif event.get("id") and event.get("status"):
            layer = layers.setdefault(str(event["id"]), Layer(str(event["id"])))
            _update(layer, event)
            on_layer(layer)
    if digest is None or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise KitError(f"push to {ref.registry}: the Docker engine's stream ended without the pushed digest",
                       hint=f"push it again; `docker push {ref}` shows what the engine says")
    return Pushed(ref, digest, layers)


def _update(layer: Layer, event: dict) -> None:
    layer.state = str(event["status"])
    progress = event.get("progressDetail") or {}
    if isinstance(progress.get("current"), int):
        layer.current = progress["current"]
    if isinstance(progress.get("total"), int):
        layer.total = progress["total"]


# What the engine's message says -> the fix, in the order they are tried; {host} is the registry.
_FIXES = (
    (("unauthorized", "authentication required", "no basic auth credentials", "incorrect username or password"),
     "the registry refused the login",
     "log in to it: docker login {host} (kit uses the Docker config's credentials: DOCKER_CONFIG or "
     "~/.docker/config.json, credential helpers included)"),
    (("denied",), "the registry denied the push",
     "log in as a user who may push to this repository: docker login {host}"),
    (("x509", "certificate", "tls:"), "the registry's TLS certificate is not trusted by the Docker engine",
     "put the registry's CA certificate in /etc/docker/certs.d/{host}/ca.crt on the engine's machine (no restart "
     "needed)"),
    (("server gave http response to https client",), "the registry speaks plain HTTP",
     "give it TLS, or list {host} in the engine's insecure-registries (/etc/docker/daemon.json)"),
    (("connection refused", "no such host", "i/o timeout", "no route to host", "dial tcp", "network is unreachable"),
     "the registry does not answer",
     "check the address and that the registry runs: curl https://{host}/v2/ should answer 200 or 401"),
)


def push_error(ref: Reference, message: str) -> KitError:
    """The engine's failure message as a KitError: what happened at which registry, the fix, and its words."""
    said = shown(message)
    low = message.lower()
    for words, what, fix in _FIXES:
        if any(w in low for w in words):
            return KitError(f"push to {ref.registry} failed: {what}: {said}", hint=fix.format(host=ref.registry))
    return KitError(f"push to {ref.registry} failed: {said}",
                    hint=f"`docker push {ref}` should fail the same way; fix what the registry says")


def shown(message: str) -> str:
    """A message of the engine's, one line, control characters visible, anything credential-like cut out (kit.redact:
    the registry's URL with a user or a token, an Authorization header, a JSON auth string, a pre-signed URL)."""
    return visible(redact.text(message), one_line=True, cap=500)


# ---------------------------------------------------------------- the push

def push(client, image: str, ref: Reference, on_layer: OnLayer = lambda layer: None) -> Pushed:
    """image (local) tagged as ref (its own tag when ref has none) and pushed; the digest the registry holds."""
    import docker.errors
    try:
        local = client.images.get(image)
    except (docker.errors.ImageNotFound, docker.errors.APIError) as e:  # (a malformed name: the engine's 400)
        why = "no such image on this machine" if isinstance(e, docker.errors.ImageNotFound) else \
            f"the engine refused the name ({visible(str(e.explanation or e), one_line=True, cap=200)})"
        raise BadInput(f"--image {visible(image, one_line=True, cap=300)}: {why}",
                       hint="build it with `kit build`, or name a local image with --image IMAGE:TAG "
                            "(docker images lists them)") from None
    target = Reference(ref.registry, ref.repository, ref.tag or source_tag(image))
    try:
        local.tag(target.repository, target.tag)
        events = client.api.push(target.repository, target.tag, stream=True, decode=True)
        return read_stream(events, target, on_layer)
    except docker.errors.APIError as e:
        raise push_error(target, str(e.explanation or e)) from None
