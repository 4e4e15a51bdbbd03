"""Fetching images from http(s) URLs, with a wall-clock timeout, a byte cap and a host policy.

Host policy: a server must not become a proxy into its own network. By default a URL whose host
resolves to a loopback, private, link-local or otherwise non-global address is refused; with
`--allowed-media-domains` only those hosts (and their subdomains) are fetched, whatever they resolve
to. The check runs on the address each connection actually reached (after DNS, on every redirect),
so neither a redirect nor a DNS answer that changes between check and use gets around it.

Blocking by design: callers run it in worker threads, never on an event loop. Every failure raises
:class:`MediaFetchError` (an :class:`ImageLoadError`, so the API answers 400) naming the URL and the
problem (timeout, too large, HTTP status, connection error).
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from sglang.srt.multimodal.image_io import ImageLoadError

_READ_CHUNK = 1 << 16
_MAX_URL_IN_MESSAGE = 200


class MediaFetchError(ImageLoadError):
    """An image URL could not be fetched; the message says why."""


def is_http_url(source: object) -> bool:
    return isinstance(source, str) and source[:16].lstrip().lower().startswith(("http://", "https://"))


def _short(url: str) -> str:
    return url if len(url) <= _MAX_URL_IN_MESSAGE else url[:_MAX_URL_IN_MESSAGE] + "..."


@dataclass(frozen=True)
class HostPolicy:
    allowed_domains: tuple[str, ...] = ()  # empty: any public host
    allow_private: bool = False  # also fetch from loopback / private / link-local addresses

    def domain_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host == d or host.endswith("." + d) for d in self.allowed_domains)

    def check_host(self, host: str) -> None:
        if self.allowed_domains and not self.domain_allowed(host):
            raise MediaFetchError(
                f"image host {host!r} is not allowed: it is not in --allowed-media-domains "
                f"({', '.join(self.allowed_domains)})"
            )

    def check_peer(self, host: str, address: str) -> None:
        if self.allow_private or self.domain_allowed(host):
            return
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if getattr(ip, "ipv4_mapped", None):
            ip = ip.ipv4_mapped
        if not ip.is_global or ip.is_multicast:
            kind = "loopback" if ip.is_loopback else "link-local" if ip.is_link_local else "private or reserved"
            raise MediaFetchError(
                f"image host {host!r} resolves to the {kind} address {ip}, which is refused: a server must not "
                "fetch from its own network (allow it with --allowed-media-domains or --allow-private-media-urls)"
            )


def fetch_url_bytes(url: str, *, timeout: float, max_bytes: int, policy: HostPolicy = HostPolicy(),
                    accept: str = "image/*") -> bytes:
    """GET `url` and return the body; the whole transfer must finish within `timeout` seconds, the
    body must not exceed `max_bytes`, and every host connected to must pass `policy`."""
    url = url.strip()
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc or not parsed.hostname:
        raise MediaFetchError(f"invalid image URL {_short(url)!r}: expected http(s)://host/path")
    policy.check_host(parsed.hostname)
    deadline = time.monotonic() + timeout
    req = urllib.request.Request(url, headers={"User-Agent": "sglang-media-fetch", "Accept": accept})
    try:
        with _http_only_opener(policy).open(req, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                raise MediaFetchError(
                    f"image at {_short(url)} is too large: {int(length)} bytes exceeds the limit of "
                    f"{max_bytes} bytes (--media-max-bytes)"
                )
            chunks: list[bytes] = []
            total = 0
            while True:
                if time.monotonic() > deadline:
                    raise socket.timeout()
                chunk = resp.read(_READ_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > max_bytes:
                    raise MediaFetchError(
                        f"image at {_short(url)} is too large: more than {max_bytes} bytes "
                        "(--media-max-bytes)"
                    )
                chunks.append(chunk)
    except MediaFetchError:
        raise
    except urllib.error.HTTPError as e:
        raise MediaFetchError(f"fetching image {_short(url)} failed: HTTP {e.code} {e.reason}") from None
    except (socket.timeout, TimeoutError):
        raise MediaFetchError(
            f"fetching image {_short(url)} timed out after {timeout:g} s (--media-fetch-timeout)"
        ) from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, (socket.timeout, TimeoutError)):
            raise MediaFetchError(
                f"fetching image {_short(url)} timed out after {timeout:g} s (--media-fetch-timeout)"
            ) from None
        raise MediaFetchError(f"fetching image {_short(url)} failed: {e.reason}") from None
    except (OSError, ValueError) as e:
        raise MediaFetchError(f"fetching image {_short(url)} failed: {type(e).__name__}: {e}") from None
    return b"".join(chunks)


def _guarded(conn_cls, policy: HostPolicy):
    """A connection class that applies `policy` to the host it is asked for and to the address it
    actually reached, before any byte of the request is sent."""

    class Guarded(conn_cls):
        def connect(self):
            policy.check_host(self.host)
            super().connect()
            try:
                policy.check_peer(self.host, self.sock.getpeername()[0])
            except MediaFetchError:
                self.close()
                raise

    return Guarded


class _GuardedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, policy: HostPolicy):
        super().__init__()
        self._conn = _guarded(http.client.HTTPConnection, policy)

    def http_open(self, req):
        return self.do_open(self._conn, req)


class _GuardedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, policy: HostPolicy):
        super().__init__()
        self._conn = _guarded(http.client.HTTPSConnection, policy)

    def https_open(self, req):
        kw = {"context": self._context}
        if hasattr(self, "_check_hostname"):  # Python 3.11 passes it; 3.12 dropped the argument
            kw["check_hostname"] = self._check_hostname
        return self.do_open(self._conn, req, **kw)


def _http_only_opener(policy: HostPolicy) -> urllib.request.OpenerDirector:
    """Like urlopen's opener minus the file:// and ftp:// handlers (a redirect cannot reach them) and
    minus proxies (the policy must see the image host itself), with the host policy on every connection."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        _GuardedHTTPHandler(policy),
        _GuardedHTTPSHandler(policy),
        urllib.request.HTTPRedirectHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


@dataclass(frozen=True)
class MediaFetcher:
    """A configured fetcher, callable as `fetcher(url) -> bytes` (what `image_io.load_image` takes)."""

    timeout: float = 10.0
    max_bytes: int = 20 * 1024 * 1024
    policy: HostPolicy = HostPolicy()

    def __call__(self, url: str, kind: str = "image") -> bytes:
        """`kind` ("image" or "video") sets the Accept header and the word the errors use."""
        try:
            return fetch_url_bytes(url, timeout=self.timeout, max_bytes=self.max_bytes, policy=self.policy,
                                   accept=f"{kind}/*")
        except MediaFetchError as e:
            if kind == "image":
                raise
            raise MediaFetchError(str(e).replace("image", kind)) from None
