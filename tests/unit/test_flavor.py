"""build.flavor auto (the flavor follows the hosts' NVIDIA GPUs), the driver each CUDA line needs, and the parsers of
the GPU facts, on nvidia-smi's output captured on an H200 host. The same on the lab's hosts: tests/lab/test_gpu_hosts.py."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, nvidia_smi_stand_in, run_kit
from kit.image import gpus
from kit.config.settings import ConfigFile, build_config, cuda_line, requested_flavor
from kit.errors import BadInput
from kit.image.flavors import CUDA_LINES, min_driver
from kit.cluster.prepare import ansible_playbook
from kit.image.recipe import make_recipe, render_dockerfile
from kit.cluster.steps.facts import MARK, facts_command, parse_facts
from kit.cluster.place import Place

# Captured on an H200 host (driver 580.159.04, CUDA 13.0).
SMI_L = "GPU 0: NVIDIA H200 (UUID: GPU-8f25e925-f097-b52c-532c-8ee7f0ee3c80)"
SMI_QUERY = "0, NVIDIA H200, 580.159.04, 143771 MiB, 9.0"  # --query-gpu=index,name,driver_version,memory.total,...
SMI_DRIVER = "580.159.04"                                     # --query-gpu=driver_version --format=csv,noheader
# What nvidia-smi prints (on stdout, exit 9) where the driver does not answer.
SMI_FAILED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
              "NVIDIA driver is installed and running.")


def facts_text(gpus_out: str, drivers_out: str, pci_out: str = "") -> str:
    return (f"{MARK}docker\n27.1.1\n{MARK}gpus\n{gpus_out}\n{MARK}drivers\n{drivers_out}\n{MARK}pcigpus\n{pci_out}\n"
            f"{MARK}end\n")


# ---------------------------------------------------------------- parsing

def test_the_h200s_nvidia_smi_is_one_gpu_of_driver_580():
    f = parse_facts(0, facts_text(SMI_L, SMI_DRIVER))
    assert (f.gpus, f.drivers, f.pci_gpus, f.nvidia_gpus) == (1, ("580.159.04",), 0, 1)


def test_several_gpus_give_a_driver_each():
    listed = "\n".join(SMI_L.replace("GPU 0", f"GPU {i}") for i in range(4))
    f = parse_facts(0, facts_text(listed, "\n".join([SMI_DRIVER] * 4), "0x030200\n0x030200\n0x030200\n0x030200"))
    assert (f.gpus, f.drivers, f.pci_gpus) == (4, ("580.159.04",) * 4, 4)


def test_a_host_whose_nvidia_smi_fails_has_no_gpu_listed_and_no_driver_but_its_pci_gpus_count():
    f = parse_facts(0, facts_text(SMI_FAILED, SMI_FAILED, "0x030200\n0x040300"))  # (0x0403: the GPU's audio)
    assert (f.gpus, f.drivers, f.pci_gpus, f.nvidia_gpus) == (0, (), 1, 1)
    assert parse_facts(0, facts_text("", "")).nvidia_gpus == 0


def test_the_facts_script_asks_nvidia_smi_for_the_driver_with_a_timeout():
    script = facts_command("img:1", Place("kit-a", "/var/lib/kit/a"), "/w", "a")
    assert "timeout 30 nvidia-smi --query-gpu=driver_version --format=csv,noheader" in script
    assert "timeout 30 nvidia-smi -L" in script and gpus.pci_script() in script and gpus.MARK == MARK


def test_the_pci_script_finds_nvidia_display_and_3d_controllers_here(tmp_path):
    """Run on a made-up /sys/bus/pci/devices: an NVIDIA 3D controller and its audio function, an Intel GPU."""
    for name, vendor, cls in (("0000:01:00.0", "0x10de", "0x030200"), ("0000:01:00.1", "0x10de", "0x040300"),
                              ("0000:00:02.0", "0x8086", "0x030000"), ("0000:02:00.0", "0x10de", "0x030000")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor + "\n")
        (tmp_path / name / "class").write_text(cls + "\n")
    out = subprocess.run(["sh", "-c", f"echo '{MARK}pcigpus'; {gpus.pci_script(str(tmp_path))}"], capture_output=True,
                         text=True, timeout=30).stdout
    assert gpus.parse({"pcigpus": out.split("\n", 1)[1]}).pci == 2


# ---------------------------------------------------------------- the decision

def test_auto_is_gpu_when_every_host_has_gpus_and_cpu_when_none_has():
    assert gpus.decide("auto", "build.flavor", {"a": 4, "b": 4}) == ("gpu", "every host has NVIDIA GPUs (a: 4, b: 4)")
    assert gpus.decide("auto", "build.flavor", {"a": 0, "b": 0}) == ("cpu", "no host has an NVIDIA GPU")
    assert gpus.decide("auto", "x", {"this machine": 0}, this_machine=True) == ("cpu", "this machine has no NVIDIA GPU")
    assert gpus.decide("auto", "x", {"this machine": 2}, this_machine=True) == ("gpu", "this machine has 2 NVIDIA GPUs")


def test_tf_follows_the_same_rule():
    assert gpus.decide("tf", "build.flavor", {"a": 1})[0] == "tf-gpu"
    assert gpus.decide("tf", "build.flavor", {"a": 0})[0] == "tf-cpu"


def test_mixed_hosts_are_refused_naming_both_kinds_and_the_fix():
    with pytest.raises(BadInput) as e:
        gpus.decide("auto", "build.flavor (default auto)", {"a": 4, "b": 0, "c": 0})
    assert e.value.exit_code == 2
    assert e.value.message == ("build.flavor (default auto): a has NVIDIA GPUs and b and c have none; one image cannot "
                               "serve both")
    assert e.value.hint == ("list only one kind of host in hosts.txt, or set build.flavor: cpu in kit.yaml to use CPUs "
                            "everywhere")
    with pytest.raises(BadInput) as e:
        gpus.decide("tf", "--flavor", {"a": 4, "b": 0})
    assert "set build.flavor: tf-cpu" in e.value.hint


@pytest.mark.parametrize("flavor", ["cpu", "gpu", "tf-cpu", "tf-gpu"])
def test_an_explicit_flavor_is_kept_whatever_the_hosts(flavor):
    assert gpus.decide(flavor, "build.flavor", {"a": 4, "b": 0})[0] == flavor


def test_the_flavor_asked_for_and_where(tmp_path):
    assert requested_flavor(ConfigFile()) == ("auto", "build.flavor (default auto)")
    assert requested_flavor(ConfigFile(), "gpu") == ("gpu", "--flavor")
    path = tmp_path / "kit.yaml"
    path.write_text("build:\n  flavor: tf\n")
    from kit.config.settings import read_config
    assert requested_flavor(read_config(path)) == ("tf", f"{path}:2: build.flavor")
    with pytest.raises(BadInput, match=r"--flavor: 'tpu' is not allowed") as e:
        requested_flavor(ConfigFile(), "tpu")
    assert "auto (the default" in e.value.hint


# ---------------------------------------------------------------- the driver table

def test_each_cuda_line_has_nvidias_minimum_driver():
    assert {line: c.min_driver for line, c in CUDA_LINES.items()} == {"13.0": "580", "12.8": "525"}
    assert (cuda_line("gpu", None), cuda_line("gpu", "12.8"), cuda_line("tf-gpu", None), cuda_line("cpu", None)) == \
        ("13.0", "12.8", "12.5", None)
    assert min_driver("12.5") == "525"  # TensorFlow 2.21's CUDA


@pytest.mark.parametrize("driver,line", [("535.183.01", "12.8"), ("580.159.04", "13.0"), ("580", "13.0"),
                                         ("525.60.13", "12.8"), ("579.99", "12.8"), ("470.256.02", None)])
def test_the_fitting_line_is_the_newest_whose_minimum_the_driver_meets(driver, line):
    assert gpus.fitting_line(driver) == line


def test_driver_535_is_refused_for_cuda_13_with_the_line_that_fits():
    text, hint = gpus.driver_problem(("535.183.01",) * 4, "gpu", "13.0")
    assert text == ("NVIDIA driver 535.183.01 is older than 580, the minimum for the image's CUDA 13.0; CUDA 12.8 "
                    "runs on it")
    assert hint == ('build for CUDA 12.8: put `cuda: "12.8"` in the build section of kit.yaml (a new kit.yaml: '
                    '`build: {cuda: "12.8"}`), which kit build and kit up both read, and run kit up again; or install '
                    "NVIDIA driver 580 or newer on the host")


def test_a_driver_that_meets_the_line_passes():
    assert gpus.driver_problem(("580.159.04",), "gpu", "13.0") is None
    assert gpus.driver_problem(("535.183.01",), "gpu", "12.8") is None
    assert gpus.driver_problem((), "gpu", "13.0") is None        # no driver answered: the GPU check says so
    assert gpus.driver_problem(("470.1",), "gpu", None) is None   # the image's line is not known


def test_driver_470_fits_no_line_and_is_told_which_driver_to_install():
    text, hint = gpus.driver_problem(("470.256.02",), "gpu", "13.0")
    assert text == ("NVIDIA driver 470.256.02 is older than 580, the minimum for the image's CUDA 13.0; no CUDA line "
                    "kit builds runs on it: install NVIDIA driver 580 or newer (525 or newer runs CUDA 12.8: `cuda: "
                    "\"12.8\"` in kit.yaml's build section)")
    assert hint.startswith("install NVIDIA driver 580 or newer on the host (and reboot)")
    text, _ = gpus.driver_problem(("470.256.02",), "gpu", "12.8")
    assert text.endswith("install NVIDIA driver 525 or newer")


def test_tf_gpu_needs_525_for_tensorflows_cuda_and_offers_no_cuda_line():
    text, hint = gpus.driver_problem(("470.256.02",), "tf-gpu", "12.5")
    assert text.startswith("NVIDIA driver 470.256.02 is older than 525, the minimum for TensorFlow's CUDA 12.5")
    assert "--cuda" not in text + hint
    assert gpus.driver_problem(("535.183.01",), "tf-gpu", "12.5") is None


def test_the_oldest_driver_of_a_host_is_judged():
    assert "NVIDIA driver 535.54" in gpus.driver_problem(("580.1", "535.54"), "gpu", "13.0")[0]


# ---------------------------------------------------------------- the image says its CUDA line

@pytest.mark.parametrize("flavor,cuda,label", [("gpu", None, 'io.kit.cuda="13.0"'), ("gpu", "12.8", 'io.kit.cuda="12.8"'),
                                               ("tf-gpu", None, 'io.kit.cuda="12.5"')])
def test_a_gpu_image_is_labelled_with_its_cuda_line(flavor, cuda, label):
    config = build_config(ConfigFile(), {"flavor": flavor, "cuda": cuda})
    line = next(l for l in render_dockerfile(config).splitlines() if l.startswith("LABEL io.kit.flavor="))
    assert f'io.kit.flavor="{flavor}" {label} ' in line


@pytest.mark.parametrize("flavor", ["cpu", "tf-cpu"])
def test_a_cpu_image_has_no_cuda_label_and_keeps_its_key(flavor):
    config = build_config(ConfigFile(), {"flavor": flavor})
    assert "io.kit.cuda" not in render_dockerfile(config)
    assert make_recipe(config).key == make_recipe(build_config(ConfigFile(), {"flavor": flavor})).key


# ---------------------------------------------------------------- kit prepare's NVIDIA role, run here (check mode)

def run_role(tmp_path: Path, pci: tuple[str, ...], **extra: str) -> subprocess.CompletedProcess:
    """The NVIDIA role against this machine in check mode (it reads, changes nothing), on a made-up PCI bus of
    NVIDIA functions of these classes, with an nvidia-smi that fails as one without a working driver does."""
    for i, cls in enumerate(pci):
        device = tmp_path / "pci" / f"0000:0{i + 1}:00.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x10de\n")
        (device / "class").write_text(cls + "\n")
    (tmp_path / "pci").mkdir(parents=True, exist_ok=True)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvidia-smi").write_text(f"#!/bin/sh\necho '{SMI_FAILED}'\nexit 9\n")
    (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    play = tmp_path / "play.yml"
    play.write_text(f"- hosts: all\n  gather_facts: false\n  roles:\n    - {REPO / 'ansible/roles/nvidia'}\n")
    args = [a for k, v in {**extra, "kit_pci_devices": str(tmp_path / "pci")}.items() for a in ("-e", f"{k}={v}")]
    return subprocess.run([ansible_playbook(), "-i", "localhost,", "-c", "local", "--check", *args, str(play)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
                               "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1"})


def test_prepare_leaves_a_host_without_gpus_alone_unless_a_gpu_flavor_is_set(tmp_path):
    r = run_role(tmp_path / "auto", ("0x040300",), kit_gpu="false")  # (an NVIDIA audio function is no GPU)
    assert r.returncode == 0 and "failed=0" in r.stdout, r.stdout + r.stderr
    assert re.search(r"NVIDIA Container Toolkit\] \*+\nskipping: \[localhost\]", r.stdout), r.stdout
    r = run_role(tmp_path / "gpu", (), kit_gpu="true")
    assert r.returncode != 0, r.stdout
    assert ("localhost has no NVIDIA GPU (none on its PCI bus, nvidia-smi lists none), but build.flavor is a GPU flavor"
            in r.stdout), r.stdout


def test_prepare_names_a_host_whose_gpus_have_no_working_driver(tmp_path):
    r = run_role(tmp_path, ("0x030200",), kit_gpu="false")
    assert r.returncode != 0, r.stdout
    assert "nvidia-smi does not answer on localhost: install the NVIDIA driver (and reboot)" in r.stdout, r.stdout


# ---------------------------------------------------------------- kit build decides it, and says why

def build_dry_run(folder: Path, *args: str, gpus_here: tuple[int, str] | None = None) -> subprocess.CompletedProcess:
    """`kit build --dry-run` in an empty folder, with no cluster recorded; `gpus_here`: a stand-in nvidia-smi on PATH
    reporting (GPUs, driver)."""
    env = {"KIT_HOME": str(folder / ".kit"), "DOCKER_HOST": "unix:///nonexistent/kit-test.sock"}
    if gpus_here:
        (folder / "bin").mkdir(exist_ok=True)
        (folder / "bin" / "nvidia-smi").write_text(nvidia_smi_stand_in(*gpus_here))
        (folder / "bin" / "nvidia-smi").chmod(0o755)
        env["PATH"] = f"{folder / 'bin'}:{os.environ['PATH']}"
    return run_kit("build", "--dry-run", *args, cwd=folder, env=env)


@pytest.mark.skipif(any(p.joinpath("vendor").read_text().strip() == "0x10de" for p in Path(gpus.PCI_DEVICES).iterdir()),
                    reason="this machine has an NVIDIA GPU")
def test_kit_build_on_a_machine_without_gpus_decides_cpu_and_says_how_to_build_for_servers(in_tmp):
    r = build_dry_run(in_tmp)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == ("flavor auto -> cpu: this machine has no NVIDIA GPU; give --hosts hosts.txt to "
                                        "build for your servers")
    assert "FROM debian:bookworm-slim" in r.stdout and "io.kit.cuda" not in r.stdout


def test_kit_build_with_gpus_here_decides_gpu_and_tf_decides_tf_gpu(in_tmp):
    r = build_dry_run(in_tmp, gpus_here=(4, "580.159.04"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("flavor auto -> gpu: this machine has 4 NVIDIA GPUs;")
    assert 'io.kit.flavor="gpu" io.kit.cuda="13.0"' in r.stdout
    r = build_dry_run(in_tmp, "--flavor", "tf", gpus_here=(4, "580.159.04"))
    assert r.stdout.splitlines()[0].startswith("flavor tf -> tf-gpu: this machine has 4 NVIDIA GPUs;"), r.stdout[:300]


def test_kit_build_of_an_explicit_flavor_reads_no_gpus(in_tmp):
    r = build_dry_run(in_tmp, "--flavor", "cpu", gpus_here=(4, "580.159.04"))
    assert r.returncode == 0 and r.stdout.startswith("# kit ") and "io.kit.cuda" not in r.stdout


def test_kit_build_with_unreadable_hosts_names_them_and_builds_nothing(in_tmp):
    (in_tmp / "hosts.txt").write_text("gpu_1\n")
    r = build_dry_run(in_tmp, "--hosts", "hosts.txt")
    assert r.returncode == 2 and r.stderr.startswith("error: hosts.txt:1: 'gpu_1' is not a host name"), r.stderr


# ---------------------------------------------------------------- kit up's preflight and kit doctor judge alike

def gpu_host(name: str, driver: str, count: int = 4):
    from kit.config.hosts import Host
    from kit.cluster.steps.facts import HostFacts
    from kit.cluster.steps.node import Node
    facts = HostFacts(uid=0, docker_version="27.1.1", free_bytes=50 << 30, gpus=count, drivers=(driver,) * count,
                      runtimes=frozenset({"runc", "nvidia"}))
    return Node(Host(name), None, Place("kit-lab", "/var/lib/kit/lab"), facts=facts)


def test_preflight_and_the_doctor_refuse_driver_535_for_cuda_13_the_same_way():
    from kit.doctor import judge as jd
    from kit.doctor import read as rd
    from kit.config.settings import ClusterConfig
    from kit.errors import HostsFailed
    from kit.cluster.steps import preflight
    nodes = [gpu_host("a", "535.183.01"), gpu_host("b", "580.159.04"), gpu_host("c", "535.183.01")]
    with pytest.raises(HostsFailed) as e:
        preflight.check_drivers(nodes, "gpu", "13.0")
    text, hint = gpus.driver_problem(("535.183.01",), "gpu", "13.0")
    assert {h: f.message for h, f in e.value.failures.items()} == {"a": text, "c": text} and e.value.hint == hint
    preflight.check_drivers(nodes, "gpu", "12.8")  # 12.8 runs on both
    for n in nodes:
        r = rd.Reading(n.name, facts=n.facts, drivers=n.facts.drivers)
        found = {f.check: f for f in jd._host_checks(r, ClusterConfig(name="lab"), None, True, "gpu", "13.0")}
        assert (found["cuda"].level, found["cuda"].text, found["cuda"].fix) == (
            ("fail", text, hint) if n.name != "b" else
            ("ok", "NVIDIA driver 580.159.04 runs CUDA 13.0 (it needs 580 or newer)", ""))


def test_the_doctor_decides_auto_as_up_does_and_fails_mixed_hosts_on_each():
    from kit.doctor import judge as jd
    from kit.doctor import read as rd
    readings = [rd.Reading(n.name, facts=n.facts) for n in (gpu_host("a", "580.1"), gpu_host("b", "580.1", count=0))]
    flavor, found = jd.decide_flavor("auto", "build.flavor (default auto)", readings)
    assert [(f.host, f.check, f.level) for f in found] == [("a", "flavor", "fail"), ("b", "flavor", "fail")]
    assert found[0].text == "the flavor cannot follow the hosts' GPUs: build.flavor (default auto): a has NVIDIA GPUs " \
                            "and b has none; one image cannot serve both"
    assert jd.decide_flavor("auto", "x", readings[:1]) == ("gpu", []) and jd.decide_flavor("cpu", "x", readings) == ("cpu", [])


def test_the_gpu_facts_script_as_it_ran_on_an_h200_host():
    """tests/unit/data/h200_gpu_facts.txt: gpus.SCRIPT's output on an H200 host (driver 580.159.04), captured."""
    text = (Path(__file__).parent / "data" / "h200_gpu_facts.txt").read_text()
    from kit.cluster.steps.facts import sections
    found = gpus.parse(sections(text))
    assert (found.listed, found.drivers, found.pci, found.count) == (1, ("580.159.04",), 1, 1)
    assert gpus.driver_problem(found.drivers, "gpu", cuda_line("gpu", None)) is None
