import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers.py, for every test folder


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    """A small wheelhouse of real (empty) wheel files, for rendering tests."""
    d = tmp_path / "wheels"
    d.mkdir()
    (d / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel one")
    return d


@pytest.fixture
def ca_bundle(tmp_path: Path) -> Path:
    f = tmp_path / "ca.pem"
    f.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    return f


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty folder, so no ./kit.yaml is picked up by accident."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
