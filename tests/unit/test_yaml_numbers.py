"""kit.yaml values YAML reads as numbers (or booleans) where kit means text: read as the user wrote them, or refused
with the quoted form to write where the text itself reads otherwise."""

from pathlib import Path

import pytest

from kit.config.settings import build_config, cluster_config, read_config
from kit.errors import BadInput


def settings(in_tmp, text: str):
    (in_tmp / "kit.yaml").write_text(text)
    return read_config(Path("kit.yaml"))  # (in_tmp is the working folder)


@pytest.mark.parametrize("line, key, value", [
    ("cuda: 12.8", "cuda", "12.8"),
    ("cuda: 13.0", "cuda", "13.0"),
    ("python: 3.10", "python", "3.10"),
    ("python: 3.13", "python", "3.13"),
    ("torch: 2.13", "torch", "2.13"),
    ("torch: 2.14.1", "torch", "2.14.1"),
    ("python: '3.10'", "python", "3.10"),
    ("horovod_version: 0.28", "horovod_version", "0.28"),
    ("pip_packages: [numpy, 1.0]", "pip_packages", ("numpy", "1.0")),
    ("cuda_archs: [90, 120]", "cuda_archs", ("90", "120")),
])
def test_a_number_where_text_is_meant_is_read_as_written(in_tmp, line, key, value):
    cfg = build_config(settings(in_tmp, f"build:\n  flavor: gpu\n  {line}\n"), {})
    assert getattr(cfg, key) == value


def test_cluster_settings_are_read_as_written_and_numbers_stay_numbers(in_tmp):
    cfg = cluster_config(settings(in_tmp, "cluster:\n  name: 2024\n  shm_size: 8g\n  ssh_port: 2222\n  gpus: 2\n"), {})
    assert (cfg.name, cfg.shm_size, cfg.ssh_port, cfg.gpus) == ("2024", "8g", 2222, 2)
    build = build_config(settings(in_tmp, "build:\n  with_mpi: yes\n"), {})
    assert build.with_mpi is True


def test_a_size_without_its_unit_is_refused_with_the_unit_to_add(in_tmp):
    with pytest.raises(BadInput) as e:
        cluster_config(settings(in_tmp, "cluster:\n  shm_size: 8\n"), {})
    assert str(e.value) == "kit.yaml:2: cluster.shm_size: '8' has no unit, and Docker would read it as 8 bytes"
    assert e.value.hint.startswith("use a size such as 8g")


def test_a_cuda_line_kit_does_not_build_names_the_lines_not_the_input_again(in_tmp):
    with pytest.raises(BadInput) as e:
        build_config(settings(in_tmp, "build:\n  flavor: gpu\n  cuda: 12.4\n"), {})
    assert str(e.value) == "kit.yaml:3: build.cuda: '12.4' is not a CUDA line kit builds for"
    assert e.value.hint.startswith("use one of: 13.0")


@pytest.mark.parametrize("section, line, read", [
    ("build", "python: 3:10", "the number 190"),        # YAML 1.1's base 60
    ("build", "torch: 2.1e+1", "the number 21.0"),
    ("build", "python: 3_10", "the number 310"),
    ("build", "torch: 0x1f", "the number 31"),
    ("cluster", "storage: off", "the boolean false"),
    ("cluster", "name: yes", "the boolean true"),
])
def test_text_that_yaml_reads_otherwise_is_refused_with_the_quoted_form(in_tmp, section, line, read):
    key, written = line.split(": ")
    with pytest.raises(BadInput) as e:
        (build_config if section == "build" else cluster_config)(settings(in_tmp, f"{section}:\n  {line}\n"), {})
    assert str(e.value) == f"kit.yaml:2: {section}.{key}: {written} reads as {read} in YAML, not as the text {written}"
    assert e.value.hint == f'quote it if you mean the text: write {key}: "{written}"'
