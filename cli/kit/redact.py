"""What kit prints or keeps of text that may hold a credential: one redaction for every message kit shows from a
package index, pip, a registry or the engine.

URLs go by an allow-list of shapes, not a search for secrets: a URL is shown as it is only when it is harmless (no
user, query or fragment; plain path words), else as `scheme://host/****`. Around URLs, credentials go by their key,
whatever the case: an Authorization header's value (Basic, Bearer, AWS4-HMAC-SHA256, ...), `password=`, `token:`,
JSON's `"auth": "..."`, a pre-signed URL's signature, and the tokens whose shape gives them away (a JWT, GitHub's,
GitLab's, Docker Hub's, an AWS key id).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

HIDDEN = "****"

# What kit lets into an image or onto a printed line of a URL: an allow-list of shapes, not a search for secrets.
# Lab indexes put tokens in the path (https://host/<token>/org/repo/python/simple/), in the query (?access_token=,
# pre-signed X-Amz-Signature=...) and before the host (user:password@): a URL is harmless only when it has no
# user, no query, no fragment and every path segment is plain: words of letters or digits joined by . _ - ~ +
# (devpi's +simple, Azure's _packaging; GitLab's lone -), none of them token-like (below). A git+ URL may end in
# @<revision>: a tag word or a commit.
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]+\]")
_SEGMENT = re.compile(r"[+_]?[A-Za-z0-9]+(?:[._~+-]+[A-Za-z0-9]+)*[._~+-]?|-")
_COMMIT = re.compile(r"[0-9a-f]{7,40}")


def _token_like(word: str) -> bool:
    """A token, a key or a hash rather than a name: 10 characters or more with a digit or both cases in it
    (cu128, py3, simple and artifactory are names; a1b2c3d4e5, AbCdEfGhIj and 40 hex digits are not), or over 24."""
    if len(word) > 24:
        return True
    return len(word) >= 10 and (any(c.isdigit() for c in word) or (word.lower() != word and word.upper() != word))


def _plain_segment(segment: str) -> bool:
    return bool(_SEGMENT.fullmatch(segment)) and not any(_token_like(w) for w in re.split(r"[._~+-]+", segment) if w)


def _plain_path(path: str, vcs: bool) -> bool:
    segments = path.split("/")
    if vcs and "@" in segments[-1]:  # git+https://host/org/repo@v1.2 or @<commit>: pip's revision
        segments[-1], _, revision = segments[-1].rpartition("@")
        if not (_COMMIT.fullmatch(revision) or _plain_segment(revision)):
            return False
    return all(s == "" or _plain_segment(s) for s in segments)


def harmless(url: str) -> bool:
    """Whether a URL may reach an image or a printed line as it is (the allow-list above)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a netloc that is not host[:port]
    except ValueError:
        return False
    return (bool(re.fullmatch(r"[a-z][a-z0-9+.-]*", parts.scheme)) and "@" not in parts.netloc
            and not parts.query and not parts.fragment and "?" not in url and "#" not in url
            and (parts.hostname is None or bool(_HOST.fullmatch(parts.netloc.rpartition(":")[0] if parts.port
                                                                else parts.netloc)))
            and _plain_path(parts.path, parts.scheme.startswith("git+")))


def redact(url: str) -> str:
    """A URL fit to print, the one function every printer of a source uses: whatever stands before the host's `@`
    (user and password, or a token) is shown as ****, and so are the path, query and fragment unless the URL is
    harmless (see harmless). Fails closed: a URL it cannot take apart is shown as its scheme and ****."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # a bare path, or a proxy written as user:password@host:port
        return "****@" + url.rpartition("@")[2] if "@" in url else url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a netloc that is not host[:port]
    except ValueError:
        return f"{scheme}://****"
    host = parts.netloc.rpartition("@")[2]
    netloc = ("****@" if "@" in parts.netloc else "") + host
    if harmless(urlunsplit(parts._replace(netloc=host))):
        return urlunsplit(parts._replace(netloc=netloc))
    return f"{parts.scheme}://{netloc}/****"


# A URL in a message: up to a space or a quote; punctuation that ends a sentence stays outside it.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"`<>]+")


def _urls(message: str) -> str:
    """Every URL in a message as redact shows it."""
    def one(m: re.Match) -> str:
        url = m[0].rstrip(".,;:)]}")
        return redact(url) + m[0][len(url):]
    return _URL_IN_TEXT.sub(one, message)


def has_credentials(url: str) -> bool:
    """A user or password before the host (or a URL that cannot be taken apart): kit.yaml refuses those."""
    if "://" not in url:
        return "@" in url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a netloc that is not host[:port]
    except ValueError:
        return True
    return "@" in parts.netloc


# A credential named by its key: `key=value`, `key: value`, `"key": "value"`, whatever the case, the key alone or
# the last word of a name (`DOCKER_PASSWORD=`, `NPM_TOKEN=`, `X-Auth-Token:`). The value runs to a
# space, a quote or a closing brace, or to a comma, `;` or `&` that ends it (one a space, a quote or the end follows:
# `Credential=..., Signature=...`; `password=ab,cd` is hidden whole), an Authorization header's with its scheme word;
# a quoted one, to its closing quote.
_KEYS = (r"authorization|proxy-authorization|auth|password|passwd|pwd|secret|client_secret|token|access_token|"
         r"refresh_token|id_token|identitytoken|registrytoken|private[-_]token|job[-_]token|(?:x-)?api[-_]?key|"
         r"x-registry-auth|aws_secret_access_key|secret_access_key|aws_session_token|session_token|"
         r"x-jfrog-art-api|x-amz-signature|x-amz-credential|x-amz-security-token|signature|sig|"
         r"x-goog-signature|x-goog-credential")
_KEYED = re.compile(r"(?P<key>(?<![A-Za-z0-9_-])[\"']?(?:[A-Za-z0-9]+[_-])*(?i:" + _KEYS + r")[\"']?\s*[:=]\s*)"
                    r"(?P<quote>[\"'])?"
                    r"(?:(?P<scheme>(?i:basic|bearer|token|digest|negotiate|aws4-hmac-sha256))\s+)?"
                    r"(?P<value>(?(quote)[^\"']+|(?:[^\s\"',;&}]|[,;&](?=[^\s\"'}]))+))")  # quoted: all of it
# Bare credentials: a header's scheme and its value anywhere, and tokens whose shape gives them away.
_BARE = re.compile(r"\b(?P<scheme>(?i:basic|bearer))\s+[A-Za-z0-9._~+/=-]{8,}|"
                   r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*|"          # a JWT
                   r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}|"
                   r"dckr_pat_[A-Za-z0-9_-]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16})\b")


def text(message: str) -> str:
    """A message fit to print: every URL as redact shows it, then every credential by its key or its shape."""
    def keyed(m: re.Match) -> str:
        scheme = f"{m['scheme']} " if m["scheme"] else ""
        return f"{m['key']}{m['quote'] or ''}{scheme}{HIDDEN}"

    def bare(m: re.Match) -> str:
        return f"{m['scheme']} {HIDDEN}" if m["scheme"] else HIDDEN

    return _BARE.sub(bare, _KEYED.sub(keyed, _urls(message)))
