"""kit.yaml and flag validation: every bad value is named where it came from, with the fix."""

from pathlib import Path

import pytest

from kit.config.settings import ConfigFile, build_config, cluster_config, read_config
from kit.errors import BadInput
from kit.image.flavors import FLAVOR_DEFAULTS


def cfg_file(tmp_path: Path, text: str) -> ConfigFile:
    path = tmp_path / "kit.yaml"
    path.write_text(text)
    return read_config(path)


def test_flavor_defaults_fill_what_is_not_set():
    gpu = build_config(ConfigFile(), {"flavor": "gpu"})
    assert gpu.base_image == FLAVOR_DEFAULTS["gpu"]["base_image"] and gpu.builder_image is None
    assert (gpu.cuda, gpu.torch_index_url) == ("13.0", "https://download.pytorch.org/whl/cu130")
    line = build_config(ConfigFile(), {"flavor": "gpu", "cuda": "12.8"})
    assert line.torch_index_url == "https://download.pytorch.org/whl/cu128"  # torch's index follows the line
    own = build_config(ConfigFile(), {"flavor": "gpu", "cuda": "12.8", "torch_index_url": "https://mirror/cu128"})
    assert own.torch_index_url == "https://mirror/cu128"  # unless kit.yaml names one
    cpu = build_config(ConfigFile(), {})
    assert cpu.flavor == "cpu" and cpu.builder_image is None and cpu.python == "3.11"


def test_flags_win_over_kit_yaml_and_paths_are_relative_to_it(tmp_path, wheelhouse):
    cfg = cfg_file(tmp_path, "build:\n  flavor: cpu\n  torch: 2.12.0\n  wheelhouse: wheels\n  pip_packages: [tqdm]\n")
    c = build_config(cfg, {"torch": "2.13.0", "pip_packages": ()})
    assert c.torch == "2.13.0"
    assert c.wheelhouse == wheelhouse.resolve()
    assert c.pip_packages == ("tqdm",)


def test_tf_flavors_have_tensorflow_and_no_torch_or_horovod():
    for flavor in ("tf-cpu", "tf-gpu"):
        c = build_config(ConfigFile(), {"flavor": flavor})
        assert (c.framework, c.image, c.tensorflow, c.torch, c.horovod_version) == \
               ("tensorflow", "kit-tensorflow", "2.21.0", None, None)
        assert c.gpu == (flavor == "tf-gpu")
    cpu = build_config(ConfigFile(), {})
    assert (cpu.framework, cpu.gpu, cpu.tensorflow, cpu.horovod_version) == ("horovod", False, None, "0.28.1")


def test_empty_torch_index_turns_it_off():
    assert build_config(ConfigFile(), {"torch_index_url": ""}).torch_index_url is None


def test_missing_default_kit_yaml_is_no_config(in_tmp):
    assert read_config(None) == ConfigFile()


# (kit.yaml text or None, flags, expected start of the message, a word the fix must contain)
BAD = [
    (None, {"flavor": "tpu"}, "--flavor: 'tpu' is not allowed", "auto (the default"),
    ("build:\n  flavor: tf-cpu\n  torch: 2.13.0\n", {}, "kit.yaml:3: build.torch: does not apply to flavor tf-cpu "
     "(its image has TensorFlow, no torch or Horovod)", "remove torch"),
    (None, {"flavor": "tf-gpu", "with_mpi": True}, "--with-mpi: does not apply to flavor tf-gpu", "remove with_mpi"),
    ("build:\n  tensorflow: 2.21.0\n", {}, "kit.yaml:2: build.tensorflow: does not apply to flavor cpu (its image "
     "has torch and Horovod, no TensorFlow)", "remove tensorflow"),
    (None, {"flavor": "tf-cpu", "tensorflow": "latest"}, "--tensorflow: 'latest' is not a version", "2.21.0"),
    (None, {"wheelhouse": Path("/nonexistent/wheels")}, "--wheelhouse: folder /nonexistent/wheels does not exist", ".whl"),
    (None, {"ca_bundle": Path("/nonexistent/ca.pem")}, "--ca-bundle: file /nonexistent/ca.pem cannot be read", "PEM"),
    (None, {"image": "Kit:latest"}, "--image: 'Kit:latest' is not a repository name", "repository"),
    (None, {"base_image": "debian bookworm"}, "--base-image: 'debian bookworm' is not an image reference", "debian"),
    (None, {"python": "3"}, "--python: '3' is not a Python minor version", "3.11"),
    (None, {"torch": "latest"}, "--torch: 'latest' is not a version", "2.13.0"),
    (None, {"torch_index_url": "download.pytorch.org"}, "--torch-index-url: 'download.pytorch.org' is not a URL", "https"),
    (None, {"torch_index_url": "https://x/$(touch /tmp/pwned)"}, "--torch-index-url: 'https://x/**** /tmp/pwned)' "
     "is not a URL", "https"),  # shown as every printed URL is (kit.redact.redact)
    (None, {"pip_index_urls": ("pypi",)}, "--index-url: 'pypi' is not a URL", "https"),
    (None, {"pip_packages": ("numpy; rm -rf /",)}, "--pip: 'numpy; rm -rf /'", "requirement"),
    (None, {"apt_packages": ("Vim!",)}, "--apt: 'Vim!' is not a Debian package name", "Debian"),
    (None, {"horovod_source": "horovod master"}, "--horovod-source: 'horovod master' is not a requirement URL", "git+"),
    ("build:\n  flavour: cpu\n", {}, "kit.yaml:2: build.flavour: unknown setting", "flavor"),
    ("biuld:\n  flavor: cpu\n", {}, "kit.yaml:1: unknown section 'biuld'", "build"),
    ("build:\n  flavor: [cpu\n", {}, "kit.yaml:3: not valid YAML", "YAML"),
    ("build: cpu\n", {}, "kit.yaml:1: section 'build' must be a mapping", "indent"),
    ("- build\n", {}, "kit.yaml:1: the file must be a mapping of sections", "build:"),
    ("build:\n  flavor: cpu\n  pip_packages: numpy\n", {}, "kit.yaml:3: build.pip_packages: should be a list", "pip"),
    ("build:\n  with_mpi: maybe\n", {}, "kit.yaml:2: build.with_mpi:", "true or false"),
    ("build:\n  flavor: cpu\n\n  image: kit-horovod:v1\n", {}, "kit.yaml:4: build.image: 'kit-horovod:v1' is not a", "tag"),
]


