"""SSH to a host with fabric: the user's ~/.ssh/config, agent and keys are honoured.

Host keys are checked strictly against the user's known_hosts (and any
UserKnownHostsFile the ssh config names); an unknown or changed key is refused.
Fabric's own default would accept any key, so the policy is set here.
"""

from __future__ import annotations

import shlex
import socket
import threading
from pathlib import Path
from typing import Callable, Iterable

import paramiko
from fabric import Config, Connection

from kit.errors import KitError
from kit.inventory import Host
from kit.runners.base import Result


def connection_error(host: str, port: int, timeout: int, e: Exception) -> KitError:
    """What went wrong while connecting, in the user's words, with the fix."""
    if isinstance(e, paramiko.BadHostKeyException):
        return KitError(f"the SSH host key of {host} does not match your known_hosts: someone may be "
                        f"impersonating it, or it was reinstalled", host=host,
                        hint=f"if it was reinstalled, check its new fingerprint, then `ssh-keygen -R {host}` "
                             f"and `ssh {host}` once")
    if isinstance(e, paramiko.AuthenticationException):
        return KitError("it refused your SSH keys", host=host,
                        hint=f"make `ssh {host}` work without a password (ssh-copy-id, or load your key in an agent)")
    if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
        return KitError("its SSH host key is not in your known_hosts, so it cannot be verified", host=host,
                        hint=f"run `ssh {host}` once and check the fingerprint it shows")
    if isinstance(e, (socket.timeout, TimeoutError)):
        return KitError(f"no answer on SSH port {port} within {timeout} s", host=host,
                        hint="check that the host is up and that its firewall lets SSH in from here")
    if isinstance(e, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, socket.gaierror)):
        return KitError(f"cannot connect to SSH port {port} ({e})", host=host,
                        hint="check the name or address in hosts.txt and that sshd runs there")
    return KitError(f"SSH failed: {e}", host=host, hint=f"check that `ssh {host}` works")


def ssh_hostname(host: Host) -> str:
    """What the user's ssh config makes of the host's name (its HostName), without connecting."""
    return Connection(host.name, config=Config()).host


class SshRunner:
    def __init__(self, host: Host, connect_timeout: int = 10) -> None:
        self.host = host.name
        self.timeout = connect_timeout
        self.conn = Connection(host.name, user=host.user, port=host.port, connect_timeout=connect_timeout,
                               config=Config())
        client = self.conn.client
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.load_system_host_keys()  # ~/.ssh/known_hosts
        for path in self.conn.ssh_config.get("userknownhostsfile", "").split():
            if Path(path).expanduser().is_file():
                client.load_system_host_keys(str(Path(path).expanduser()))
        self.sudo = False  # set once the login user is known not to be root

    def open(self) -> None:
        try:
            self.conn.open()
            self.conn.transport.set_keepalive(15)
        except Exception as e:  # noqa: BLE001 - every way to fail is turned into one clear KitError
            raise connection_error(self.host, self.conn.port, self.timeout, e) from None

    def peer_address(self) -> str:
        """The address this connection reached: the host's address on the path from here."""
        if not self.conn.is_connected:
            self.open()
        return self.conn.transport.getpeername()[0]

    def _wrap(self, command: str) -> str:
        return f"sudo -n sh -c {shlex.quote(command)}" if self.sudo else command

    def _session(self, command: str, timeout: float | None) -> paramiko.Channel:
        if not self.conn.is_connected:
            self.open()
        chan = self.conn.transport.open_session(timeout=self.timeout)
        chan.settimeout(timeout)
        chan.exec_command(self._wrap(command))
        return chan

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = 300,
            changes: bool = False) -> Result:
        chan = self._session(command, timeout)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        return self._finish(chan, command)

    def stream_in(self, command: str, chunks: Iterable[bytes], on_bytes: Callable[[int], None], *,
                  changes: bool = True) -> Result:
        chan = self._session(command, None)
        try:
            for chunk in chunks:
                chan.sendall(chunk)
                on_bytes(len(chunk))
        except OSError:
            pass  # the far end stopped reading: its exit status and stderr say why
        chan.shutdown_write()
        return self._finish(chan, command)

    def stream_out(self, command: str, on_line: Callable[[str], None]) -> int:
        """Run command, handing each line of its output (stderr merged) to on_line; its exit code."""
        chan = self._session(f"{command} 2>&1", None)
        chan.shutdown_write()
        for raw in chan.makefile("rb"):
            on_line(raw.decode(errors="replace").rstrip("\r\n"))
        return chan.recv_exit_status()

    def _finish(self, chan: paramiko.Channel, command: str) -> Result:
        err: list[bytes] = []
        reader = threading.Thread(target=lambda: err.append(chan.makefile_stderr("rb").read()), daemon=True)
        reader.start()
        try:
            out = chan.makefile("rb").read()
            reader.join()
            code = chan.recv_exit_status()
        except socket.timeout:
            chan.close()
            return Result(self.host, command, 124, "", "timed out")
        return Result(self.host, command, code, out.decode(errors="replace"), b"".join(err).decode(errors="replace"))

    def close(self) -> None:
        self.conn.close()
