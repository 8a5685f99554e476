"""Host-key checking is never turned off anywhere in the product."""

import re

from helpers import REPO

PRODUCT = ["cli", "images", "templates", "ansible", "compose.yaml", "examples"]
DISABLING = re.compile(r"StrictHostKeyChecking[\s=]+(no|off|accept-new)|UserKnownHostsFile[\s=]+/dev/null|"
                       r"AutoAddPolicy\(|WarningPolicy\(", re.I)
PATCHING = "s/StrictHostKeyChecking=no/StrictHostKeyChecking=yes/"  # the line that turns Horovod's back on


def product_files():
    for name in PRODUCT:
        path = REPO / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []
        yield from (f for f in files if "__pycache__" not in f.parts)


def test_no_file_disables_host_key_checking():
    offenders = [f"{f.relative_to(REPO)}:{n}" for f in product_files()
                 for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
                 if DISABLING.search(line.replace(PATCHING, "")) and "grep -rn 'StrictHostKeyChecking=no'" not in line]
    assert offenders == []


def test_the_scan_sees_the_product():
    names = {f.name for f in product_files()}
    assert {"ssh.py", "ssh_config.j2", "sshd_config"} <= names


def test_every_jump_host_is_checked_like_the_host_itself(tmp_path, monkeypatch):
    """fabric makes ProxyJump hops with AutoAddPolicy (any key accepted) and no timeout; kit's runner does not."""
    import paramiko
    from fabric import Connection

    from kit.config.hosts import Host
    from kit.runners.ssh import SshRunner
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host target\n    ProxyJump root@hop2,root@hop1\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    runner = SshRunner(Host("target"), connect_timeout=7)
    assert runner.via == ["hop1", "hop2"]  # in the order fabric goes through them, the target's nearest last
    hop = runner.conn
    while isinstance(hop, Connection):
        assert isinstance(hop.client._policy, paramiko.RejectPolicy) and hop.connect_timeout == 7, hop.host
        hop = hop.gateway


def test_a_timed_out_ssh_command_reads_as_timed_out_not_a_thread_traceback():
    import socket
    import threading

    from kit.runners.ssh import SshRunner

    class Silent:
        """A paramiko channel whose host says nothing: every read times out."""

        closed = False

        def recv(self, size):
            raise socket.timeout("timed out")

        recv_stderr = recv

        def settimeout(self, seconds):
            pass

        def recv_exit_status(self):
            return -1

        def close(self):
            self.closed = True
    seen = []
    old, threading.excepthook = threading.excepthook, lambda args: seen.append(args.exc_type)
    try:
        runner = SshRunner.__new__(SshRunner)
        runner.host = "h2"
        r = runner._finish(Silent(), "sleep 600", 300)
    finally:
        threading.excepthook = old
    assert (r.exit_code, r.stderr) == (124, "timed out: it did not end within 300 s") and seen == []


SECURITY_PAGE = REPO / "SECURITY.md"
CITED = re.compile(r"`((?:unit|lab)/test_\w+\.py)((?:::\w+)?)`|`::(\w+)`")


def cited_tests() -> list[tuple[str, str]]:
    """(file, test or "") for each test SECURITY.md names; `::name` alone is of the file named before it."""
    found, last = [], None
    for m in CITED.finditer(SECURITY_PAGE.read_text()):
        if m[1]:
            last = m[1]
            found.append((last, m[2].removeprefix("::")))
        else:
            found.append((last, m[3]))
    return found


def test_every_test_the_security_page_cites_exists():
    """Each promise of SECURITY.md names the test that shows it: a test renamed or removed must not leave a promise
    that nothing shows."""
    cited = cited_tests()
    missing = [f"{file}::{name}" for file, name in cited
               if not (REPO / "tests" / file).is_file()
               or name and not re.search(rf"^def {name}\(", (REPO / "tests" / file).read_text(), re.M)]
    assert len(cited) > 30 and missing == []


def test_each_adversary_of_the_threat_model_has_its_promises():
    text = SECURITY_PAGE.read_text()
    for adversary in ("A hostile job", "Hostile output", "A stranger on the lab network", "A second user"):
        section = text.split(adversary, 1)[1].split("\n### ", 1)[0]
        assert "| kit promises | shown by |" in section, adversary
