"""The base image: which references kit can make from a mirror, this machine's mirror from its apt sources (both
formats, as found on real machines), the debootstrap command, and the order of the choices."""

from pathlib import Path

import docker.errors
import pytest

from kit.image import base as baseimage
from kit.image.base import AptSource, Distro, Mirror
from kit.errors import BadInput, KitError

# /etc/apt/sources.list.d/debian.sources of a Debian 12 machine (deb822), with a third-party source beside it.
DEBIAN_SOURCES = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
NODESOURCE = "Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\nComponents: main\n"
# /etc/apt/sources.list of an Ubuntu 22.04 machine (one-line format), with a disabled and an options entry.
UBUNTU_LIST = """\
deb [arch=amd64] http://mirror.lab.example/ubuntu/ jammy main restricted universe
# deb-src http://mirror.lab.example/ubuntu/ jammy main
deb http://mirror.lab.example/ubuntu jammy-updates main universe
deb http://security.ubuntu.com/ubuntu jammy-security main universe
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
"""


@pytest.mark.parametrize("ref, distro", [
    ("debian:bookworm-slim", Distro("debian", "bookworm")),
    ("debian:12", Distro("debian", "bookworm")),
    ("docker.io/library/debian:trixie", Distro("debian", "trixie")),
    ("ubuntu:24.04", Distro("ubuntu", "noble")),
    ("ubuntu:jammy", Distro("ubuntu", "jammy")),
    ("nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", None),
    ("registry.lab:5000/debian:bookworm", None),
    ("debian:latest", None),
])
def test_which_references_kit_can_make(ref, distro):
    assert baseimage.distro_of(ref) == distro


def test_both_apt_formats_are_read():
    found = baseimage.parse_apt_sources({"/etc/apt/sources.list.d/debian.sources": DEBIAN_SOURCES,
                                         "/etc/apt/sources.list.d/nodesource.sources": NODESOURCE,
                                         "/etc/apt/sources.list": UBUNTU_LIST})
    assert AptSource("http://deb.debian.org/debian", ("bookworm", "bookworm-updates"), ("main",)) in found
    assert AptSource("http://mirror.lab.example/ubuntu", ("jammy",), ("main", "restricted", "universe")) in found
    assert not any("deb-src" in s.uri or s.uri.endswith("jammy") for s in found)
    assert len(found) == 7


def test_the_mirror_of_each_distribution():
    sources = baseimage.parse_apt_sources({"a.sources": DEBIAN_SOURCES + "\n" + NODESOURCE, "b.list": UBUNTU_LIST})
    assert baseimage.mirror_for(Distro("debian", "trixie"), sources) == \
        Mirror("http://deb.debian.org/debian", "http://deb.debian.org/debian-security")
    assert baseimage.mirror_for(Distro("ubuntu", "noble"), sources) == \
        Mirror("http://mirror.lab.example/ubuntu", "http://security.ubuntu.com/ubuntu")
    assert baseimage.mirror_for(Distro("ubuntu", "noble"), baseimage.parse_apt_sources({"a.sources": DEBIAN_SOURCES})) \
        is None


def test_a_third_partys_repository_for_the_release_is_not_its_mirror():
    """Docker's own apt repository names bookworm too; it is not Debian's archive (its component is stable)."""
    docker_list = "deb [arch=amd64] https://download.docker.com/linux/debian bookworm stable\n"
    sources = baseimage.parse_apt_sources({"/etc/apt/sources.list.d/docker.list": docker_list,
                                           "/etc/apt/sources.list.d/debian.sources": DEBIAN_SOURCES})
    assert baseimage.mirror_for(Distro("debian", "bookworm"), sources).uri == "http://deb.debian.org/debian"


def test_a_mirrors_password_stays_out_of_the_image():
    d, m = Distro("debian", "bookworm"), Mirror("https://u:s3cret@mirror.lab/debian", "https://u:s3cret@mirror.lab")
    assert "s3cret" not in baseimage.image_sources(d, m)
    assert "URIs: https://mirror.lab/debian\n" in baseimage.image_sources(d, m)
    assert "--include=ca-certificates" in baseimage.debootstrap_argv(d, m, Path("/r"))  # https: apt must verify


