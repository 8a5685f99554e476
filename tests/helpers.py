"""Helpers shared by the unit tests, the lab tests and bench/."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_kit(*args: str, cwd: Path, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run the installed `kit` as a user would, with wide output so lines stay whole."""
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=cwd, env={**os.environ, "COLUMNS": "200", **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def silent_listener():
    """A loopback socket that takes connections and never says a word: a hung index or a black-holing proxy.
    Close it when done."""
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def closed_port() -> int:
    """A loopback port where nothing listens: a connection is refused at once."""
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port
