"""hosts.txt -> [Host]. Pure: reads text, raises BadInput naming file:line.

Accepts the forms people already use, one host a line:

    node-1                  # one slot (or one per GPU for the gpu flavor)
    node-2:4                # Horovod's host:slots
    node-3 slots=4          # MPI / DeepSpeed hostfile (max_slots= is accepted and ignored)
    alice@node-4 port=2222  # login user, and the host's own sshd port
    node-5 primary          # the primary; otherwise the first host is
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from pathlib import Path

from kit.errors import BadInput, read_input

FORMS = "expected `host`, `host:slots`, `host slots=N`, `user@host`, `port=N` or `primary`, e.g. node-1:4"

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
_SPEC = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s]+)(?::(?P<slots>[^:\s]*))?$")


@dataclass(frozen=True)
class Host:
    name: str                 # as written, without user and slots: how the user's SSH reaches it
    slots: int | None = None  # None: decided by the flavor (1, or one per GPU)
    user: str | None = None
    port: int | None = None   # the host's own sshd; None: the user's ssh config or 22
    primary: bool = False
    line: int = 0
    local: bool = False       # a container of the local cluster on this machine: reached without SSH

    @property
    def label(self) -> str:
        return self.name if self.port in (None, 22) else f"{self.name}:{self.port}"


def _bad(where: str, message: str) -> BadInput:
    return BadInput(f"{where}: {message}", hint=FORMS)


def _number(where: str, what: str, text: str, low: int, high: int) -> int:
    if not re.fullmatch(r"\d+", text) or not low <= int(text) <= high:
        raise _bad(where, f"{what} must be a whole number from {low} to {high}, not '{text}'")
    return int(text)


def _host_name(where: str, text: str) -> str:
    if text.startswith("["):
        try:
            ipaddress.IPv6Address(text[1:-1])
            return text[1:-1]
        except ValueError:
            raise _bad(where, f"'{text}' is not an IPv6 address") from None
    try:
        ipaddress.IPv4Address(text)
        return text
    except ValueError:
        pass
    if re.fullmatch(r"[\d.]+", text) or not _HOSTNAME.match(text):
        raise _bad(where, f"'{text}' is not a host name or address")
    return text


def parse_line(where: str, text: str, line: int) -> Host | None:
    tokens = text.split("#", 1)[0].split()
    if not tokens:
        return None
    m = _SPEC.match(tokens[0])
    if not m:
        raise _bad(where, f"cannot read '{tokens[0]}'")
    fields: dict = {"name": _host_name(where, m["host"]), "line": line}
    if m["user"] is not None:
        if not _USER.match(m["user"]):
            raise _bad(where, f"'{m['user']}' is not a user name")
        fields["user"] = m["user"]
    if m["slots"] is not None:
        fields["slots"] = _number(where, "slots", m["slots"], 1, 1024)
    for token in tokens[1:]:
        _option(where, token, fields)
    return Host(**fields)


def _option(where: str, token: str, fields: dict) -> None:
    key, eq, value = token.partition("=")
    if token == "primary":
        fields["primary"] = True
    elif key == "slots" and eq:
        if "slots" in fields:
            raise _bad(where, "slots are given twice")
        fields["slots"] = _number(where, "slots", value, 1, 1024)
    elif key == "max_slots" and eq:
        _number(where, "max_slots", value, 1, 1024)  # MPI's oversubscription cap: kit never oversubscribes
    elif key == "port" and eq:
        fields["port"] = _number(where, "port", value, 1, 65535)
    else:
        raise _bad(where, f"unknown option '{token}'")


def parse_hosts(text: str, path: str = "hosts.txt") -> list[Host]:
    hosts: list[Host] = []
    seen: dict[tuple[str, int | None], int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        where = f"{path}:{number}"
        host = parse_line(where, raw, number)
        if host is None:
            continue
        key = (host.name, host.port)
        if key in seen:
            raise BadInput(f"{where}: {host.label} is listed twice (first on line {seen[key]})",
                           hint="list each host once; give it more slots instead, e.g. node-1:4")
        seen[key] = number
        hosts.append(host)
    if not hosts:
        raise BadInput(f"{path}: no hosts", hint=f"write one host a line; {FORMS}")
    primaries = [h for h in hosts if h.primary]
    if len(primaries) > 1:
        raise BadInput(f"{path}:{primaries[1].line}: a second primary (the first is on line {primaries[0].line})",
                       hint="mark one host `primary`, or none to make the first host the primary")
    first = primaries[0] if primaries else hosts[0]
    return [replace(first, primary=True)] + [h for h in hosts if h is not first]


def read_hosts(path: Path) -> list[Host]:
    """The inventory, primary first."""
    text = read_input(path, "hosts file", hint="pass --hosts with a file listing one host a line")
    return parse_hosts(text, str(path))
