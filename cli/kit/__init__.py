"""kit: a Horovod / PyTorch training cluster made of Docker containers."""

from importlib.resources import files
from pathlib import Path


def __getattr__(name: str) -> str:
    """kit.__version__, read from the installed package when asked for (reading it costs every command's start)."""
    if name != "__version__":
        raise AttributeError(name)
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("kit-cluster")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def shipped_folder(package: str) -> Path:
    """A data folder shipped inside kit (examples, ansible) as a folder on disk, for tools that read it
    there: kit is installed as files (editable or a wheel), never run from a zip."""
    return Path(str(files(package)))
