"""Sends one benchmark request and times it: streamed (server-sent events) or not, for the three APIs.

Timing per request: TTFT = the first chunk that carries output (text, or new tokens for /generate) minus the
send time; ITL = the gaps between later such chunks (a /generate chunk that brings k tokens adds k gaps of
gap / k, as upstream does); latency = the last chunk minus the send time. A non-streamed request has
TTFT = latency and no ITL. Output tokens come from the server (`usage.completion_tokens`, or
`meta_info.completion_tokens` for /generate); `usage.prompt_tokens` / `meta_info.prompt_tokens` is kept for
the vision-token count. Any failure (HTTP status, error event, transport, a stream without an end) lands in
`RequestOutput.error`; nothing here raises.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from sglang.benchmark.backends import JSON_HEADERS, _error_text, http_error, iter_sse
from sglang.benchmark.metrics import RequestOutput


def _usage(obj: dict, out: RequestOutput) -> None:
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if usage.get("completion_tokens") is not None:
            out.output_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            out.server_prompt_tokens = int(usage["prompt_tokens"])


class _Parser:
    """Turns each decoded chunk into (new text, new tokens or None, finished)."""

    def __init__(self, api: str, out: RequestOutput):
        self.api, self.out = api, out
        self.text = ""  # /generate sends the whole text so far
        self.tokens = 0

    def chunk(self, obj: Any) -> tuple[str, int | None, bool]:
        if self.api == "generate":
            return self._generate(obj[0] if isinstance(obj, list) and obj else obj)
        _usage(obj, self.out)
        text, finished = "", False
        for ch in obj.get("choices") or []:
            if self.api == "chat":
                part = ch.get("delta") or ch.get("message") or {}
                text += part.get("content") or part.get("reasoning_content") or ""
            else:
                text += ch.get("text") or ""
            finished = finished or bool(ch.get("finish_reason"))
        return text, None, finished

    def _generate(self, obj: dict) -> tuple[str, int | None, bool]:
        meta = obj.get("meta_info") or {}
        text = obj.get("text") or ""
        new = text[len(self.text):] if text.startswith(self.text) else text
        self.text = text
        new_tokens = None
        if meta.get("completion_tokens") is not None:
            total = int(meta["completion_tokens"])
            new_tokens, self.tokens = total - self.tokens, total
            self.out.output_tokens = total
        if meta.get("prompt_tokens") is not None:
            self.out.server_prompt_tokens = int(meta["prompt_tokens"])
        return new, new_tokens, meta.get("finish_reason") is not None

    def generated(self, pieces: list[str]) -> str:
        return self.text if self.api == "generate" else "".join(pieces)


async def send_request(session: aiohttp.ClientSession, url: str, api: str, body: dict[str, Any] | bytes,
                       prompt_len: int = 0, num_images: int = 0, stream: bool = True) -> RequestOutput:
    out = RequestOutput(prompt_len=prompt_len, num_images=num_images)
    payload = body if isinstance(body, bytes) else orjson.dumps(body)
    parser = _Parser(api, out)
    pieces: list[str] = []
    first = last_event = finish_at = None
    done = False
    st = out.start_time = time.perf_counter()
    last = st
    try:
        async with session.post(url, data=payload, headers=JSON_HEADERS) as resp:
            if resp.status != 200:
                out.error = await http_error(resp)
                return out
            if not stream:
                obj = orjson.loads(await resp.read())
                last = time.perf_counter()
                if isinstance(obj, dict) and "error" in obj:
                    out.error = "error: " + _error_text(obj)[:300]
                    return out
                text, _, _ = parser.chunk(obj)
                pieces.append(text)
                first = finish_at = last
                done = True
            else:
                async for data in iter_sse(resp):
                    if data == "[DONE]":
                        done = True
                        break
                    now = time.perf_counter()
                    obj = orjson.loads(data)
                    if isinstance(obj, dict) and "error" in obj:
                        out.error = "stream error: " + _error_text(obj)[:300]
                        return out
                    text, new_tokens, finished = parser.chunk(obj)
                    if text or (new_tokens or 0) > 0:
                        if first is None:
                            first = now
                        else:
                            k = new_tokens if new_tokens and new_tokens > 1 else 1
                            out.itl.extend([(now - last_event) / k] * k)
                        last_event = now
                        pieces.append(text)
                    if finished and finish_at is None:
                        finish_at = now
                    last = now
    except Exception as e:  # noqa: BLE001 - every transport/parse failure is one failed request
        out.error = f"{type(e).__name__}: {e}"[:300]
        return out
    if not done and finish_at is None:
        out.error = "stream ended before a finish_reason or [DONE]"
        return out
    # An output of only skipped special tokens has no text: time its first token by the finish chunk.
    first = first if first is not None else finish_at
    if first is None:
        out.error = "stream finished without any output"
        return out
    out.ttft = first - st
    out.latency = last - st
    out.generated_text = parser.generated(pieces)
    out.success = True
    return out
