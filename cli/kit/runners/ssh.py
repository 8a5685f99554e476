"""SSH to a host with fabric: the user's ~/.ssh/config, agent and keys are honoured.

Host keys are checked strictly against the user's known_hosts (and any
UserKnownHostsFile the ssh config names); an unknown or changed key is refused.
Fabric's own default would accept any key, so the policy is set here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import shlex
import shutil
import signal
import socket
import termios
import threading
import time
import tty as terminal
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

import paramiko
from fabric import Config, Connection

from kit.errors import KitError
from kit.config.hosts import Host
from kit.runners.base import CHUNK, LINE_KEPT, STALL_S, Head, Lines, Result, Tail, read_lines


# paramiko's transport thread logs every failed handshake with its traceback (to stderr, through logging's last
# resort, as no handler is set): kit says what failed itself, in one line with the fix.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


def ssh_command(host: Host) -> str:
    """The ssh command line that reaches the host as hosts.txt names it (its port and user, where hosts.txt gives
    them; else the user's ssh config decides, alias and all)."""
    port = f"-p {host.port} " if host.port is not None else ""
    user = f"{host.user}@" if host.user else ""
    return f"ssh {port}{shlex.quote(user + host.name)}"


def known_hosts_name(hostname: str, port: int) -> str:
    """The name a host's key has in known_hosts (as ssh writes it): [name]:port unless the port is 22."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def connection_error(host: Host, hostname: str, port: int, timeout: int, e: Exception,
                     via: list[str] = (), source: str = "hosts.txt") -> KitError:
    """What went wrong while connecting to `host` (hostname, port: where the user's ssh config and hosts.txt take it;
    directly, or through the jump hosts `via`), in the user's words, with the fix: the ssh command that reaches it
    as hosts.txt names it. A host key is named by the machine whose key it is: the host's, or a jump host's.
    source: where the host's name was given (hosts.txt, or kit.yaml's slurm.login)."""
    through = f" (through jump host {', '.join(via)})" if via else ""
    where = hostname if hostname == host.name else f"{hostname} (the HostName of {host.name})"
    key = where if port == 22 else f"{where}, port {port},"  # whose key: the name and port known_hosts has it by
    of = "" if hostname == host.name else f" of {hostname}"
    ssh = ssh_command(host)

    def jump_host(name: str) -> bool:  # a key of a jump host, not of the host itself (whatever its alias)
        return name not in (host.name, hostname) and name in via

    if isinstance(e, paramiko.BadHostKeyException):
        whose = e.hostname.strip("[]").split("]:")[0] if getattr(e, "hostname", None) else hostname
        if jump_host(whose):
            return KitError(f"the SSH host key of {whose}, the jump host on the way to {host.name}, does not match "
                            f"your known_hosts: someone may be impersonating it, or it was reinstalled", host=host.name,
                            hint=f"if it was reinstalled, check its new fingerprint, then `ssh-keygen -R {whose}` and "
                                 f"`ssh {whose}` once")
        entry = shlex.quote(known_hosts_name(hostname, port))
        return KitError(f"the SSH host key of {key} does not match your known_hosts: someone may be "
                        f"impersonating it, or it was reinstalled", host=host.name,
                        hint=f"if it was reinstalled, check its new fingerprint, then `ssh-keygen -R {entry}` and "
                             f"`{ssh}` once")
    if isinstance(e, paramiko.AuthenticationException):
        return KitError("it refused your SSH keys", host=host.name,
                        hint=f"make `{ssh}` work without a password (ssh-copy-id, or load your key in an agent)")
    if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
        m = re.search(r"Server '\[?([^]' ]+)", str(e))
        whose = m[1] if m else hostname
        if jump_host(whose):
            return KitError(f"the SSH host key of {whose}, the jump host on the way, is not in your known_hosts, so it "
                            f"cannot be verified", host=host.name,
                            hint=f"run `ssh {whose}` once and check the fingerprint it shows")
        return KitError(f"the SSH host key of {key} is not in your known_hosts, so it cannot be "
                        f"verified", host=host.name, hint=f"run `{ssh}` once and check the fingerprint it shows")
    if isinstance(e, paramiko.SSHException) and re.search(r"protocol version|protocol banner", str(e)):
        said = re.search(r'version "([^"]{0,40})', str(e))
        heard = f"it said {said[1]!r}" if said else "it sent no SSH greeting"
        return KitError(f"port {port} of {where}{through} answers, but not as an SSH server ({heard})", host=host.name,
                        hint="name the host's SSH port: `host port=N` in hosts.txt, or Port in your ~/.ssh/config"
                        if source == "hosts.txt" else f"name the host's SSH port as Port in your ~/.ssh/config (the "
                                                      f"host of {source})")
    if isinstance(e, (socket.timeout, TimeoutError)):
        return KitError(f"no answer on SSH port {port}{of} within {timeout} s{through}", host=host.name,
                        hint="check that the host is up and that its firewall lets SSH in from here")
    if isinstance(e, (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError, socket.gaierror)):
        return KitError(f"cannot connect to SSH port {port}{of}{through} ({e})", host=host.name,
                        hint=f"check the name or address in {source} (and its HostName and Port in your "
                             "~/.ssh/config) and that sshd runs there")
    return KitError(f"SSH failed: {e}", host=host.name, hint=f"check that `{ssh}` works")


def ssh_hostname(host: Host) -> str:
    """What the user's ssh config makes of the host's name (its HostName), without connecting."""
    return Connection(host.name, config=Config()).host


def _strict(conn: Connection) -> None:
    """Host keys checked against the user's known_hosts (and the files their ssh config names), as ssh does;
    fabric would accept any key."""
    client = conn.client
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.load_system_host_keys()  # ~/.ssh/known_hosts
    for path in conn.ssh_config.get("userknownhostsfile", "").split():
        if Path(path).expanduser().is_file():
            client.load_system_host_keys(str(Path(path).expanduser()))


class SshRunner:
    def __init__(self, host: Host, connect_timeout: int = 10, source: str = "hosts.txt") -> None:
        self.host = host.name
        self.spec = host
        self.source = source  # where the host was named: hosts.txt, or kit.yaml's slurm.login
        self.timeout = connect_timeout
        self.conn = Connection(host.name, user=host.user, port=host.port, connect_timeout=connect_timeout,
                               config=Config())
        self.via: list[str] = []  # ProxyJump hops, nearest last: each is checked like the host itself
        hop = self.conn
        while isinstance(hop, Connection):
            _strict(hop)
            hop.connect_timeout = connect_timeout
            if hop is not self.conn:
                self.via.insert(0, hop.host)
            hop = hop.gateway
        self.sudo = False  # set once the login user is known not to be root
        self.closed = False  # by kit: a closed runner opens no new connection (a stopped step starts nothing)

    def open(self) -> None:
        if self.closed:
            raise KitError("kit had closed its connection to the host (it was stopped)", host=self.host)
        try:
            self.conn.open()
            self.conn.transport.set_keepalive(15)
        except Exception as e:  # noqa: BLE001 - every way to fail is turned into one clear KitError
            raise connection_error(self.spec, self.conn.host, self.conn.port, self.timeout, e, self.via,
                                   self.source) from None

    def peer_address(self) -> str:
        """The host's own address on the path from here, as the host sees it ($SSH_CONNECTION's server address):
        through a jump host, the address from the last hop, not the jump host's (what getpeername gives)."""
        if not self.conn.is_connected:
            self.open()
        chan = self.conn.transport.open_session(timeout=self.timeout)
        chan.settimeout(self.timeout)
        chan.exec_command("echo $SSH_CONNECTION")  # the login shell's: sudo would drop it
        words = self._finish(chan, "echo $SSH_CONNECTION", self.timeout).stdout.split()
        if len(words) == 4:
            return words[2]
        if self.via:
            raise KitError("cannot learn the host's address ($SSH_CONNECTION is empty)", host=self.host,
                           hint="let sshd set SSH_CONNECTION for the login user, or connect without a jump host")
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
        """timeout: how long it may take in all, however it trickles output (None: as long as it takes)."""
        chan = self._session(command, timeout)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        return self._finish(chan, command, timeout)

    def stream_in(self, command: str, chunks: Iterable[bytes], on_bytes: Callable[[int], None], *,
                  changes: bool = True, timeout: float | None = STALL_S, finish: float | None = None) -> Result:
        """timeout: how long the far end may take no byte (each send), not the whole; finish: how long the command
        may then run in all once its input ended, however it trickles output (None: timeout). What breaks here (chunks that cannot be
        read) is raised, with the channel closed, not blamed on the host."""
        chan = self._session(command, timeout)
        try:
            for chunk in chunks:
                try:
                    chan.sendall(chunk)
                except socket.timeout:
                    chan.close()
                    return Result(self.host, command, 124, "", f"timed out: the host took nothing for {timeout:g} s")
                except OSError:
                    break  # the far end stopped reading: its exit status and stderr say why
                on_bytes(len(chunk))
            chan.shutdown_write()
            return self._finish(chan, command, timeout if finish is None else finish)
        except BaseException:
            chan.close()
            raise

    def stream_out(self, command: str, on_line: Callable[[str], None], *, stdin: bytes | None = None) -> int:
        """Run command (given stdin), handing each line of its output (stderr merged) to on_line; its exit code."""
        chan = self._session(f"{command} 2>&1", None)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()
        for line in read_lines(Lines(), chan.recv):
            on_line(line)
        return chan.recv_exit_status()

    def converse(self, command: str, silence: float) -> "SshConversation":
        return SshConversation(self.host, command, self._session(command, silence))

    def read_out(self, command: str, silence: float) -> "SshReading":
        chan = self._session(command, silence)
        chan.shutdown_write()
        return SshReading(self.host, command, chan)

    def interact(self, command: str, *, stdin: IO[bytes] | None, stdout: IO[bytes], stderr: IO[bytes],
                 tty: bool = False) -> int:
        """Run command with stdin passed through (None: no input), its stdout and stderr written to ours byte for byte;
        tty: on a pseudo-terminal of its own (`docker exec -t` needs one there), ours raw meanwhile, as ssh -t does.
        No bound on its time (it is the user's command); its exit code (-1: the connection ended without one)."""
        if not self.conn.is_connected:
            self.open()
        chan = self.conn.transport.open_session(timeout=self.timeout)
        if tty:
            size = shutil.get_terminal_size()
            chan.get_pty(term=os.environ.get("TERM", "xterm"), width=size.columns, height=size.lines)
            # The host's terminal passes bytes as they are: the command's own (docker exec -t's) does the work, as on
            # one machine; else each line would end \r\r\n and Ctrl-C would stop docker, not the command.
            command = f"stty raw -echo 2>/dev/null; {command}"
        chan.exec_command(self._wrap(command))
        if stdin is None:
            chan.shutdown_write()
        try:
            with _raw(stdin if tty else None), _following_size(chan if tty else None):
                _pump(chan, stdin, stdout, stderr)
            chan.status_event.wait(10)
            return chan.recv_exit_status() if chan.exit_status_ready() else -1
        finally:
            chan.close()

    def _finish(self, chan: paramiko.Channel, command: str, seconds: float | None) -> Result:
        """Its output (the head of stdout, the tail of stderr) and exit status, within `seconds` in all (None: no
        bound): a command that trickles output is stopped at that time as one that says nothing is."""
        deadline = None if seconds is None else time.monotonic() + seconds
        out, err = Head(), Tail()
        reader = threading.Thread(target=err.drain, args=(_stderr_of(chan, deadline),), daemon=True)
        reader.start()
        try:
            out.drain(_until(chan, chan.recv, deadline))
            reader.join(None if deadline is None else max(deadline - time.monotonic(), 0))
            if reader.is_alive() or not chan.status_event.wait(None if deadline is None else
                                                               max(deadline - time.monotonic(), 0)):
                raise socket.timeout
            code = chan.recv_exit_status()
        except socket.timeout:
            chan.close()
            return Result(self.host, command, 124, out.text(), f"timed out: it did not end within {seconds:g} s")
        return Result(self.host, command, code, out.text(), err.text(), out.left_out)

    def close(self) -> None:
        self.closed = True
        self.conn.close()


