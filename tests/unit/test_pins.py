"""Pins (kit/wheels.py): the files a group took in an image built before are taken again only while each has the
sha256 it had then, and only for the requirements they were resolved for. A real pip, offline, on a folder of
tiny wheels."""

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from test_wheels import config, make_wheel

from kit.image import wheels
from kit.errors import KitError
from kit.image.pipconfig import PipSettings
from kit.image.wheels import Target

TARGET = Target("3.11", "x86_64", (2, 36))
ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture
def links(tmp_path) -> Path:
    folder = tmp_path / "links"
    folder.mkdir()
    make_wheel(folder, "tensorflow-cpu", "2.21.0", ("numpy>=1.26",), tag="cp311-cp311-manylinux_2_17_x86_64")
    make_wheel(folder, "numpy", "2.4.6", tag="cp311-cp311-manylinux_2_27_x86_64")
    make_wheel(folder, "tf-keras", "2.21.0", ("tensorflow<2.22",))
    make_wheel(folder, "tqdm", "4.67.1", ("numpy",))
    make_wheel(folder, "six", "1.17.0")
    make_wheel(folder, "py-spy", "0.4.3", tag="py2.py3-none-manylinux_2_5_x86_64")
    return folder


def _settings(links: Path) -> PipSettings:
    return PipSettings({"no-index": "1", "find-links": str(links)})


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pin_file(pins: wheels.Pins, key: str) -> Path:
    return pins.folder / f"{key}.json"


def _user_key(packages: tuple[str, ...], links: Path) -> str:
    user = next(g for g in wheels.groups(config(flavor="tf-cpu", pip_packages=packages)) if g.folder == "user")
    return wheels.group_key(user, TARGET, _settings(links))


def test_pins_record_hashes(links, tmp_path):
    pins = wheels.Pins(tmp_path / "pins")
    found = wheels.resolve(config(flavor="tf-cpu", pip_packages=("tqdm",)), TARGET, _settings(links), tmp_path / "a",
                           env=ENV, pins=pins)
    pins.keep(found.resolved)
    kept = json.loads(_pin_file(pins, _user_key(("tqdm",), links)).read_text())
    assert kept["requirements"] == ["tqdm"] and kept["along"] == ["tensorflow-cpu==2.21.0"]
    tqdm = tmp_path / "a" / "user" / "tqdm-4.67.1-py3-none-any.whl"
    assert kept["files"] == [[tqdm.name, _sha256(tqdm)]]
    every = {name: digest for pin in found.resolved.values() for name, digest in pin["files"]}
    assert every == {f.name: _sha256(f) for fs in found.files.values() for f in fs}


def test_a_pinned_file_with_another_hash_is_refused(links, tmp_path):
    """The index now serves another numpy-2.4.6 file under the very name the image built before took."""
    pins = wheels.Pins(tmp_path / "pins")
    tf = config(flavor="tf-cpu")
    pins.keep(wheels.resolve(tf, TARGET, _settings(links), tmp_path / "a", env=ENV, pins=pins).resolved)
    numpy = links / "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl"
    with zipfile.ZipFile(numpy, "a") as z:
        z.writestr("numpy/extra.py", "print('not the file the image took')\n")
    with pytest.raises(KitError) as e:
        wheels.resolve(tf, TARGET, _settings(links), tmp_path / "b", env=ENV, pins=pins)
    assert e.value.message.startswith(f"{numpy.name}: pip's sources now give another file of this name")
    assert _sha256(numpy) in e.value.message and "delete" in e.value.hint and str(pins.folder) in e.value.hint
    assert not (tmp_path / "b" / "tf" / numpy.name).exists()  # nothing of the refused group is left to build from


def test_pins_for_other_requirements_are_not_used(links, tmp_path):
    """A pin found under a group's key that was resolved for other requirements (tqdm's files, found for six) is not
    taken: the group is resolved anew."""
    pins = wheels.Pins(tmp_path / "pins")
    settings = _settings(links)
    pins.keep(wheels.resolve(config(flavor="tf-cpu", pip_packages=("tqdm",)), TARGET, settings, tmp_path / "a",
                             env=ENV, pins=pins).resolved)
    _pin_file(pins, _user_key(("six",), links)).write_text(_pin_file(pins, _user_key(("tqdm",), links)).read_text())
    found = wheels.resolve(config(flavor="tf-cpu", pip_packages=("six",)), TARGET, settings, tmp_path / "b",
                           env=ENV, pins=pins)
    assert [f.name for f in found.files["user"]] == ["six-1.17.0-py3-none-any.whl"]
    assert "user" not in found.pinned


def test_an_older_kits_pins_without_hashes_are_resolved_anew_and_said_so(links, tmp_path):
    pins = wheels.Pins(tmp_path / "pins")
    tf = config(flavor="tf-cpu")
    found = wheels.resolve(tf, TARGET, _settings(links), tmp_path / "a", env=ENV, pins=pins)
    pins.keep(found.resolved)
    for key, pin in found.resolved.items():  # as kit kept them before pins had hashes
        _pin_file(pins, key).write_text(json.dumps([name for name, _ in pin["files"]]))
    again = wheels.resolve(tf, TARGET, _settings(links), tmp_path / "b", env=ENV, pins=pins)
    assert again.pinned == () and again.unhashed == ("tf", "tools")
