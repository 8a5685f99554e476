"""hosts.txt in the forms people use; every mistake named by file:line with the expected form."""

import pytest

from kit.errors import BadInput
from kit.config.hosts import FORMS, Host, parse_hosts


def test_every_accepted_form():
    hosts = parse_hosts("""\
# the lab
node-1
node-2:4                # Horovod's host:slots
node-3 slots=2 max_slots=8
alice@node-4 port=2222
10.0.0.5
[fe80::1]:2
""")
    assert hosts == [
        Host("node-1", primary=True, line=2),
        Host("node-2", slots=4, line=3),
        Host("node-3", slots=2, line=4),
        Host("alice@node-4".split("@")[1], user="alice", port=2222, line=5),
        Host("10.0.0.5", line=6),
        Host("fe80::1", slots=2, line=7),
    ]


def test_a_marked_primary_comes_first():
    hosts = parse_hosts("a\nb primary\nc\n")
    assert [(h.name, h.primary) for h in hosts] == [("b", True), ("a", False), ("c", False)]


def test_same_name_on_another_ssh_port_is_another_host():
    assert len(parse_hosts("gateway port=2201\ngateway port=2202\n")) == 2


BAD = [
    ("", "hosts.txt: no hosts"),
    ("# only a comment\n\n", "hosts.txt: no hosts"),
    ("node-1:0\n", "hosts.txt:1: slots must be a whole number from 1 to 1024, not '0'"),
    ("node-1:x\n", "hosts.txt:1: slots must be a whole number from 1 to 1024, not 'x'"),
    ("node-1:\n", "hosts.txt:1: slots must be a whole number from 1 to 1024, not ''"),
    ("node-1 slots=-2\n", "hosts.txt:1: slots must be a whole number from 1 to 1024, not '-2'"),
    ("a\nnode-1:2 slots=3\n", "hosts.txt:2: slots are given twice"),
    ("node-1 port=70000\n", "hosts.txt:1: port must be a whole number from 1 to 65535, not '70000'"),
    ("node-1 gpus=4\n", "hosts.txt:1: unknown option 'gpus=4'"),
    ("node-1 main\n", "hosts.txt:1: unknown option 'main'"),
    ("node_1\n", "hosts.txt:1: 'node_1' is not a host name or address"),
    ("999.1.1.1\n", "hosts.txt:1: '999.1.1.1' is not a host name or address"),
    ("[zz::1]\n", "hosts.txt:1: '[zz::1]' is not an IPv6 address"),
    ("Bob Smith@node-1\n", "hosts.txt:1: unknown option 'Smith@node-1'"),
    ("Bob@node-1\n", "hosts.txt:1: 'Bob' is not a user name"),
    ("a:1:2\n", "hosts.txt:1: cannot read 'a:1:2'"),
    ("a\nb\na:2\n", "hosts.txt:3: a is listed twice (first on line 1)"),
    ("a primary\nb primary\n", "hosts.txt:2: a second primary (the first is on line 1)"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[b[1] for b in BAD])
def test_mistakes_name_the_line(text, message):
    with pytest.raises(BadInput) as e:
        parse_hosts(text)
    assert str(e.value) == message
    assert e.value.exit_code == 2 and e.value.hint


def test_form_hint_shows_an_example():
    with pytest.raises(BadInput) as e:
        parse_hosts("node-1:0\n")
    assert e.value.hint == FORMS and "node-1:4" in FORMS