def _until(chan: paramiko.Channel, recv: Callable[[int], bytes], deadline: float | None) -> Callable[[int], bytes]:
    """recv that raises socket.timeout once the deadline (None: none) has passed, however the far end trickles."""
    def read(size: int) -> bytes:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout
            chan.settimeout(left)
        return recv(size)
    return read


def _stderr_of(chan: paramiko.Channel, deadline: float | None = None) -> Callable[[int], bytes]:
    """recv_stderr that says b"" (its end) once the channel closed or the deadline passed: the channel's timeout is
    for stdout, and stderr may be quiet for long."""
    def read(size: int) -> bytes:
        while True:
            try:
                return chan.recv_stderr(size)
            except socket.timeout:
                if chan.closed or (deadline is not None and time.monotonic() > deadline):
                    return b""
            except (OSError, EOFError):
                return b""
    return read


class SshConversation:
    """Runner.converse over one SSH channel; its stderr is read beside, for the result."""

    def __init__(self, host: str, command: str, chan: paramiko.Channel) -> None:
        self.host, self.command, self.chan, self.err = host, command, chan, Tail()
        self.said = Lines()  # what is left of its lines between two calls of lines()
        self.reader = threading.Thread(target=self.err.drain, args=(_stderr_of(chan),), daemon=True)
        self.reader.start()

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)  # socket.timeout is an OSError

    def end_input(self) -> None:
        self.chan.shutdown_write()

    def quiet(self, silence: float | None) -> None:
        self.chan.settimeout(silence)

    def lines(self, kept: int = LINE_KEPT) -> Iterator[str]:
        self.said.keep(kept)
        return read_lines(self.said, self.read)

    def read(self, size: int = -1) -> bytes:
        try:
            return self.chan.recv(size if size > 0 else CHUNK)
        except socket.timeout:
            raise TimeoutError from None

    def result(self) -> Result:
        """Its exit status may come a moment after the end of its output: waited for, within a bound."""
        self.chan.status_event.wait(10)
        self.reader.join(5)
        code = self.chan.recv_exit_status() if self.chan.exit_status_ready() else -1
        return Result(self.host, self.command, code, "", self.err.text())

    def close(self) -> None:
        self.chan.close()


