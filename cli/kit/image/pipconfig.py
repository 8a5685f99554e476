"""This machine's own pip configuration: where it finds Python packages, and how.

kit resolves an image's wheels here, with this machine's pip, so that proxies,
mirrors, local file:// indexes, find-links folders, constraints, CA bundles and
credentials work exactly as they do for `pip install` on this machine; the
image build then needs no network and sees no credential.

pip finds and merges its own configuration files (global, user, site,
PIP_CONFIG_FILE) and reads PIP_* variables; `pip config list` shows the result.
kit only applies the order pip applies for `pip download` on top of that: a
key in [global] is overridden by the same key in [download], and both by a
PIP_* variable. Explicit settings of kit.yaml then win over all of them.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from kit.errors import KitError
from kit.redact import redact

PYPI = "https://pypi.org/simple"
# Sections pip reads for `pip download`, weakest first; ":env:" holds the PIP_* variables.
DOWNLOAD_ORDER = ("global", "download", ":env:")
_LINE = re.compile(r"^(?P<section>[^.=\s]+)\.(?P<key>[^=\s]+)=(?P<value>.*)$")
_TRUE = {"1", "true", "yes", "on", "y", "t"}  # pip's strtobool
# Keys that name no package source and would only confuse a resolution run for another machine.
_IGNORED = {"config-file", "target", "prefix", "root", "user", "src", "require-virtualenv"}


def parse_config_list(text: str) -> dict[tuple[str, str], str]:
    """`pip config list` output -> {(section, key): value}. Values are printed as Python string literals."""
    found = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        try:
            value = ast.literal_eval(m["value"])
        except (ValueError, SyntaxError):
            value = m["value"]
        found[(m["section"], m["key"])] = str(value)
    return found


def for_download(items: Mapping[tuple[str, str], str]) -> dict[str, str]:
    """The value of each key as `pip download` sees it: [global] < [download] < PIP_* variables."""
    values: dict[str, str] = {}
    for section in DOWNLOAD_ORDER:
        for (where, key), value in items.items():
            # pip skips an empty value: it does not override the same key of a weaker section.
            if where == section and key not in _IGNORED and value.strip():
                values[_canonical(key)] = " ".join(value.split()) if "\n" in value else value
    return values


def _canonical(key: str) -> str:
    # PIP_DEFAULT_TIMEOUT and `timeout` are one option of pip's (--timeout, alias --default-timeout).
    return "timeout" if key == "default-timeout" else key


def _words(value: str | None) -> tuple[str, ...]:
    return tuple(value.split()) if value else ()


@dataclass(frozen=True)
class PipSettings:
    """pip's settings for `pip download` on this machine (key -> value, as in pip.conf), and where they came from."""

    values: dict[str, str] = field(default_factory=dict)
    overridden: tuple[str, ...] = ()  # keys that kit.yaml set, for the summary

    @property
    def no_index(self) -> bool:
        return self.values.get("no-index", "").strip().lower() in _TRUE

    @property
    def index_url(self) -> str | None:
        return None if self.no_index else self.values.get("index-url") or PYPI

    @property
    def extra_index_urls(self) -> tuple[str, ...]:
        return () if self.no_index else _words(self.values.get("extra-index-url"))

    @property
    def indexes(self) -> tuple[str, ...]:
        return ((self.index_url,) if self.index_url else ()) + self.extra_index_urls

    @property
    def find_links(self) -> tuple[str, ...]:
        return _words(self.values.get("find-links"))

    @property
    def constraints(self) -> tuple[str, ...]:
        return _words(self.values.get("constraint"))

    @property
    def trusted_hosts(self) -> tuple[str, ...]:
        return _words(self.values.get("trusted-host"))

    @property
    def cert(self) -> str | None:
        return self.values.get("cert") or None

    @property
    def proxy(self) -> str | None:
        return self.values.get("proxy") or None

    def with_overrides(self, *, index_urls: tuple[str, ...] = (), extra_index_urls: tuple[str, ...] = (),
                       find_links: tuple[str, ...] = ()) -> "PipSettings":
        """kit.yaml's explicit sources on top: its index URLs replace pip's indexes; its extra indexes
        (torch's) and find-links folders (a wheelhouse) are added to pip's."""
        values, overridden = dict(self.values), list(self.overridden)
        if index_urls:
            values.update({"index-url": index_urls[0], "extra-index-url": " ".join(index_urls[1:]), "no-index": ""})
            overridden += ["index-url", "extra-index-url"]
        if extra_index_urls and not self.no_index:
            values["extra-index-url"] = " ".join(dict.fromkeys(_words(values.get("extra-index-url")) + extra_index_urls))
        if find_links:
            values["find-links"] = " ".join(dict.fromkeys(find_links + _words(values.get("find-links"))))
            overridden.append("find-links")
        return PipSettings(values, tuple(dict.fromkeys(overridden)))

    def config_file(self) -> str:
        """A pip.conf that says all of it, read by the resolution's own pip run (PIP_CONFIG_FILE). The same
        values go in [download] too: a [download] section of another file must not win over kit.yaml."""
        body = "".join(f"{key} = {' '.join(value.split())}\n" for key, value in sorted(self.values.items()))
        return f"[global]\n{body}\n[download]\n{body}"

    def describe(self) -> list[str]:
        """What a user needs to recognise the sources, credentials hidden."""
        parts = []
        if self.no_index:
            parts.append("no index (no-index)")
        else:
            default = "" if self.values.get("index-url") else " (pip's default)"
            parts.append(f"index {redact(self.index_url or '')}{default}")
            if self.extra_index_urls:
                parts.append("extra " + ", ".join(redact(u) for u in self.extra_index_urls))
        if self.find_links:
            parts.append("find-links " + ", ".join(redact(u) for u in self.find_links))
        if self.constraints:
            parts.append("constraints " + ", ".join(redact(c) for c in self.constraints))
        if self.trusted_hosts:
            parts.append("trusted hosts " + ", ".join(self.trusted_hosts))
        if self.proxy:
            parts.append(f"proxy {redact(self.proxy)}")
        if self.cert:
            parts.append(f"CA {self.cert}")
        return parts


