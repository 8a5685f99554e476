"""kit: a Horovod / PyTorch training cluster made of Docker containers."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kit-cluster")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