class SshReading(SshConversation):
    """Runner.read_out over one SSH channel: its stdout as bytes (read)."""


def _pump(chan: paramiko.Channel, stdin: IO[bytes] | None, stdout: IO[bytes], stderr: IO[bytes]) -> None:
    """stdout and stderr from the channel to ours as they come (a thread each); our stdin to it until its end."""
    chan.settimeout(None)

    def drain(recv: Callable[[int], bytes], sink: IO[bytes]) -> None:
        try:
            while data := recv(1 << 15):
                sink.write(data)
                sink.flush()
        except OSError:  # our side closed (`kit exec ... | head`): stop reading
            chan.close()
    readers = [threading.Thread(target=drain, args=(chan.recv, stdout), daemon=True),
               threading.Thread(target=drain, args=(chan.recv_stderr, stderr), daemon=True)]
    for r in readers:
        r.start()
    fd = stdin.fileno() if stdin is not None else None
    while fd is not None and readers[0].is_alive():
        if select.select([fd], [], [], 0.2)[0]:
            data = os.read(fd, 1 << 15)
            try:
                if data:
                    chan.sendall(data)
                else:  # our input ended: so does its
                    chan.shutdown_write()
                    fd = None
            except OSError:  # it no longer takes input (it ended): what it said is still read
                fd = None
    for r in readers:
        r.join()


@contextlib.contextmanager
def _raw(stdin: IO[bytes] | None):
    """Our terminal in raw mode (every key goes to the far end's terminal as it is), restored afterwards."""
    if stdin is None or not stdin.isatty():
        yield
        return
    fd = stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        terminal.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _following_size(chan: paramiko.Channel | None):
    """The far end's terminal takes the size of ours when it changes."""
    if chan is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGWINCH, lambda *_: chan.resize_pty(*shutil.get_terminal_size()))
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, before)
