"""The image's wheels: which groups each flavor resolves, the exact pip runs, and a real offline resolution
with this machine's pip into per-stage folders."""

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kit.image import wheels
from kit.config.settings import ConfigFile, build_config
from kit.errors import KitError
from kit.image.pipconfig import PipSettings
from kit.image.wheels import Group, Target

TARGET = Target("3.11", "x86_64", (2, 36))


def config(**flags):
    return build_config(ConfigFile(), flags)


def test_cpu_groups_follow_the_stages_and_ask_for_the_cpu_build_of_torch():
    torch = ("torch==2.13.0+cpu", "cloudpickle", "psutil", "pyyaml", "packaging", "numpy")
    assert wheels.groups(config()) == [
        Group("torch", torch),
        Group("build", ("setuptools", "wheel", "cffi", "cmake>=3.24"), along=torch),
        Group("horovod", ("horovod==0.28.1",), no_deps=True, sdist=True),
        Group("tools", ("py-spy>=0.4,<0.5",)),  # in every image: py-spy for a hung rank's stack
    ]
    assert wheels.torch_requirement(config(torch="2.12.0+cpu")) == "torch==2.12.0+cpu"
    assert wheels.torch_requirement(config(flavor="gpu")) == "torch==2.14.1"  # PyPI's torch is CUDA 13.0's
    assert wheels.torch_requirement(config(flavor="gpu", cuda="12.8")) == "torch==2.14.1+cu128"  # never PyPI's


def test_the_gpu_build_takes_the_cuda_compiler_of_torchs_own_cuda_from_wheels():
    """Resolved along with torch, so pip takes the very CUDA version torch pins: one CUDA in the image, not two."""
    build = wheels.groups(config(flavor="gpu"))[1]
    assert build.requirements[-1] == "cuda-toolkit[nvcc,cccl]" and build.along[0] == "torch==2.14.1"
    assert wheels.build_requirements(config(flavor="gpu", cuda="12.8"))[-2:] == (
        "nvidia-cuda-nvcc-cu12==12.8.*", "nvidia-cuda-cccl-cu12==12.8.*")
    cuda_base = config(flavor="gpu", builder_image="nvidia/cuda:13.0.0-devel-ubuntu24.04")
    assert wheels.build_requirements(cuda_base) == wheels.HOROVOD_BUILD  # its own CUDA compiler


def test_user_packages_are_resolved_along_with_the_stage_below():
    user = wheels.groups(config(pip_packages=("tqdm>=4",)))[-2]
    assert user == Group("user", ("tqdm>=4",), along=wheels.groups(config())[0].requirements)
    tf_user = wheels.groups(config(flavor="tf-cpu", pip_packages=("six",)))[-2]
    assert tf_user == Group("user", ("six",), along=("tensorflow-cpu==2.21.0",))


TOOLS = Group("tools", wheels.TOOLS)


def test_tf_keras_comes_without_dependencies_beside_tensorflow_cpu():
    assert wheels.groups(config(flavor="tf-cpu")) == [
        Group("tf", ("tensorflow-cpu==2.21.0",)), Group("tf", ("tf-keras==2.21.*",), no_deps=True), TOOLS]
    assert wheels.groups(config(flavor="tf-gpu")) == [Group("tf", ("tensorflow[and-cuda]==2.21.0", "tf-keras==2.21.*")),
                                                      TOOLS]


def test_target_platform_options_cover_every_manylinux_level_up_to_the_bases_glibc():
    opts = Target("3.12", "aarch64", (2, 28)).pip_options()
    assert opts[:7] == ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
    platforms = opts[8::2]
    assert platforms[0] == "manylinux_2_28_aarch64" and "manylinux_2_5_aarch64" in platforms
    assert "manylinux_2_29_aarch64" not in platforms
    assert platforms[-4:] == ["manylinux2014_aarch64", "manylinux2010_aarch64", "manylinux1_aarch64", "linux_aarch64"]


def test_download_argv_is_exact():
    assert wheels.download_argv("py", Group("horovod", ("horovod==0.28.1",), no_deps=True, sdist=True), TARGET,
                                Path("/w/horovod")) == \
        ["py", "-m", "pip", "download", "--no-input", "--progress-bar", "off", "--dest", "/w/horovod",
         "--no-binary", ":all:", "--no-build-isolation", "--no-deps", "horovod==0.28.1"]
    argv = wheels.download_argv("py", Group("user", ("six",), along=("numpy",)), TARGET, Path("/w/x"))
    assert argv[:8] == ["py", "-m", "pip", "download", "--no-input", "--progress-bar", "off", "--dest"]
    assert argv[9:] == TARGET.pip_options() + ["numpy", "six"]


