"""kit's SSH runner against a real sshd of its own on loopback (host key pinned in a known_hosts of a HOME made for
the test): what a stream of input to a command on a host does when the host is slow or this machine fails."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import closed_port, run_kit

from kit.errors import KitError
from kit.config.hosts import Host
from kit.runners.ssh import SshRunner

pytestmark = pytest.mark.alone  # timings of a few seconds: tests/run's other stream waits meanwhile



@pytest.fixture
def host(tmp_path, monkeypatch) -> Host:
    if os.geteuid() != 0:
        pytest.skip("sshd on a port of its own runs as root here")
    home, run, port = tmp_path / "home", tmp_path / "sshd", closed_port()
    (home / ".ssh").mkdir(parents=True)
    run.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh/id_ed25519")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(run / "host_key")], check=True)
    (run / "authorized_keys").write_text((home / ".ssh/id_ed25519.pub").read_text())
    (home / ".ssh/known_hosts").write_text(f"[127.0.0.1]:{port} {(run / 'host_key.pub').read_text()}")
    (run / "sshd_config").write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {run}/host_key\n"
                                     f"AuthorizedKeysFile {run}/authorized_keys\nPidFile {run}/sshd.pid\n"
                                     "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                                     "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(run / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("sshd did not listen within 10 s")
        yield Host("127.0.0.1", user="root", port=port)
    finally:
        sshd.terminate()
        sshd.wait(timeout=30)


def test_a_command_silent_after_its_input_is_waited_for_as_long_as_finish_says_not_the_send_stall(host):
    """docker load says nothing until the whole image is applied: minutes, beyond the stall allowed while sending."""
    runner = SshRunner(host)
    try:
        slow = "cat >/dev/null; sleep 3; echo loaded"
        r = runner.stream_in(slow, iter([b"x" * 100_000] * 3), lambda n: None, timeout=1, finish=30)
        assert (r.exit_code, r.stdout) == (0, "loaded\n")
        r = runner.stream_in(slow, iter([b"x" * 100_000]), lambda n: None, timeout=1)
        assert r.exit_code == 124 and "timed out" in r.stderr
    finally:
        runner.close()


def test_input_this_machine_cannot_read_is_raised_here_and_the_command_on_the_host_ends(host, tmp_path):
    """A layer in kit's cache that cannot be read is this machine's failure, not the host's; the command on the host
    sees its input end (docker load then keeps nothing) instead of waiting on an open channel."""
    seen = tmp_path / "seen"
    runner = SshRunner(host)

    def chunks():
        yield b"first part\n"
        raise OSError(5, "Input/output error", str(tmp_path / "layer.tar.gz"))
    try:
        with pytest.raises(OSError, match="Input/output error"):
            runner.stream_in(f"cat > {seen}; echo ended >> {seen}", chunks(), lambda n: None, timeout=5)
        for _ in range(100):
            if seen.exists() and seen.read_text().endswith("ended\n"):
                break
            time.sleep(0.1)
        assert seen.read_text() == "first part\nended\n"
    finally:
        runner.close()


def test_a_closed_runner_opens_no_new_connection(host):
    """Once kit closed it (Ctrl-C in the image step closes every host's), a thread that was about to start a command
    there gets an error instead of a new connection, and starts nothing."""
    runner = SshRunner(host)
    assert runner.run("true").ok
    runner.close()
    for start in (lambda: runner.run("true"), lambda: runner.converse("cat", silence=5),
                  lambda: runner.stream_in("cat", iter([b"x"]), lambda n: None)):
        with pytest.raises(KitError, match="kit had closed its connection"):
            start()
    assert not runner.conn.is_connected


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_a_conversation_keeps_only_the_end_of_what_its_command_says_on_stderr(request, kind):
    """What a container says on stderr can be the job's, and go on for ever (a follower's, a copy's): kit keeps the
    end of it, which says why the command failed, and no more."""
    from kit.runners.local import LocalRunner
    runner = LocalRunner("h") if kind == "local" else SshRunner(request.getfixturevalue("host"))
    try:
        talk = runner.converse("head -c 20000000 /dev/zero | tr '\\0' e >&2; echo 'the end' >&2; echo done; exit 3",
                               silence=60)
        assert list(talk.lines()) == ["done"]
        r = talk.result()
        assert r.exit_code == 3 and r.tail().endswith("the end") and len(r.stderr) <= 1 << 20
    finally:
        runner.close()


def refused(host: Host) -> KitError:
    runner = SshRunner(host)
    try:
        with pytest.raises(KitError) as e:
            runner.run("true")
        return e.value
    finally:
        runner.close()


def test_a_host_reached_through_an_ssh_config_alias_is_named_by_its_alias_and_port(host, tmp_path):
    """An alias of ~/.ssh/config with a HostName and a Port: its host key is the host's own, not a jump host's, and
    the fix is the ssh command that reaches it (the alias, which carries the port), or, for hosts.txt's `port=`, that
    port; `kit doctor` gives the same error and fix rather than "check that the host is up"."""
    home = Path(os.environ["HOME"])
    (home / ".ssh/config").write_text(f"Host lab-alias\n  HostName 127.0.0.1\n  Port {host.port}\n  User root\n")
    pinned = (home / ".ssh/known_hosts").read_text()
    (home / ".ssh/known_hosts").write_text("")
    e = refused(Host("lab-alias"))
    assert (e.host, e.message, e.hint) == (
        "lab-alias", f"the SSH host key of 127.0.0.1 (the HostName of lab-alias), port {host.port}, is not in your "
                     "known_hosts, so it cannot be verified",
        "run `ssh lab-alias` once and check the fingerprint it shows")
    e = refused(Host("127.0.0.1", user="root", port=host.port))
    assert e.hint == f"run `ssh -p {host.port} root@127.0.0.1` once and check the fingerprint it shows"
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    (home / ".ssh/known_hosts").write_text(f"[127.0.0.1]:{host.port} {other.with_suffix('.pub').read_text()}")
    e = refused(Host("lab-alias"))
    assert "jump host" not in e.message and e.message.startswith(
        f"the SSH host key of 127.0.0.1 (the HostName of lab-alias), port {host.port}, does not match")
    assert e.hint.endswith(f"then `ssh-keygen -R '[127.0.0.1]:{host.port}'` and `ssh lab-alias` once")
    (home / ".ssh/known_hosts").write_text("")
    (tmp_path / "hosts.txt").write_text("lab-alias\n")
    r = run_kit("doctor", "--hosts", "hosts.txt", cwd=tmp_path, env={"KIT_HOME": str(tmp_path / "kit")})
    assert "Traceback" not in r.stdout + r.stderr
    assert "is not in your known_hosts" in r.stdout and "fix: run `ssh lab-alias` once" in r.stdout
    (home / ".ssh/known_hosts").write_text(pinned)
    assert SshRunner(Host("lab-alias")).run("true").ok


def test_a_port_that_answers_but_not_as_ssh_is_one_line_with_its_fix_and_no_traceback(tmp_path):
    """A web server on the port hosts.txt names (it answers SSH's greeting with a 400 and closes): paramiko's own
    thread logged ~20 lines of traceback before kit's error; now kit's one line says what answered, and how to name
    the SSH port."""
    import threading
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)

    def answer() -> None:
        for _ in range(8):  # (bounded: doctor and the runner below connect a few times at most)
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
    threading.Thread(target=answer, daemon=True).start()
    port = sock.getsockname()[1]
    try:
        e = refused(Host("127.0.0.1", port=port))
        assert e.message == f"port {port} of 127.0.0.1 answers, but not as an SSH server (it sent no SSH greeting)"
        assert e.hint == "name the host's SSH port: `host port=N` in hosts.txt, or Port in your ~/.ssh/config"
        (tmp_path / "hosts.txt").write_text(f"127.0.0.1 port={port}\n")
        r = run_kit("doctor", "--hosts", "hosts.txt", cwd=tmp_path, env={"KIT_HOME": str(tmp_path / "kit")})
        assert "Traceback" not in r.stdout + r.stderr and "Exception" not in r.stdout + r.stderr
        assert "answers, but not as an SSH server" in r.stdout and "fix: name the host's SSH port" in r.stdout
    finally:
        sock.close()
