"""The language side of encoder disaggregation (EPD, `--language-only --encoder-urls A B ...`).

- `EncoderPool` decides which encoder takes which items: least outstanding work (patches in flight),
  an encoder that just failed is skipped for a cool-off, and one request's items may spread.
- `EncodeDispatcher` (tokenizer manager, asyncio) sends a built request's items to the encoders over
  HTTP (the typed wire form of `encode_wire.py`, with `--api-key` as on any server) before the request
  goes to the scheduler. It registers its embedding endpoint with each encoder before the first call and
  again after the encoder failed or forgot it, and compares the encoder's model identity with its own
  each time: an encoder serving another model is refused by name and never used. A failed encoder
  (connection refused, 5xx, timeout) has its items retried on the others; when every encoder failed
  the request ends with 503 at once. An encoder's 400 (a bad image) is the request's 400. Text-only
  requests never get here.
- `EmbeddingInbox` (zmq_to_tokenizer): the tokenizer manager's receiving end; the dispatcher attaches
  the embeddings to the items and the request carries them (through the TP broadcast as any request).
- `EmbeddingRendezvous` (zmq_to_scheduler): scheduler rank 0 holds a request, before the TP broadcast
  and holding no KV, until every embedding it expects arrived (then the broadcast carries them to the
  other ranks), or until its deadline (503). Other requests are not held up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Callable

from sglang.srt.disaggregation.encode_protocol import ENCODE_PATH, REGISTER_PATH, EncodedEmbeddings, EncodeRequest
from sglang.srt.disaggregation.encode_wire import encode_request_body
from sglang.srt.disaggregation.model_identity import identity_mismatch
from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput

logger = logging.getLogger(__name__)

FAILED_COOLOFF_S = 5.0  # a failed encoder is tried last for this long
HOLD_TTL_S = 120.0  # embeddings whose request never came are dropped after this long
MAX_STRAY_MESSAGES = 1024  # embeddings held for requests not here yet, at most (oldest dropped first)
MAX_STRAY_BYTES = 4 << 30
QUEUE_FULL = "The request queue is full."  # upstream's message for --max-queued-requests


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
        self.disabled: dict[str, str] = {}  # url -> why it is never used (another model)

    def usable(self) -> list[str]:
        return [u for u in self.urls if u not in self.disabled]

    def healthy(self, url: str) -> bool:
        t = self.failed_at.get(url)
        return t is None or self.clock() - t >= self.cooloff_s

    def _rank(self, url: str, extra: int = 0) -> tuple:
        return (not self.healthy(url), self.outstanding[url] + extra, self.urls.index(url))

    def pick(self, exclude=()) -> str | None:
        """The best encoder not in `exclude` (healthy first, then least outstanding), or None."""
        left = [u for u in self.usable() if u not in exclude]
        return min(left, key=self._rank) if left else None

    def assign(self, weights: list[int]) -> dict[str, list[int]]:
        """Item index -> encoder, largest items first, each to the encoder with the least outstanding work
        counting what this call already gave it (so one request's items spread over idle encoders)."""
        plan: dict[str, list[int]] = {}
        extra = dict.fromkeys(self.urls, 0)
        usable = self.usable()
        if not usable:
            return {}
        for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
            url = min(usable, key=lambda u: self._rank(u, extra[u]))
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
                    "healthy": self.healthy(u) and u not in self.disabled,
                    **({"refused": self.disabled[u]} if u in self.disabled else {})} for u in self.urls}


class _EncoderRefused(Exception):
    """The encoder answered 400: the item is bad, not the encoder."""


class _Unregistered(Exception):
    """The encoder answered 409: it does not know our reply_to (it restarted): register, then retry."""


class EncoderMismatch(RuntimeError):
    """An encoder serves another model than this language server."""


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

    async def run(self, sock, key: bytes | None, max_bytes: int) -> None:
        """Receives forever from a bound zmq.asyncio PULL socket; a message that fails a check is dropped
        alone (logged), never the loop."""
        from sglang.srt.disaggregation.encode_wire import decode_embedding_frames

        while True:
            frames = await sock.recv_multipart(copy=False)
            try:
                msg = decode_embedding_frames(frames, key, max_bytes)
            except ValueError as e:
                logger.warning("dropped an embedding message: %s", e)
                continue
            self.deliver(msg)


