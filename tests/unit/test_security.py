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
