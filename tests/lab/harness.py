"""The lab's build inputs, shared by tests/lab and bench/.

On the CI machine there is no registry: the base is a Debian image made with
debootstrap (tests/run makes it), torch is the CPU wheel in pip's find-links
folder (never the multi-GB CUDA build from the index) and pip inside the image
trusts this machine's CA bundle.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

BASE_IMAGE = os.environ.get("KIT_TEST_BASE_IMAGE", "kit-lab/debian:bookworm")


class LabMissing(RuntimeError):
    pass


def torch_wheel() -> Path:
    folder = os.environ.get("KIT_TEST_WHEELHOUSE") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"],
        capture_output=True, text=True).stdout.strip() or os.environ.get("PIP_FIND_LINKS", "")
    wheels = sorted(Path(folder).glob("torch-*+cpu-*.whl")) if folder else []
    if not wheels:
        raise LabMissing(f"no CPU torch wheel (torch-*+cpu-*.whl) in '{folder}': "
                         "set KIT_TEST_WHEELHOUSE to a folder holding one")
    return wheels[-1]


def ca_bundle() -> str:
    return os.environ.get("KIT_TEST_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE") \
        or "/etc/ssl/certs/ca-certificates.crt"


def cpu_build_flags(workdir: Path) -> list[str]:
    """`kit build` flags for the CPU image from the lab's inputs; workdir gets a one-wheel wheelhouse."""
    wheel = torch_wheel()
    torch_version, py_major, py_minor = re.match(r"torch-([^-]+)-cp(\d)(\d+)-", wheel.name).groups()
    house = workdir / "wheelhouse"  # only torch: other wheels in the folder would change the tag
    house.mkdir(parents=True, exist_ok=True)
    if not (house / wheel.name).exists():
        (house / wheel.name).symlink_to(wheel)
    return ["--flavor", "cpu", "--base-image", BASE_IMAGE, "--wheelhouse", str(house), "--ca-bundle", ca_bundle(),
            "--torch", torch_version, "--python", f"{py_major}.{py_minor}", "--torch-index-url", ""]