Run = Callable[..., subprocess.CompletedProcess]


def read(python: str = sys.executable, env: Mapping[str, str] | None = None, run: Run = subprocess.run) -> PipSettings:
    """Ask this machine's pip (the one kit runs with) for its configuration, as `pip download` would use it."""
    argv = [python, "-m", "pip", "config", "list"]
    try:
        done = run(argv, capture_output=True, text=True, timeout=60, env=dict(env if env is not None else os.environ))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KitError(f"cannot ask pip for its configuration ({e})", command=" ".join(argv),
                       hint="kit resolves the image's Python packages with its own pip: reinstall kit "
                            "with pip in its environment") from None
    if done.returncode != 0:
        raise KitError("cannot ask pip for its configuration", command=" ".join(argv),
                       output_tail="\n".join(done.stderr.strip().splitlines()[-10:]),
                       hint="fix pip's configuration files (pip config debug lists them)")
    return PipSettings(for_download(parse_config_list(done.stdout)))


def ca_file(settings: PipSettings, env: Mapping[str, str]) -> Path | None:
    """The CA bundle this machine's pip trusts: its `cert`, else REQUESTS_CA_BUNDLE, else SSL_CERT_FILE."""
    for candidate in (settings.cert, env.get("REQUESTS_CA_BUNDLE"), env.get("SSL_CERT_FILE")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def run_env(env: Mapping[str, str], config_file: Path) -> dict[str, str]:
    """The environment of kit's own pip run: PIP_* variables are already folded into config_file."""
    clean = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    return {**clean, "PIP_CONFIG_FILE": str(config_file)}
