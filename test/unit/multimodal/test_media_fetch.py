"""http(s) image fetching against a local server on 127.0.0.1: body cap, timeout, HTTP errors, and
`load_image` using the fetcher."""

from __future__ import annotations

import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from sglang.srt.multimodal.image_io import ImageLoadError, load_image
from sglang.srt.multimodal.media_fetch import HostPolicy, MediaFetcher, MediaFetchError, fetch_url_bytes, is_http_url

# The test server lives on loopback, which the default policy refuses: these tests allow it by name.
LOCAL = HostPolicy(allowed_domains=("127.0.0.1",))


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20, 10), (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def http_url():
    png = _png()
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self):  # noqa: N802
            if self.path == "/slow":
                release.wait(5)
            if self.path == "/trickle":  # no Content-Length, body larger than the cap
                self.send_response(200)
                self.end_headers()
                for _ in range(20):
                    self.wfile.write(b"x" * 1000)
                return
            if self.path.startswith("/redirect-to-localhost"):  # same server, another (not allowed) name
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/img.png")
                self.end_headers()
                return
            if self.path == "/to-file":
                self.send_response(302)
                self.send_header("Location", "file:///etc/hostname")
                self.end_headers()
                return
            bodies = {"/img.png": png, "/slow": png, "/big": b"\0" * 5000}
            if self.path not in bodies:
                self.send_error(404, "Not Found")
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(bodies[self.path])))
            self.end_headers()
            self.wfile.write(bodies[self.path])

        def log_message(self, *args):
            pass

    class Quiet(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass

    httpd = Quiet(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    release.set()
    httpd.shutdown()
    httpd.server_close()


def test_fetch_ok_and_load_image_with_fetcher(http_url):
    assert fetch_url_bytes(http_url + "/img.png", timeout=5, max_bytes=10_000, policy=LOCAL) == _png()
    img = load_image(http_url + "/img.png", fetcher=MediaFetcher(timeout=5, max_bytes=10_000, policy=LOCAL))
    assert img.size == (20, 10) and img.mode == "RGB"


def test_load_image_refuses_urls_without_fetcher():
    with pytest.raises(ImageLoadError, match="http"):
        load_image("http://127.0.0.1:1/x.png")


@pytest.mark.parametrize(
    "path, max_bytes, match",
    [
        ("/missing", 10_000, "HTTP 404"),
        ("/big", 1000, "too large: 5000 bytes"),
        ("/trickle", 1000, "more than 1000 bytes"),
        ("/to-file", 10_000, "HTTP 302"),  # redirects never leave http(s)
    ],
)
def test_fetch_errors_name_the_problem(http_url, path, max_bytes, match):
    with pytest.raises(MediaFetchError, match=match):
        fetch_url_bytes(http_url + path, timeout=5, max_bytes=max_bytes, policy=LOCAL)


def test_fetch_timeout_is_bounded(http_url):
    start = time.monotonic()
    with pytest.raises(MediaFetchError, match="timed out after 0.5 s"):
        fetch_url_bytes(http_url + "/slow", timeout=0.5, max_bytes=10_000, policy=LOCAL)
    assert time.monotonic() - start < 2.5


def test_connection_refused_and_bad_urls():
    with pytest.raises(MediaFetchError, match="failed"):
        fetch_url_bytes("http://127.0.0.1:1/x.png", timeout=2, max_bytes=100, policy=LOCAL)
    with pytest.raises(MediaFetchError, match="invalid image URL"):
        fetch_url_bytes("http:///nohost", timeout=2, max_bytes=100)
    assert is_http_url(" https://a/b") and not is_http_url("data:image/png;base64,xx") and not is_http_url(b"http://")


def test_default_policy_refuses_loopback_and_names_the_flag(http_url):
    with pytest.raises(MediaFetchError, match="loopback address 127.0.0.1.*--allowed-media-domains"):
        fetch_url_bytes(http_url + "/img.png", timeout=5, max_bytes=10_000)
    assert fetch_url_bytes(http_url + "/img.png", timeout=5, max_bytes=10_000,
                           policy=HostPolicy(allow_private=True)) == _png()


def test_redirect_to_a_host_outside_the_allow_list_is_refused(http_url):
    with pytest.raises(MediaFetchError, match="'localhost' is not allowed"):
        fetch_url_bytes(http_url + "/redirect-to-localhost", timeout=5, max_bytes=10_000, policy=LOCAL)


def test_allow_list_refuses_other_hosts_before_connecting():
    policy = HostPolicy(allowed_domains=("images.example.com",))
    with pytest.raises(MediaFetchError, match="not in --allowed-media-domains"):
        fetch_url_bytes("http://127.0.0.1:1/x.png", timeout=2, max_bytes=100, policy=policy)
    assert policy.domain_allowed("cdn.images.example.com") and policy.domain_allowed("IMAGES.example.com.")
    assert not policy.domain_allowed("evilimages.example.com")


@pytest.mark.parametrize("address, refused", [
    ("127.0.0.1", True), ("10.1.2.3", True), ("172.16.0.9", True), ("192.168.1.1", True),
    ("169.254.169.254", True), ("0.0.0.0", True), ("::1", True), ("fe80::1%eth0", True), ("fc00::1", True),
    ("::ffff:127.0.0.1", True), ("224.0.0.1", True), ("8.8.8.8", False), ("2001:4860:4860::8888", False),
])
def test_peer_address_classification(address, refused):
    policy = HostPolicy()
    if refused:
        with pytest.raises(MediaFetchError, match="refused"):
            policy.check_peer("host.example", address)
    else:
        policy.check_peer("host.example", address)
    HostPolicy(allow_private=True).check_peer("host.example", address)  # the switch lets everything through
