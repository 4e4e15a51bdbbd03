"""The language side of encoder disaggregation (EPD, `--language-only --encoder-urls A B ...`).

- `EncoderPool` decides which encoder takes which items: least outstanding work (patches in flight),
  an encoder that just failed is skipped for a cool-off, and one request's items may spread.
- `EncodeDispatcher` (tokenizer manager, asyncio) sends a built request's items to the encoders over
  HTTP before the request goes to the scheduler. A failed encoder (connection refused, 5xx, timeout)
  has its items retried on the others; when every encoder failed the request ends with 503 at once.
  An encoder's 400 (a bad image) is the request's 400. Text-only requests never get here.
- `EmbeddingInbox` (zmq_to_tokenizer): the tokenizer manager's receiving end; the dispatcher attaches
  the embeddings to the items and the request carries them (through the TP broadcast as any request).
- `EmbeddingRendezvous` (zmq_to_scheduler): scheduler rank 0 holds a request, before the TP broadcast
  and holding no KV, until every embedding it expects arrived (then the broadcast carries them to the
  other ranks), or until its deadline (503). Other requests are not held up.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from typing import Callable

from sglang.srt.disaggregation.encode_protocol import ENCODE_PATH, EncodedEmbeddings, EncodeRequest
from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput

logger = logging.getLogger(__name__)

FAILED_COOLOFF_S = 5.0  # a failed encoder is tried last for this long
HOLD_TTL_S = 120.0  # embeddings whose request never came are dropped after this long


def _unavailable(message: str) -> GenerateError:
    return GenerateError(message, 503, "service_unavailable")


class EncoderPool:
    """Least outstanding work first; no I/O (the dispatcher reports starts, ends and failures)."""

    def __init__(self, urls, cooloff_s: float = FAILED_COOLOFF_S, clock: Callable[[], float] = time.monotonic):
        self.urls = [u.rstrip("/") for u in urls]
        if not self.urls:
            raise ValueError("an encoder pool needs at least one URL")
        self.cooloff_s = cooloff_s
        self.clock = clock
        self.outstanding = dict.fromkeys(self.urls, 0)  # patches sent and not answered yet
        self.failed_at: dict[str, float] = {}
        self.failures = dict.fromkeys(self.urls, 0)

    def healthy(self, url: str) -> bool:
        t = self.failed_at.get(url)
        return t is None or self.clock() - t >= self.cooloff_s

    def _rank(self, url: str, extra: int = 0) -> tuple:
        return (not self.healthy(url), self.outstanding[url] + extra, self.urls.index(url))

    def pick(self, exclude=()) -> str | None:
        """The best encoder not in `exclude` (healthy first, then least outstanding), or None."""
        left = [u for u in self.urls if u not in exclude]
        return min(left, key=self._rank) if left else None

    def assign(self, weights: list[int]) -> dict[str, list[int]]:
        """Item index -> encoder, largest items first, each to the encoder with the least outstanding work
        counting what this call already gave it (so one request's items spread over idle encoders)."""
        plan: dict[str, list[int]] = {}
        extra = dict.fromkeys(self.urls, 0)
        for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
            url = min(self.urls, key=lambda u: self._rank(u, extra[u]))
            extra[url] += weights[i]
            plan.setdefault(url, []).append(i)
        return {u: sorted(ix) for u, ix in plan.items()}

    def begin(self, url: str, work: int) -> None:
        self.outstanding[url] += work

    def end(self, url: str, work: int, ok: bool) -> None:
        self.outstanding[url] -= work
        if ok:
            self.failed_at.pop(url, None)
        else:
            self.failed_at[url] = self.clock()
            self.failures[url] += 1

    def stats(self) -> dict:
        return {u: {"outstanding_patches": self.outstanding[u], "failures": self.failures[u],
                    "healthy": self.healthy(u)} for u in self.urls}


class _EncoderRefused(Exception):
    """The encoder answered 400: the item is bad, not the encoder."""


class EmbeddingInbox:
    """zmq_to_tokenizer: embeddings pushed back to the tokenizer manager, matched to waiting requests."""

    def __init__(self):
        self._waiting: dict[str, tuple[set[int], dict[int, object], asyncio.Future, list[float]]] = {}

    def expect(self, rid: str, indices) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (set(indices), {}, fut, [0.0])
        return fut

    def cancel(self, rid: str) -> None:
        entry = self._waiting.pop(rid, None)
        if entry is not None and not entry[2].done():
            entry[2].cancel()

    def deliver(self, msg: EncodedEmbeddings) -> None:
        entry = self._waiting.get(msg.rid)
        if entry is None:
            return  # late (the request already failed or was retried elsewhere): dropped
        need, got, fut, encode_ms = entry
        for i, emb in zip(msg.item_indices, msg.embeddings):
            if i in need:
                got[i] = emb
        encode_ms[0] = max(encode_ms[0], msg.encode_ms)
        if need <= set(got) and not fut.done():
            del self._waiting[msg.rid]
            fut.set_result((got, encode_ms[0]))

    async def run(self, sock) -> None:
        """Receives forever from a bound zmq.asyncio PULL socket."""
        while True:
            frames = await sock.recv_multipart()
            try:
                self.deliver(EncodedEmbeddings.from_frames(frames))
            except Exception:
                logger.exception("dropped a malformed embedding message")


class EncodeDispatcher:
    def __init__(self, urls, backend: str, reply_to: str, timeout_s: float = 60.0,
                 inbox: EmbeddingInbox | None = None, pool: EncoderPool | None = None):
        self.pool = pool or EncoderPool(urls)
        self.backend = backend
        self.reply_to = reply_to
        self.timeout_s = timeout_s
        self.inbox = inbox
        self._session = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, url: str, body: bytes) -> dict:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        async with self._session.post(url + ENCODE_PATH, data=body,
                                      headers={"Content-Type": "application/octet-stream"}) as resp:
            text = await resp.text()
            if resp.status == 400:
                raise _EncoderRefused(text)
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {text[:200]}")
            import json

            return json.loads(text)

    async def encode(self, tokenized: TokenizedGenerateReqInput) -> dict[str, float]:
        """Every item of `tokenized` encoded remotely; the items lose their pixels and, under
        zmq_to_tokenizer, carry their embeddings (zmq_to_scheduler: `epd_pending_items` names what the
        scheduler waits for). Returns the stage timings (epd_encode, epd_transfer). Raises GenerateError:
        400 for an item an encoder refused, 503 when no encoder could do it."""
        items = tokenized.mm_inputs.mm_items
        rid = tokenized.rid
        start = time.perf_counter()
        plan = self.pool.assign([max(it.num_patches, 1) for it in items])
        waiter = self.inbox.expect(rid, range(len(items))) if self.inbox is not None else None
        try:
            acks = await asyncio.gather(*(self._send_group(rid, url, idx, items) for url, idx in plan.items()))
            encode_ms = max((a.get("encode_ms", 0.0) for a in acks), default=0.0)
            if waiter is not None:
                try:
                    got, encode_ms = await asyncio.wait_for(waiter, self.timeout_s)
                except asyncio.TimeoutError:
                    raise _unavailable(f"the encoders acknowledged request {rid}'s items but its embeddings did "
                                       f"not arrive within {self.timeout_s:g} s") from None
                for i, emb in got.items():
                    items[i].precomputed_embeddings = emb
        finally:
            if waiter is not None:
                self.inbox.cancel(rid)
        for it in items:
            it.feature = None  # the language side keeps no pixels
        if waiter is None:
            tokenized.epd_pending_items = tuple(range(len(items)))
        wall = (time.perf_counter() - start) * 1e3
        return {"epd_encode": encode_ms, "epd_transfer": max(wall - encode_ms, 0.0)}

    async def _send_group(self, rid: str, url: str, indices: list[int], items: list) -> dict:
        work = sum(max(items[i].num_patches, 1) for i in indices)
        req = EncodeRequest(rid, indices, [items[i] for i in indices], self.reply_to, self.backend)
        body = await asyncio.get_running_loop().run_in_executor(None, pickle.dumps, req, pickle.HIGHEST_PROTOCOL)
        tried: list[str] = []
        errors: list[str] = []
        while url is not None:
            tried.append(url)
            self.pool.begin(url, work)
            ok = False
            try:
                ack = await self._post(url, body)
                ok = True
                return ack
            except _EncoderRefused as e:
                ok = True  # the encoder is fine; the item is not
                raise GenerateError(_refusal_message(str(e))) from None
            except asyncio.CancelledError:
                ok = True
                raise
            except Exception as e:  # refused connection, 5xx, timeout: the next encoder
                errors.append(f"{url}: {type(e).__name__}: {e}"[:300])
                logger.warning("encoder %s failed on request %s (%s); %d item(s) go to another encoder",
                               url, rid, errors[-1], len(indices))
            finally:
                self.pool.end(url, work, ok)
            url = self.pool.pick(exclude=tried)
        raise _unavailable(f"no encoder could encode request {rid}'s images ({len(tried)} tried: "
                           f"{'; '.join(errors)})")