class EncodeDispatcher:
    def __init__(self, urls, backend: str, reply_to: str, timeout_s: float = 60.0,
                 inbox: EmbeddingInbox | None = None, pool: EncoderPool | None = None,
                 api_key: str | None = None, identity: Callable[[], dict] | None = None):
        self.pool = pool or EncoderPool(urls)
        self.backend = backend
        self.reply_to = reply_to
        self.timeout_s = timeout_s
        self.inbox = inbox
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.identity = identity  # this server's model identity (computed once, off the loop)
        self._registered: set[str] = set()
        self._session = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self):
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def register(self, url: str) -> None:
        """Names our reply_to to `url` and checks it serves our model (EncoderMismatch: `url` is disabled for
        good). Connection errors and 5xx propagate: the encoder failed."""
        async with self._http().post(url + REGISTER_PATH, json={"reply_to": self.reply_to}, headers=self.headers) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"register: HTTP {resp.status}: {_refusal_message(text)[:200]}")
        if self.identity is not None:
            mine = await asyncio.get_running_loop().run_in_executor(None, self.identity)
            why = identity_mismatch(mine, json.loads(text).get("identity"))
            if why is not None:
                message = f"encoder {url} refused: {why}"
                self.pool.disabled[url] = message
                logger.error("%s; it is not used", message)
                raise EncoderMismatch(message)
        self._registered.add(url)

    async def register_all(self) -> list[str]:
        """Start-up: registers with every encoder that answers. Returns the mismatch messages (the caller
        refuses to start on any); an encoder that does not answer yet is registered on first use."""
        async def one(url):
            try:
                await self.register(url)
            except EncoderMismatch as e:
                return str(e)
            except Exception as e:
                logger.warning("encoder %s not reachable at start-up (%s: %s); registering on first use",
                               url, type(e).__name__, e)
            return None

        return [m for m in await asyncio.gather(*(one(u) for u in self.pool.urls)) if m]

    async def _post(self, url: str, body: bytes) -> dict:
        if url not in self._registered:
            await self.register(url)
        async with self._http().post(url + ENCODE_PATH, data=body,
                                     headers={"Content-Type": "application/octet-stream", **self.headers}) as resp:
            text = await resp.text()
            if resp.status == 400:
                raise _EncoderRefused(text)
            if resp.status == 409:
                self._registered.discard(url)
                raise _Unregistered(text)
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {text[:200]}")
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
        if not plan:
            raise _unavailable("no encoder can encode this request's images: "
                               + "; ".join(self.pool.disabled.values()))
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
                    why = rows_mismatch(items[i], emb)
                    if why is not None:
                        raise _unavailable(f"request {rid}: {why}")
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
        body = await asyncio.get_running_loop().run_in_executor(None, encode_request_body, req)
        tried: list[str] = []
        errors: list[str] = []
        while url is not None:
            tried.append(url)
            self.pool.begin(url, work)
            ok = False
            try:
                try:
                    ack = await self._post(url, body)
                except _Unregistered:  # the encoder restarted: register (identity checked again), once
                    ack = await self._post(url, body)
                ok = True
                return ack
            except EncoderMismatch as e:
                ok = True  # not a failure to cool off from: it is never used again
                errors.append(str(e))
            except _EncoderRefused as e:
                ok = True  # the encoder is fine; the item is not
                raise GenerateError(_refusal_message(str(e))) from None
            except asyncio.CancelledError:
                ok = True
                raise
            except Exception as e:  # refused connection, 5xx, timeout: the next encoder
                self._registered.discard(url)  # when it comes back it may be another model: check again
                errors.append(f"{url}: {type(e).__name__}: {e}"[:300])
                logger.warning("encoder %s failed on request %s (%s); %d item(s) go to another encoder",
                               url, rid, errors[-1], len(indices))
            finally:
                self.pool.end(url, work, ok)
            url = self.pool.pick(exclude=tried)
        raise _unavailable(f"no encoder could encode request {rid}'s images ({len(tried)} tried: "
                           f"{'; '.join(errors)})")


def rows_mismatch(item, emb) -> str | None:
    """Why `emb` cannot be `item`'s embeddings (one row per placeholder token), or None."""
    if emb.dim() != 2 or emb.shape[0] != item.num_tokens:
        return (f"an encoder sent embeddings of shape {tuple(emb.shape)} for an item of {item.num_tokens} "
                "tokens (does it serve this model?)")
    return None


def _refusal_message(body: str) -> str:
    try:
        return str(json.loads(body).get("error", {}).get("message") or body)
    except (ValueError, AttributeError):
        return body


