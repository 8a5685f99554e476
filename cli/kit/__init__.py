"""kit: a Horovod / PyTorch training cluster made of Docker containers."""

from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from pathlib import Path

try:
    __version__ = version("kit-cluster")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"


def shipped_folder(package: str) -> Path:
    """A data folder shipped inside kit (examples, ansible) as a folder on disk, for tools that read it
    there: kit is installed as files (editable or a wheel), never run from a zip."""
    return Path(str(files(package)))
