"""A cap on HTTP request bodies, applied before any route reads or parses one (413 otherwise).

Pure ASGI: a declared Content-Length over the cap is refused without reading a byte; a body without
one (chunked) is read up to the cap and handed on, or refused as soon as it passes the cap. Either
way a client cannot make the server buffer more than the cap."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class BodySizeLimit:
    def __init__(self, app, max_bytes: int, on_refuse: Callable[[str], Any]):
        self.app = app
        self.max_bytes = max_bytes
        self.on_refuse = on_refuse  # message -> ASGI response (the API's error body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                return await self._refuse(scope, receive, send, f"{int(declared)} bytes")
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(body) > self.max_bytes:
                return await self._refuse(scope, receive, send, f"more than {self.max_bytes} bytes")
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect, when it comes

        return await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        mib = self.max_bytes / 2**20
        response = self.on_refuse(
            f"the request body is too large: {size}, but at most {self.max_bytes} bytes ({mib:g} MiB) are "
            "accepted (--max-payload-size / --max-request-body-mb)"
        )
        await response(scope, receive, send)