class EmbeddingRendezvous:
    """zmq_to_scheduler, on scheduler rank 0 before the TP broadcast: requests wait here (no KV) for the
    embeddings encoders push, which may come before or after them."""

    def __init__(self, wait_s: float = 60.0, ttl_s: float = HOLD_TTL_S, clock: Callable[[], float] = time.monotonic,
                 max_stray: int = MAX_STRAY_MESSAGES, max_stray_bytes: int = MAX_STRAY_BYTES):
        self.wait_s = wait_s
        self.ttl_s = ttl_s
        self.clock = clock
        self.max_stray = max_stray
        self.max_stray_bytes = max_stray_bytes
        self.arrived: dict[str, tuple[float, dict[int, object]]] = {}  # rid -> (first arrival, idx -> emb)
        self.arrived_bytes = 0
        self.held: dict[str, tuple[float, TokenizedGenerateReqInput]] = {}  # rid -> (since, request)
        self.dropped = 0  # embeddings dropped unused (expired, over the bounds, aborted)

    def __len__(self) -> int:
        return len(self.held)

    def needs_ticks(self) -> bool:
        """Whether deadlines or expiries are pending (the loop must call `admit` even with no input)."""
        return bool(self.held or self.arrived)

    def add(self, msg: EncodedEmbeddings) -> None:
        _, got = self.arrived.setdefault(msg.rid, (self.clock(), {}))
        for i, emb in zip(msg.item_indices, msg.embeddings):
            old = got.get(i)
            self.arrived_bytes += _nbytes(emb) - (_nbytes(old) if old is not None else 0)
            got[i] = emb
        # bounded: the oldest entries whose request is not held go first (a held request's are kept)
        for rid in list(self.arrived):
            if len(self.arrived) <= self.max_stray and self.arrived_bytes <= self.max_stray_bytes:
                break
            if rid not in self.held and rid != msg.rid:
                self._drop(rid)

    def _take(self, rid: str) -> dict[int, object] | None:
        """The embeddings that arrived for `rid` (removed, their bytes uncounted), or None."""
        entry = self.arrived.pop(rid, None)
        if entry is None:
            return None
        self.arrived_bytes -= sum(_nbytes(e) for e in entry[1].values())
        return entry[1]

    def _drop(self, rid: str) -> None:
        if self._take(rid) is not None:
            self.dropped += 1

    def admit(self, msgs: list, queued: int = 0, limit: int | None = None) -> list:
        """The messages to broadcast now: embeddings are consumed; a request whose embeddings are not all
        here is held; held requests that became complete (embeddings attached) or expired (`epd_error`
        set, answered 503 by every rank) join, in arrival order of this call's other messages after them.
        An abort of a held request releases it with `epd_error` set, so it is answered like any failed
        request instead of never. `limit` (--max-queued-requests) counts held requests with the `queued`
        ones: a request that would pass it is released at once, answered 503 as a full queue."""
        now = self.clock()
        out = []
        for msg in msgs:
            if isinstance(msg, EncodedEmbeddings):
                self.add(msg)
            elif isinstance(msg, TokenizedGenerateReqInput) and msg.epd_pending_items:
                if limit is not None and queued + len(self.held) >= limit:
                    msg.epd_error = QUEUE_FULL
                    msg.epd_pending_items = ()
                    self._drop(msg.rid)
                    out.append(msg)
                else:
                    self.held[msg.rid] = (now, msg)
            elif isinstance(msg, AbortReq) and msg.rid in self.held:
                _, req = self.held.pop(msg.rid)
                self._drop(msg.rid)
                req.epd_error = f"{msg.reason} while waiting for its image embeddings"
                req.epd_pending_items = ()
                out.append(req)  # answered as a failed request; the abort itself then finds nothing
                out.append(msg)
            else:
                out.append(msg)
        ready = []
        for rid, (since, req) in list(self.held.items()):
            got = self.arrived.get(rid, (0, {}))[1]
            if all(i in got for i in req.epd_pending_items):
                bad = [rows_mismatch(req.mm_inputs.mm_items[i], got[i]) for i in req.epd_pending_items]
                bad = [b for b in bad if b is not None]
                if bad:
                    req.epd_error = bad[0]
                else:
                    for i in req.epd_pending_items:
                        req.mm_inputs.mm_items[i].precomputed_embeddings = got[i]
            elif now - since >= self.wait_s:
                req.epd_error = (f"the embeddings of {len(req.epd_pending_items) - len(got)} item(s) did not reach "
                                 f"the scheduler within {self.wait_s:g} s")
            else:
                continue
            del self.held[rid]
            self._take(rid)  # consumed (attached above) or unusable: either way no longer held here
            req.epd_wait_ms = (now - since) * 1e3
            req.epd_pending_items = ()
            ready.append(req)
        for rid, (t, _) in list(self.arrived.items()):
            if rid not in self.held and now - t > self.ttl_s:
                self._drop(rid)  # its request failed elsewhere and never came
        return ready + out


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if hasattr(t, "element_size") else 0