@pytest.mark.parametrize("text, version", [
    ("ldd (Debian GLIBC 2.36-9+deb12u10) 2.36\nCopyright (C) 2022 Free Software Foundation, Inc.\n", (2, 36)),
    ("ldd (Ubuntu GLIBC 2.39-0ubuntu8.4) 2.39\nCopyright (C) 2024 Free Software Foundation, Inc.\n", (2, 39)),
    ("musl libc (x86_64)\nVersion 1.2.4\n", None),
])
def test_glibc_version_from_ldd(text, version):
    assert wheels.parse_glibc(text) == version


# ---------------------------------------------------------------- a real resolution, offline

def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), tag: str = "py3-none-any") -> Path:
    """A minimal valid wheel, so that the real pip resolves it with nothing but this folder."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{name.replace('-', '_')}/__init__.py": b"",
             f"{dist}.dist-info/METADATA": ("Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"
                                            + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
             f"{dist}.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: kit-test\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for n, d in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    path = folder / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr(f"{dist}.dist-info/RECORD", record)
    return path


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No index, a find-links folder of tiny wheels: tf-cpu's groups resolve for real without a network."""
    links = tmp_path / "links"
    links.mkdir()
    make_wheel(links, "tensorflow-cpu", "2.21.0", ("numpy>=1.26",), tag="cp311-cp311-manylinux_2_17_x86_64")
    make_wheel(links, "numpy", "2.4.6", tag="cp311-cp311-manylinux_2_27_x86_64")
    make_wheel(links, "numpy", "2.5.0", tag="cp311-cp311-manylinux_2_39_x86_64")  # too new a glibc for the base
    make_wheel(links, "tf-keras", "2.21.0", ("tensorflow<2.22",))
    make_wheel(links, "tqdm", "4.67.1", ("numpy",))
    make_wheel(links, "py-spy", "0.4.3", tag="py2.py3-none-manylinux_2_5_x86_64")
    return PipSettings({"no-index": "1", "find-links": str(links)})


def test_real_resolution_fills_each_stages_folder_for_the_images_platform(offline, tmp_path):
    found = wheels.resolve(config(flavor="tf-cpu", pip_packages=("tqdm",)), TARGET, offline, tmp_path / "out",
                           env={"PATH": "/usr/bin:/bin"})
    names = {folder: sorted(f.name for f in files) for folder, files in found.files.items()}
    assert names == {
        "tf": ["numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl",  # not 2.5.0: it needs glibc 2.39
               "tensorflow_cpu-2.21.0-cp311-cp311-manylinux_2_17_x86_64.whl",
               "tf_keras-2.21.0-py3-none-any.whl"],  # without its `tensorflow` dependency
        "user": ["tqdm-4.67.1-py3-none-any.whl"],  # numpy is the tf stage's, not repeated
        "tools": ["py_spy-0.4.3-py2.py3-none-manylinux_2_5_x86_64.whl"],
    }
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tf", "tools", "user"]


def test_a_package_no_source_has_is_named_with_the_fix(offline, tmp_path):
    with pytest.raises(KitError, match="pip could not resolve no-such-package") as e:
        wheels.resolve(config(flavor="tf-cpu", pip_packages=("no-such-package",)), TARGET, offline,
                       tmp_path / "out", env={"PATH": "/usr/bin:/bin"})
    assert "No matching distribution found for no-such-package" in e.value.output_tail
    assert "find-links" in e.value.hint and e.value.command.startswith(sys.executable)


def make_sdist(folder: Path, name: str, version: str) -> Path:
    """A source archive with a setup.py, as Horovod's (a legacy sdist, no pyproject.toml)."""
    import tarfile
    src = folder / f"src-{name}"
    (src / f"{name}-{version}").mkdir(parents=True)
    (src / f"{name}-{version}" / "setup.py").write_text(f"from setuptools import setup\nsetup(name='{name}', "
                                                        f"version='{version}', install_requires=['cffi'])\n")
    path = folder / f"{name}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        t.add(src / f"{name}-{version}", arcname=f"{name}-{version}")
    return path


