"""`kit prepare`: the Ansible playbooks against the lab hosts, in check mode."""

import re

import pytest

from helpers import run_kit

pytestmark = pytest.mark.lab


@pytest.mark.parametrize("storage", ["copy", "sshfs", "nfs"])
def test_playbooks_run_in_check_mode_on_the_lab_hosts(settings, lab, storage):
    r = run_kit("prepare", "--hosts", "hosts.txt", "--check", "--storage", storage, cwd=settings,
                env=lab.ansible_env, timeout=600)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    recap = dict(re.findall(r"^(\S+) +: ok=\d+ +changed=\d+ +unreachable=0 +failed=(\d+)", r.stdout, re.M))
    assert recap == {h.address: "0" for h in lab.hosts}, r.stdout[-3000:]
    assert "check mode: nothing was changed" in r.stdout
    assert not any(h.run_in("iptables", "-S", "INPUT", check=False).stdout.count("kit-lab") for h in lab.hosts)