def test_debootstrap_command_and_the_images_own_sources(tmp_path):
    d, m = Distro("debian", "bookworm"), Mirror("http://deb.debian.org/debian", "http://deb.debian.org/debian-security")
    assert baseimage.debootstrap_argv(d, m, tmp_path) == \
        ["debootstrap", "--variant=minbase", "--components=main", "bookworm", str(tmp_path), "http://deb.debian.org/debian"]
    assert baseimage.image_sources(d, m) == (
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\nComponents: main\n")
    assert d.made_ref == "kit-base/debian:bookworm"


class Images:
    def __init__(self, here: set[str]) -> None:
        self.here, self.pulled = set(here), []

    def get(self, ref):
        if ref not in self.here:
            raise docker.errors.ImageNotFound(ref)
        return ref

    def pull(self, ref):
        self.pulled.append(ref)
        if ref.startswith("flaky/"):
            raise docker.errors.APIError("toomanyrequests: rate limit")
        self.here.add(ref)


class Client:
    def __init__(self, *here: str) -> None:
        self.images = Images(set(here))


def made(into: Client):
    calls = []

    def make(distro, mirror):
        calls.append((distro, mirror))
        into.images.here.add(distro.made_ref)
    return make, calls


def test_the_base_is_this_machines_then_the_made_one_then_the_registrys(monkeypatch):
    monkeypatch.setattr(baseimage, "read_apt_sources",
                        lambda: baseimage.parse_apt_sources({"d.sources": DEBIAN_SOURCES}))
    here = Client("debian:bookworm-slim")
    assert baseimage.ensure(here, "debian:bookworm-slim", registry_answers=lambda r: pytest.fail("asked")) == \
        baseimage.Base("debian:bookworm-slim", "on this machine")

    registry = Client()
    base = baseimage.ensure(registry, "debian:bookworm-slim", registry_answers=lambda r: None)
    assert base.ref == "debian:bookworm-slim" and registry.images.pulled == ["debian:bookworm-slim"]

    offline = Client()
    make, calls = made(offline)
    asked = []
    base = baseimage.ensure(offline, "debian:bookworm-slim", registry_answers=lambda r: "dial tcp: no such host",
                            answers=lambda url: asked.append(url), make=make)
    assert asked == ["http://deb.debian.org/debian/dists/bookworm/Release"]
    assert base.ref == "kit-base/debian:bookworm" and calls == [
        (Distro("debian", "bookworm"), Mirror("http://deb.debian.org/debian", "http://deb.debian.org/debian-security"))]
    assert "made from http://deb.debian.org/debian with debootstrap" in base.how and "no such host" in base.how
    again = baseimage.ensure(offline, "debian:12", registry_answers=lambda r: pytest.fail("asked"),
                             answers=lambda url: pytest.fail("asked"), make=make)
    assert again.ref == "kit-base/debian:bookworm" and len(calls) == 1  # made once, reused


def test_what_cannot_be_made_is_bad_input_or_names_the_missing_mirror(monkeypatch):
    with pytest.raises(BadInput, match="base image '127.0.0.1:9/x:1' is not on this machine and its registry does "
                                       "not have it \\(connection refused\\)"):
        baseimage.ensure(Client(), "127.0.0.1:9/x:1", registry_answers=lambda r: "connection refused")
    monkeypatch.setattr(baseimage, "read_apt_sources", lambda: [])
    with pytest.raises(KitError, match="name no ubuntu mirror") as e:
        baseimage.ensure(Client(), "ubuntu:24.04", registry_answers=lambda r: "no such host")
    assert "sources.list.d" in e.value.hint


def test_a_silent_mirror_is_named_before_debootstrap_waits_on_it(monkeypatch):
    monkeypatch.setattr(baseimage, "read_apt_sources",
                        lambda: baseimage.parse_apt_sources({"d.sources": DEBIAN_SOURCES}))
    with pytest.raises(KitError, match=r"mirror http://deb.debian.org/debian does not answer for bookworm "
                                       r"\(http://deb.debian.org/debian/dists/bookworm/Release: no answer within 10 s\)"):
        baseimage.ensure(Client(), "debian:bookworm-slim", registry_answers=lambda r: "no such host",
                         answers=lambda url: "no answer within 10 s", make=lambda d, m: pytest.fail("made"))


def test_a_failed_pull_is_named_not_a_traceback():
    with pytest.raises(KitError, match="pulling the base image flaky/base:1 failed"):
        baseimage.ensure(Client(), "flaky/base:1", registry_answers=lambda r: None)
