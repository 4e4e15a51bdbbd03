"""A bounded mixed-traffic load for the soak tests: many concurrent clients, each looping over a random
mix of good requests (0-4 images of random sizes, streamed or not, chat and native), client aborts and
bad inputs, for a fixed time. Every answer is classified; a 5xx or a refused connection is a failure.

Only loopback addresses are targeted, every loop stops by itself at the deadline."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import numpy as np
from PIL import Image


@dataclass
class SoakResult:
    kinds: Counter = field(default_factory=Counter)  # scenario -> count
    statuses: Counter = field(default_factory=Counter)  # status code -> count (0: aborted by us)
    failures: list[str] = field(default_factory=list)  # 5xx, connection errors, unexpected 2xx/4xx

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    def fail(self, kind: str, what: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(f"{kind}: {what}")
        else:
            self.failures.append("...")


def _data_url(img: Image.Image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def image_pool(n: int, seed: int) -> list[str]:
    """Noise images of random sizes (32..320 a side), encoded once: encoding is not what is tested."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w, h = (int(x) for x in rng.integers(32, 321, 2))
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
        out.append(_data_url(img, "JPEG" if i % 2 else "PNG"))
    return out


def _truncated_png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()[:60]).decode()


class MixedLoad:
    def __init__(self, url: str, limit_mm: int, context_length: int, seed: int = 0):
        self.url = url
        self.limit_mm = limit_mm
        self.context_length = context_length
        self.images = image_pool(16, seed)
        self.seed = seed
        self.result = SoakResult()

    # --------------------------------------------------------------------- scenarios
    def _chat_body(self, rng: random.Random, n_images: int, stream: bool) -> dict:
        content: list[dict] = [{"type": "text", "text": f"Request {rng.randrange(10**6)}: describe"}]
        for _ in range(n_images):
            content.insert(rng.randrange(len(content) + 1), {"type": "image_url", "image_url": {"url": rng.choice(self.images)}})
        body = {"model": "default", "messages": [{"role": "user", "content": content}],
                "max_tokens": rng.randint(1, 48), "temperature": rng.choice([0, 0.7]), "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _bad_request(self, rng: random.Random) -> tuple[str, str, bytes | dict]:
        """(name, path, body): each must be answered with a 4xx."""
        img = {"type": "image_url", "image_url": {"url": rng.choice(self.images)}}
        msgs = lambda content: [{"role": "user", "content": content}]  # noqa: E731
        cases = [
            ("invalid_json", "/v1/chat/completions", b'{"model": "default", "messages": ['),
            ("bad_base64", "/v1/chat/completions",
             {"model": "default", "messages": msgs([{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!!"}}])}),
            ("truncated_image", "/v1/chat/completions",
             {"model": "default", "messages": msgs([{"type": "image_url", "image_url": {"url": _truncated_png()}}])}),
            ("too_many_images", "/v1/chat/completions",
             {"model": "default", "messages": msgs([img] * (self.limit_mm + 1))}),
            ("bad_temperature", "/v1/chat/completions",
             {"model": "default", "messages": msgs("hi"), "temperature": -1}),
            ("prompt_too_long", "/generate",
             {"input_ids": [100] * (self.context_length + 8), "sampling_params": {"max_new_tokens": 1}}),
        ]
        return rng.choice(cases)

    async def _one(self, session: aiohttp.ClientSession, rng: random.Random) -> None:
        r = self.result
        roll = rng.random()
        if roll < 0.35:
            kind, stream, abort = "chat", False, False
        elif roll < 0.55:
            kind, stream, abort = "chat_stream", True, False
        elif roll < 0.65:
            kind, stream, abort = "chat_stream_abort", True, True
        elif roll < 0.80:
            kind = "generate"
        else:
            kind = "bad"
        r.kinds[kind] += 1
        try:
            if kind == "bad":
                name, path, body = self._bad_request(rng)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                async with session.post(self.url + path, data=data, headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    r.statuses[resp.status] += 1
                    if not 400 <= resp.status < 500:
                        r.fail(f"bad/{name}", f"status {resp.status}")
                return
            if kind == "generate":
                n_img = rng.randint(0, self.limit_mm)
                body = {"text": "<|vision_start|><|image_pad|><|vision_end|>" * n_img + "Say something.",
                        "image_data": [rng.choice(self.images) for _ in range(n_img)],
                        "sampling_params": {"max_new_tokens": rng.choice([rng.randint(1, 24), 200]), "temperature": 0,
                                            "ignore_eos": True}}
                async with session.post(self.url + "/generate", json=body) as resp:
                    text = await resp.text()
                    r.statuses[resp.status] += 1
                    if resp.status != 200:
                        r.fail(kind, f"status {resp.status}: {text[:200]}")
                return
            body = self._chat_body(rng, rng.randint(0, self.limit_mm), stream)
            async with session.post(self.url + "/v1/chat/completions", json=body) as resp:
                if resp.status != 200:
                    r.statuses[resp.status] += 1
                    r.fail(kind, f"status {resp.status}: {(await resp.text())[:200]}")
                    return
                if abort:
                    await resp.content.readline()  # first SSE line, then hang up mid-stream
                    resp.close()
                    r.statuses[0] += 1
                    return
                raw = await resp.read()
                r.statuses[resp.status] += 1
                if stream and b"data: [DONE]" not in raw:
                    r.fail(kind, "stream ended without [DONE]")
                if stream and b'"error"' in raw:
                    r.fail(kind, f"error inside the stream: {raw[-300:]!r}")
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
            r.statuses[-1] += 1
            r.fail(kind, f"{type(e).__name__}: {e}")

    async def run(self, clients: int, duration_s: float, request_timeout_s: float = 120.0) -> SoakResult:
        deadline = time.monotonic() + duration_s
        timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        conn = aiohttp.TCPConnector(limit=clients)

        async def client(i: int, session: aiohttp.ClientSession) -> None:
            rng = random.Random(self.seed * 100_003 + i)
            while time.monotonic() < deadline:
                await self._one(session, rng)

        async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
            await asyncio.gather(*(client(i, session) for i in range(clients)))
        return self.result