def _refusal_message(body: str) -> str:
    import json

    try:
        return str(json.loads(body).get("error", {}).get("message") or body)
    except (ValueError, AttributeError):
        return body


class EmbeddingRendezvous:
    """zmq_to_scheduler, on scheduler rank 0 before the TP broadcast: requests wait here (no KV) for the
    embeddings encoders push, which may come before or after them."""

    def __init__(self, wait_s: float = 60.0, ttl_s: float = HOLD_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.wait_s = wait_s
        self.ttl_s = ttl_s
        self.clock = clock
        self.arrived: dict[str, tuple[float, dict[int, object]]] = {}  # rid -> (first arrival, idx -> emb)
        self.held: dict[str, tuple[float, TokenizedGenerateReqInput]] = {}  # rid -> (since, request)

    def __len__(self) -> int:
        return len(self.held)

    def add(self, msg: EncodedEmbeddings) -> None:
        _, got = self.arrived.setdefault(msg.rid, (self.clock(), {}))
        got.update(zip(msg.item_indices, msg.embeddings))

    def admit(self, msgs: list) -> list:
        """The messages to broadcast now: embeddings are consumed; a request whose embeddings are not all
        here is held; held requests that became complete (embeddings attached) or expired (`epd_error`
        set, answered 503 by every rank) join, in arrival order of this call's other messages after them."""
        now = self.clock()
        out = []
        for msg in msgs:
            if isinstance(msg, EncodedEmbeddings):
                self.add(msg)
            elif isinstance(msg, TokenizedGenerateReqInput) and msg.epd_pending_items:
                self.held[msg.rid] = (now, msg)
            elif isinstance(msg, AbortReq) and msg.rid in self.held:
                del self.held[msg.rid]  # the client left while its embeddings were on the way
                self.arrived.pop(msg.rid, None)
                out.append(msg)
            else:
                out.append(msg)
        ready = []
        for rid, (since, req) in list(self.held.items()):
            got = self.arrived.get(rid, (0, {}))[1]
            if all(i in got for i in req.epd_pending_items):
                for i in req.epd_pending_items:
                    req.mm_inputs.mm_items[i].precomputed_embeddings = got[i]
            elif now - since >= self.wait_s:
                req.epd_error = (f"the embeddings of {len(req.epd_pending_items) - len(got)} item(s) did not reach "
                                 f"the scheduler within {self.wait_s:g} s")
            else:
                continue
            del self.held[rid]
            self.arrived.pop(rid, None)
            req.epd_wait_ms = (now - since) * 1e3
            req.epd_pending_items = ()
            ready.append(req)
        for rid, (t, _) in list(self.arrived.items()):
            if rid not in self.held and now - t > self.ttl_s:
                del self.arrived[rid]  # its request failed elsewhere and never came
        return ready + out