def test_horovods_source_archive_comes_from_a_folder_of_wheels_and_archives_alone(tmp_path):
    """An air-gapped lab's wheelhouse: no index at all, setuptools only as a wheel. The archive's metadata is
    prepared by kit's own setuptools (no second pip, which would need setuptools' source and get the indexes,
    credentials and all, on its command line)."""
    links = tmp_path / "links"
    links.mkdir()
    make_sdist(links, "horovod", "0.28.1")
    group = Group("horovod", ("horovod==0.28.1",), no_deps=True, sdist=True)
    dest = tmp_path / "out"
    conf = tmp_path / "pip.conf"
    conf.write_text(PipSettings({"no-index": "1", "find-links": str(links)}).config_file())
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": str(conf)}
    wheels._pip(wheels.download_argv(sys.executable, group, TARGET, dest), env, subprocess.run, group)
    assert [p.name for p in dest.iterdir()] == ["horovod-0.28.1.tar.gz"]


def test_the_cpu_torch_missing_from_a_plain_index_says_where_it_is(offline, tmp_path):
    with pytest.raises(KitError) as e:
        wheels.resolve(config(), TARGET, offline, tmp_path / "out", env={"PATH": "/usr/bin:/bin"})
    assert "torch==2.13.0+cpu" in e.value.output_tail
    assert "https://download.pytorch.org/whl/cpu" in e.value.hint and "build.wheelhouse" in e.value.hint


def test_the_cuda_128_torch_missing_from_a_plain_index_says_where_it_is(offline, tmp_path):
    with pytest.raises(KitError) as e:
        wheels.resolve(config(flavor="gpu", cuda="12.8"), TARGET, offline, tmp_path / "out",
                       env={"PATH": "/usr/bin:/bin"})
    assert "torch==2.14.1+cu128" in e.value.output_tail
    assert "https://download.pytorch.org/whl/cu128" in e.value.hint and "build.wheelhouse" in e.value.hint


def test_every_stage_resolved_along_with_torch_gets_only_its_own_files(tmp_path):
    """build and user are both resolved along with torch's group: each run sees torch's files, keeps its own.
    pip itself is replaced here by what it does with --dest: writes the files it lacks."""
    made = {"torch==2.13.0+cpu": ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                                  "cloudpickle-3.1.2-py3-none-any.whl"],
            "setuptools": ["setuptools-80.0.0-py3-none-any.whl"], "horovod==0.28.1": ["horovod-0.28.1.tar.gz"],
            "six": ["six-1.17.0-py2.py3-none-any.whl"], "py-spy>=0.4,<0.5": ["py_spy-0.4.3-py2.py3-none-any.whl"]}

    def pip(argv, **kwargs):
        dest = Path(argv[argv.index("--dest") + 1])
        for requirement, files in made.items():
            if requirement in argv:
                for name in files:
                    if not (dest / name).exists():
                        (dest / name).write_text(requirement)
        return subprocess.CompletedProcess(argv, 0, "", "")

    found = wheels.resolve(config(pip_packages=("six",)), TARGET, PipSettings({}), tmp_path / "out",
                           env={"PATH": "/usr/bin:/bin"}, run=pip)
    assert {k: sorted(f.name for f in v) for k, v in found.files.items()} == {
        "torch": sorted(made["torch==2.13.0+cpu"]), "build": made["setuptools"], "horovod": made["horovod==0.28.1"],
        "user": made["six"], "tools": made["py-spy>=0.4,<0.5"]}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["build", "horovod", "tools", "torch", "user"]


def test_stages_below_a_changed_one_keep_the_files_of_the_image_built_before_though_the_index_moved_on(offline,
                                                                                                        tmp_path):
    """The user's extra packages change after a new numpy came out: tf's stage takes the numpy it took before (its
    layers stay, and `kit up` sends only the top ones); a build without what was kept takes the new one."""
    env = {"PATH": "/usr/bin:/bin"}
    pins = wheels.Pins(tmp_path / "pins")

    def names(found):
        return {folder: sorted(f.name for f in files) for folder, files in found.files.items()}
    before = wheels.resolve(config(flavor="tf-cpu", pip_packages=("tqdm",)), TARGET, offline, tmp_path / "a",
                            env=env, pins=pins)
    assert before.pinned == ()
    pins.keep(before.resolved)
    links = Path(offline.values["find-links"])
    make_wheel(links, "numpy", "2.4.7", tag="cp311-cp311-manylinux_2_27_x86_64")  # released since
    make_wheel(links, "six", "1.17.0")
    changed = config(flavor="tf-cpu", pip_packages=("tqdm", "six"))

    after = wheels.resolve(changed, TARGET, offline, tmp_path / "b", env=env, pins=pins)
    assert names(after)["tf"] == names(before)["tf"] and "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl" in \
        names(after)["tf"]
    assert names(after)["tools"] == names(before)["tools"] and after.pinned == ("tf", "tools")
    # Resolved anew: pip takes the newest numpy for tqdm as well; the image keeps tf's, which satisfies it.
    assert {"six-1.17.0-py3-none-any.whl", "tqdm-4.67.1-py3-none-any.whl"} <= set(names(after)["user"])
    pins.keep(after.resolved)

    fresh = wheels.resolve(changed, TARGET, offline, tmp_path / "c", env=env)
    assert "numpy-2.4.7-cp311-cp311-manylinux_2_27_x86_64.whl" in names(fresh)["tf"] and fresh.pinned == ()

    (links / "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl").unlink()  # the index no longer has it: anew
    gone = wheels.resolve(changed, TARGET, offline, tmp_path / "d", env=env, pins=pins)
    assert "numpy-2.4.7-cp311-cp311-manylinux_2_27_x86_64.whl" in names(gone)["tf"]
    assert names(gone)["tf"] == names(fresh)["tf"]
    assert "user" not in gone.pinned  # kept for (tqdm, six), but it was what tf's stage lacked, and that changed
    assert gone.pinned == ("tools",)  # tf_keras kept its file, but tf's folder is not all as before


