"""The request-body cap: a declared Content-Length over it is refused unread, a chunked body is
refused as soon as it passes the cap, bodies within it reach the app intact (and a later receive
still reports the client's disconnect)."""

from __future__ import annotations

import asyncio
import json

from sglang.srt.entrypoints.body_limit import BodySizeLimit


class _Resp:
    def __init__(self, msg):
        self.msg = msg

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 413, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps({"error": {"message": self.msg}}).encode()})


def _run(headers, chunks, cap=100):
    seen = {}

    async def app(scope, receive, send):
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        seen["body"] = body
        seen["after"] = (await receive())["type"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    msgs = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    msgs.append({"type": "http.disconnect"})
    received = []

    async def receive():
        received.append(1)
        return msgs.pop(0)

    sent = []

    async def send(m):
        sent.append(m)

    scope = {"type": "http", "headers": headers}
    asyncio.run(BodySizeLimit(app, cap, _Resp)(scope, receive, send))
    return sent[0]["status"], sent, seen, len(received)


def test_declared_length_over_the_cap_is_refused_unread():
    status, sent, seen, reads = _run([(b"content-length", b"101")], [b"x" * 101])
    assert status == 413 and seen == {} and reads == 0
    assert "101 bytes" in json.loads(sent[1]["body"])["error"]["message"]


def test_chunked_body_over_the_cap_is_refused():
    status, sent, seen, _ = _run([], [b"x" * 60, b"x" * 60])
    assert status == 413 and seen == {}
    assert "more than 100 bytes" in json.loads(sent[1]["body"])["error"]["message"]


def test_bodies_within_the_cap_pass_intact():
    status, _, seen, _ = _run([], [b"a" * 50, b"b" * 50])
    assert status == 200 and seen["body"] == b"a" * 50 + b"b" * 50 and seen["after"] == "http.disconnect"
    status, _, seen, _ = _run([(b"content-length", b"100")], [b"c" * 100])
    assert status == 200 and seen["body"] == b"c" * 100
