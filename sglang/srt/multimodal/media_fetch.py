"""Fetching images from http(s) URLs, with a wall-clock timeout and a byte cap.

Blocking by design: callers run it in worker threads, never on an event loop. Every failure raises
:class:`MediaFetchError` (an :class:`ImageLoadError`, so the API answers 400) naming the URL and the
problem (timeout, too large, HTTP status, connection error).
"""

from __future__ import annotations

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


def fetch_url_bytes(url: str, *, timeout: float, max_bytes: int) -> bytes:
    """GET `url` and return the body; the whole transfer must finish within `timeout` seconds and
    the body must not exceed `max_bytes`."""
    url = url.strip()
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise MediaFetchError(f"invalid image URL {_short(url)!r}: expected http(s)://host/path")
    deadline = time.monotonic() + timeout
    req = urllib.request.Request(url, headers={"User-Agent": "sglang-media-fetch", "Accept": "image/*"})
    try:
        with _http_only_opener().open(req, timeout=timeout) as resp:
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


def _http_only_opener() -> urllib.request.OpenerDirector:
    """Like urlopen's opener minus the file:// and ftp:// handlers, so a redirect cannot reach them."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(),
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

    def __call__(self, url: str) -> bytes:
        return fetch_url_bytes(url, timeout=self.timeout, max_bytes=self.max_bytes)
