"""`--api-key`: every route but /health and /metrics requires `Authorization: Bearer <key>`.

Pure ASGI, before any route runs; the comparison takes the same time whatever the key's prefix."""

from __future__ import annotations

import hmac
from typing import Any, Callable

OPEN_PATHS = ("/health", "/metrics")


class ApiKeyAuth:
    def __init__(self, app, api_key: str, on_refuse: Callable[[str], Any]):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.on_refuse = on_refuse  # message -> ASGI response (the API's error body)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        got = next((v for k, v in scope.get("headers", []) if k == b"authorization"), b"")
        if hmac.compare_digest(got, self.expected):
            return await self.app(scope, receive, send)
        msg = ("missing API key: send 'Authorization: Bearer <key>'" if not got
               else "invalid API key")
        await self.on_refuse(msg)(scope, receive, send)