def test_a_kept_file_the_sources_now_replace_with_another_of_the_same_version_is_resolved_anew(offline, tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    pins = wheels.Pins(tmp_path / "pins")
    tf = config(flavor="tf-cpu")
    pins.keep(wheels.resolve(tf, TARGET, offline, tmp_path / "a", env=env, pins=pins).resolved)
    links = Path(offline.values["find-links"])
    make_wheel(links, "numpy", "2.4.6", tag="cp311-cp311-manylinux_2_34_x86_64")  # a better fit, same version
    again = wheels.resolve(tf, TARGET, offline, tmp_path / "b", env=env, pins=pins)
    taken = sorted(f.name for f in again.files["tf"])
    assert "numpy-2.4.6-cp311-cp311-manylinux_2_34_x86_64.whl" in taken
    assert sorted(n for pin in again.resolved.values() for n, _ in pin["files"] if n.startswith(("numpy", "tensorflow",
                                                                                                  "tf_keras"))) == taken


def test_a_groups_key_follows_its_pip_run_and_sources_but_not_an_index_credential():
    group = Group("torch", ("torch==2.13.0+cpu",))
    key = wheels.group_key(group, TARGET, PipSettings({"index-url": "https://me:token1@pypi.example/simple"}))
    assert key == wheels.group_key(group, TARGET, PipSettings({"index-url": "https://me:token2@pypi.example/simple"}))
    assert key != wheels.group_key(group, TARGET, PipSettings({"index-url": "https://me:token1@other.example/simple"}))
    assert key != wheels.group_key(Group("torch", ("torch==2.14.1",)), TARGET,
                                   PipSettings({"index-url": "https://me:token1@pypi.example/simple"}))
    other = wheels.Target("3.12", TARGET.machine, TARGET.glibc)
    assert key != wheels.group_key(group, other, PipSettings({"index-url": "https://me:token1@pypi.example/simple"}))


def test_a_pins_file_that_is_not_a_pin_is_no_pin(tmp_path):
    pins = wheels.Pins(tmp_path)
    group = Group("tf", ("numpy",))
    wheel = "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl"
    pins.keep({"a": {"requirements": ["numpy"], "along": [], "files": [[wheel, "0" * 64]]}})
    assert pins.get("a", group) == {wheel: "0" * 64}
    for text in ('"abc"', '["abc"]', "{", "[1]", '{"requirements": ["numpy"], "along": [], "files": [["abc", "0"]]}',
                 '{"requirements": ["numpy"], "along": [], "files": [["%s", "no hash"]]}' % wheel):
        (tmp_path / "b.json").write_text(text)
        assert pins.get("b", group) is None
    assert pins.get("missing", group) is None and sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]
    (tmp_path / "old.json").write_text(f'["{wheel}"]')  # an older kit's: names only
    assert pins.get("old", group) is None and pins.unhashed("old") and not pins.unhashed("a")


def test_a_group_is_pinned_by_each_wheels_name_and_version_and_never_one_from_a_url_or_a_source_archive():
    group = Group("torch", ("torch==2.13.0+cpu", "numpy"), along=("x",))
    assert wheels.pinned(group, ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
                                 "typing_extensions-4.16.0-py3-none-any.whl"]) == \
        Group("torch", ("torch===2.13.0+cpu", "typing-extensions===4.16.0"), no_deps=True)
    assert wheels.can_pin(group)
    assert not wheels.can_pin(Group("horovod", ("horovod==0.28.1",), no_deps=True, sdist=True))
    assert not wheels.can_pin(Group("user", ("mypkg @ https://example.invalid/mypkg-1.0-py3-none-any.whl",)))
