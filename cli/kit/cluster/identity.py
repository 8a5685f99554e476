"""The cluster's SSH identity: made by kit, kept in its state folder, never printed.

One client key pair per cluster (the containers log in to each other with it)
and one host key per host (so each container has its own identity, and
known_hosts pins exactly those keys: strict host-key checking stays on).
Secrets are written 0600 in folders of 0700.
"""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kit.errors import KitError


def state_root() -> Path:
    """Where kit keeps what it made: $KIT_HOME, else ~/.kit."""
    return Path(os.environ.get("KIT_HOME") or Path.home() / ".kit")


LOCAL_OWNER_FILE = ".owner"  # in state_root(); a cluster name never starts with a dot


@dataclass(frozen=True)
class Owner:
    """Who made a cluster: one id per user of a control machine (kept, so a new key after `down` is still the
    same owner), and a name to tell people. What kit makes on a host carries both; kit touches no other's."""

    id: str
    name: str

    def __str__(self) -> str:
        return f"{self.name} (kit id {self.id[:12]})"

    @classmethod
    def parse(cls, text: str) -> "Owner | None":
        id_, _, name = text.strip().partition(" ")
        return cls(id_, name or "someone") if id_ else None


def owner(root: Path | None = None, persist: bool = True) -> Owner:
    """This user's owner id on this control machine: made once, then read."""
    path = (root or state_root()) / LOCAL_OWNER_FILE
    if path.exists():
        found = Owner.parse(path.read_text())
        if found:
            return found
    made = Owner(secrets.token_hex(16), f"{getpass.getuser()}@{socket.gethostname()}")
    if persist:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_text(f"{made.id} {made.name}\n")
    return made


@dataclass(frozen=True)
class KeyPair:
    private: bytes  # OpenSSH PEM; goes only to files of mode 0600
    public: str     # "ssh-ed25519 AAAA... comment"

    def __repr__(self) -> str:  # never let a private key reach a log or a traceback
        return f"KeyPair(public={self.public!r})"


def new_key(comment: str) -> KeyPair:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return KeyPair(private, f"{public.decode()} {comment}")


def new_munge_key() -> bytes:
    """As many random bytes as munge's own `mungekey` makes (1024 bits)."""
    return secrets.token_bytes(128)


def write_secret(path: Path, data: bytes) -> None:
    """Create or replace a file that only its owner can read, without a moment of wider modes."""
    write_file(path, data, 0o600)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Create or replace a file whole (by rename: a reader sees the old or the new), with `mode`; a new parent folder
    is its owner's alone."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600, a name of its own
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_or_make(folder: Path, comment: str, persist: bool) -> KeyPair:
    private, public = folder / "id_ed25519", folder / "id_ed25519.pub"
    if private.exists() and public.exists():
        if private.stat().st_mode & 0o077:
            raise KitError(f"{private} can be read by others (mode {private.stat().st_mode & 0o777:o})",
                           hint=f"chmod 600 {private}")
        return KeyPair(private.read_bytes(), public.read_text().strip())
    pair = new_key(comment)
    if persist:
        write_secret(private, pair.private)
        public.write_text(pair.public + "\n")
    return pair


class Identity:
    """The state folder of one cluster: ~/.kit/<cluster>/ (0700)."""

    def __init__(self, cluster: str, root: Path | None = None, persist: bool = True) -> None:
        self.folder = (root or state_root()) / cluster
        self.cluster = cluster
        self.persist = persist  # False for --dry-run: keys that do not exist yet are made in memory only
        self.owner = owner(root, persist)

    def ensure_folder(self) -> None:
        if self.persist:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.folder, 0o700)

    def client_key(self) -> KeyPair:
        self.ensure_folder()
        return _load_or_make(self.folder / "client", f"kit-{self.cluster}", self.persist)

    def remove(self) -> None:
        """Forget the cluster: its keys and state (after `kit down`)."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def munge_key(self) -> Path:
        """The cluster's munge key, which `kit prepare --slurm` puts on every host: made once (random bytes, 0600),
        then read. Not persisting (--dry-run), a key not made yet stays unmade: the path then does not exist."""
        path = self.folder / "slurm" / "munge.key"
        if path.exists():
            if path.stat().st_mode & 0o077:
                raise KitError(f"{path} can be read by others (mode {path.stat().st_mode & 0o777:o})",
                               hint=f"chmod 600 {path}")
        elif self.persist:
            self.ensure_folder()
            write_secret(path, new_munge_key())
        return path

    def host_key(self, host: str) -> KeyPair:
        self.ensure_folder()
        if self.persist:
            (self.folder / "hosts").mkdir(mode=0o700, exist_ok=True)
        return _load_or_make(self.folder / "hosts" / host, f"kit-{self.cluster}@{host}", self.persist)


def known_hosts_lines(entries: list[tuple[list[str], str]], port: int) -> str:
    """known_hosts for the cluster port: each host's names and addresses -> its pinned host key."""
    lines = []
    for names, public in entries:
        patterns = ",".join(f"[{n}]:{port}" for n in dict.fromkeys(names))
        key_type, key_data = public.split()[:2]
        lines.append(f"{patterns} {key_type} {key_data}")
    return "\n".join(lines) + "\n"