@pytest.mark.parametrize("yaml_text,flags,message,fix", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_input_names_where_and_how_to_fix(tmp_path, yaml_text, flags, message, fix):
    with pytest.raises(BadInput) as e:
        cfg = cfg_file(tmp_path, yaml_text) if yaml_text is not None else ConfigFile()
        build_config(cfg, flags)
    text = str(e.value).replace(str(tmp_path) + "/", "")
    assert text.startswith(message), text
    assert fix in e.value.hint
    assert e.value.exit_code == 2


def test_wheelhouse_without_wheels_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="holds no .whl files"):
        build_config(ConfigFile(), {"wheelhouse": tmp_path})


def test_ca_bundle_without_certificate_is_bad_input(tmp_path):
    f = tmp_path / "ca.pem"
    f.write_text("not a certificate\n")
    with pytest.raises(BadInput, match="holds no PEM certificate"):
        build_config(ConfigFile(), {"ca_bundle": f})


def test_unreadable_ca_bundle_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="cannot be read"):
        build_config(ConfigFile(), {"ca_bundle": tmp_path})  # a folder: read_text fails


def test_unreadable_config_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="cannot read the config file"):
        read_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("flags, shown", [
    ({"horovod_source": "git+https://me:ghp_s3cret@github.com/horovod/horovod@3a31d93"},
     "--horovod-source: 'git+https://****@github.com/horovod/horovod@3a31d93' holds a user or token"),
    ({"pip_packages": ("mypkg @ https://u:s3cret@pkgs.lab/mypkg-1.0-py3-none-any.whl",)},
     "--pip: 'mypkg @ https://****@pkgs.lab/mypkg-1.0-py3-none-any.whl' holds a user or token"),
    ({"pip_index_urls": "https://u:s3cret@pypi.lab/simple"}, "--index-url: should be a list"),
])
def test_a_credential_in_a_setting_that_reaches_the_image_is_refused_and_never_shown(flags, shown):
    with pytest.raises(BadInput) as e:
        build_config(ConfigFile(), flags)
    assert str(e.value).startswith(shown) and "s3cret" not in str(e.value) + (e.value.hint or "")


def test_an_image_named_by_its_digest_is_refused_for_the_cluster_with_how_to_tag_it(tmp_path):
    """kit loads the image on every host under cluster.image_tag: a digest is no tag to give it there."""
    digest = "kit-horovod@sha256:" + "a" * 64
    with pytest.raises(BadInput) as e:
        cluster_config(cfg_file(tmp_path, f"cluster:\n  image_tag: {digest}\n"), {})
    assert str(e.value).replace(str(tmp_path) + "/", "").startswith(
        f"kit.yaml:2: cluster.image_tag: '{digest}' names an image by its digest, not by a tag")
    assert "docker tag" in e.value.hint and e.value.exit_code == 2
    assert cluster_config(cfg_file(tmp_path, "cluster:\n  image_tag: kit-horovod:cpu-1\n"), {}).image_tag == \
        "kit-horovod:cpu-1"
