"""Streaming OpenAI-chat client: one POST to /v1/chat/completions with `stream: true` and
`stream_options.include_usage`, timed chunk by chunk.

`sglang-oai-chat` adds SGLang's sampling extensions (`ignore_eos`, `min_tokens`) to the body; `openai-chat`
sends only fields the OpenAI API defines.
"""

from __future__ import annotations

import time
from typing import Any, AsyncIterator

import aiohttp
import orjson

from sglang.benchmark.datasets import SampleRequest
from sglang.benchmark.metrics import RequestOutput

BACKENDS = ("sglang-oai-chat", "openai-chat")
CHAT_PATH = "/v1/chat/completions"
JSON_HEADERS = {"Content-Type": "application/json"}
TIMEOUT = aiohttp.ClientTimeout(total=6 * 60 * 60)


def build_chat_body(backend: str, model: str, req: SampleRequest, ignore_eos: bool = True) -> dict[str, Any]:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": req.content()}],
        "max_tokens": req.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if backend == "sglang-oai-chat" and ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = req.output_len
    return body


async def iter_sse(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent-event stream, `[DONE]` included; comments and blanks skipped.
    Buffers raw bytes itself so long events are not cut by aiohttp's line-length limit."""
    buf = b""
    async for piece in resp.content.iter_any():
        buf += piece
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip().decode("utf-8")
    line = buf.strip()
    if line.startswith(b"data:"):
        yield line[5:].strip().decode("utf-8")


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err if err is not None else obj)


async def http_error(resp: aiohttp.ClientResponse) -> str:
    raw = await resp.read()
    try:
        detail = _error_text(orjson.loads(raw))
    except orjson.JSONDecodeError:
        detail = raw.decode("utf-8", "replace").strip()
    return f"HTTP {resp.status}: {detail[:300]}"


async def stream_chat(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any] | bytes, prompt_len: int = 0
) -> RequestOutput:
    """Send one streaming chat request (`body` as a dict or pre-serialized JSON); never raises for
    request-level failures (they land in `.error`)."""
    out = RequestOutput(prompt_len=prompt_len)
    payload = body if isinstance(body, bytes) else orjson.dumps(body)
    pieces: list[str] = []
    first_content = last_content = finish_at = None
    done = False
    st = out.start_time = time.perf_counter()
    last = st
    try:
        async with session.post(url, data=payload, headers=JSON_HEADERS) as resp:
            if resp.status != 200:
                out.error = await http_error(resp)
                return out
            async for data in iter_sse(resp):
                if data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                obj = orjson.loads(data)
                if "error" in obj:
                    out.error = "stream error: " + _error_text(obj)[:300]
                    return out
                for choice in obj.get("choices") or []:
                    delta = choice.get("delta") or {}
                    content = delta.get("content") or delta.get("reasoning_content")
                    if content:
                        if first_content is None:
                            first_content = now
                        else:
                            out.itl.append(now - last_content)
                        last_content = now
                        pieces.append(content)
                    if choice.get("finish_reason") and finish_at is None:
                        finish_at = now
                usage = obj.get("usage")
                if usage:
                    out.output_tokens = usage.get("completion_tokens")
                    out.server_prompt_tokens = usage.get("prompt_tokens")
                last = now
    except Exception as e:  # noqa: BLE001 - every transport/parse failure is one failed request
        out.error = f"{type(e).__name__}: {e}"[:300]
        return out
    if not done and finish_at is None:
        out.error = "stream ended before a finish_reason or [DONE]"
        return out
    # An output of only skipped special tokens has no content: time its first token by the finish chunk.
    first = first_content if first_content is not None else finish_at
    if first is None:
        out.error = "stream finished without any choice"
        return out
    out.ttft = first - st
    out.latency = last - st
    out.generated_text = "".join(pieces)
    out.success = True
    return out


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {url} -> {await http_error(resp)}")
        return orjson.loads(await resp.read())


async def default_model(session: aiohttp.ClientSession, base_url: str) -> str:
    data = await get_json(session, base_url + "/v1/models")
    models = data.get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return models[0]["id"]


async def server_model_path(session: aiohttp.ClientSession, base_url: str) -> str | None:
    """`model_path` from SGLang's /get_model_info, or None where the server has no such route."""
    try:
        info = await get_json(session, base_url + "/get_model_info")
    except (RuntimeError, aiohttp.ClientError, orjson.JSONDecodeError):
        return None
    return info.get("tokenizer_path") or info.get("model_path")
