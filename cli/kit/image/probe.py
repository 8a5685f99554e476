"""Does a package source answer? Asked once, within a bound, before anything waits on it.

pip itself retries a silent index for minutes (its timeout times its retries);
kit asks every source first, all at once, and names the one that does not answer.
An HTTP answer of any kind (even 401, 404 or a redirect) counts as an answer: the
source is there, and pip reports what it says. Only no answer at all is a
failure. So the question carries no credential and follows no redirect: nothing
secret goes anywhere but through pip itself.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit, urlunsplit
from urllib.request import url2pathname

from kit.image.pipconfig import PipSettings

PROBE_S = 10
LOOKUP_SLACK_S = 5


def probe(url: str, settings: PipSettings, env: Mapping[str, str], timeout: float = PROBE_S) -> str | None:
    """None when the source answers; else why it does not, in words."""
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        path = Path(url2pathname(parts.path) if parts.scheme else url)
        return None if path.exists() else f"{path} does not exist"
    if parts.scheme not in ("http", "https"):
        return f"kit cannot reach a {parts.scheme}: source"
    try:
        request = urllib.request.Request(_without_credentials(url), method="HEAD")
        host = parts.hostname or ""
        with _opener(host, parts.netloc.rpartition("@")[2], settings, env).open(request, timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return None
    except (ValueError, http.client.HTTPException) as e:  # a URL urllib cannot use (e.g. a port that is no number)
        return f"not a URL kit can ask ({type(e).__name__})"
    except urllib.error.URLError as e:
        return _reason(e.reason, parts.hostname or "", timeout)
    except (TimeoutError, socket.timeout):
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return _reason(e, parts.hostname or "", timeout)
    return None


def probe_all(urls: list[str], settings: PipSettings, env: Mapping[str, str],
              timeout: float = PROBE_S) -> dict[str, str | None]:
    """Every source at once: {url: None or why it does not answer}. A name lookup does not heed the socket's
    timeout, so the whole is bounded too: a source still unanswered then is named as silent."""
    if not urls:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(len(urls), 16))
    futures = {u: pool.submit(probe, u, settings, env, timeout) for u in dict.fromkeys(urls)}
    wait(futures.values(), timeout=timeout + LOOKUP_SLACK_S)
    pool.shutdown(wait=False, cancel_futures=True)
    return {u: f.result() if f.done() else f"no answer within {timeout:g} s (its name lookup did not end)"
            for u, f in futures.items()}


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # urllib then raises HTTPError: the source answered


def _opener(host: str, netloc: str, settings: PipSettings, env: Mapping[str, str]) -> urllib.request.OpenerDirector:
    """TLS and proxy as pip would use them: its cert (or the CA variables), its trusted hosts, its proxy."""
    if host in settings.trusted_hosts or netloc in settings.trusted_hosts:
        context = ssl._create_unverified_context()  # pip's trusted-host: the user chose not to verify this host
    else:
        cafile = settings.cert or env.get("REQUESTS_CA_BUNDLE") or env.get("SSL_CERT_FILE")
        context = ssl.create_default_context(cafile=cafile if cafile and Path(cafile).is_file() else None)
    proxy = settings.proxy
    proxies = {"http": proxy, "https": proxy} if proxy else _env_proxies(env)
    return urllib.request.build_opener(urllib.request.ProxyHandler(proxies), _NoRedirect(),
                                       urllib.request.HTTPSHandler(context=context))


def _env_proxies(env: Mapping[str, str]) -> dict[str, str]:
    found = {}
    for scheme in ("http", "https"):  # no_proxy is read by urllib itself
        value = env.get(f"{scheme}_proxy") or env.get(f"{scheme.upper()}_PROXY")
        if value:
            found[scheme] = value
    return found


def _reason(reason: object, host: str, timeout: float) -> str:
    if isinstance(reason, socket.gaierror):
        return f"the name {host} does not resolve"
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"its TLS certificate is not trusted here ({reason.verify_message})"
    if isinstance(reason, ConnectionRefusedError):
        return "the connection was refused"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout:g} s"
    return str(reason)
