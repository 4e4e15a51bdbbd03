"""A local HTTP server whose images are held until the test lets them go: `/gate/<anything>` answers a PNG
once `release()` is called, and counts the requests that arrived (so a test knows a worker is inside a fetch,
mid-job, without sleeping). Other paths answer the PNG at once."""

from __future__ import annotations

import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image


def png(seed: int, w: int = 96, h: int = 64) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


class MediaGate:
    def __init__(self, body: bytes | None = None):
        gate = self
        self.body = body or png(5)
        self._cond = threading.Condition()
        self._open = False
        self.arrived: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                with gate._cond:
                    gate.arrived.append(self.path)
                    gate._cond.notify_all()
                    if self.path.startswith("/gate/"):
                        gate._cond.wait_for(lambda: gate._open, 120)
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(gate.body)))
                self.end_headers()
                self.wfile.write(gate.body)

            def log_message(self, *args):
                pass

        class Quiet(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a client killed mid-request breaks the pipe: expected

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def wait_arrived(self, n: int, timeout: float = 120) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.arrived) >= n, timeout)

    def release(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def close(self) -> None:
        self.release()
        self.httpd.shutdown()
        self.httpd.server_close()
