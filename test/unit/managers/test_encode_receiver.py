"""The language side of EPD without servers: least-outstanding routing, retries on another encoder, 503 when
every encoder failed (at once, no waiting), an encoder's 400 passed through, the tokenizer's inbox
(zmq_to_tokenizer), scheduler rank 0's rendezvous (zmq_to_scheduler) and the data-parallel controller's
embedding routes."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from sglang.srt.disaggregation.encode_protocol import EncodedEmbeddings
from sglang.srt.managers.encode_receiver import (
    EmbeddingInbox,
    EmbeddingRendezvous,
    EncodeDispatcher,
    EncoderPool,
    _EncoderRefused,
)
from sglang.srt.errors import GenerateError
from sglang.srt.managers.data_parallel_controller import EmbeddingRouter
from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs
from sglang.srt.sampling.sampling_params import SamplingParams


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _req(rid: str, grids=((1, 4, 4), (1, 8, 8), (1, 2, 2))) -> TokenizedGenerateReqInput:
    items = [MultimodalDataItem(Modality.IMAGE, feature=torch.zeros(t * h * w, 4), image_grid_thw=g, hash=i + 1)
             for i, g in enumerate(grids) for t, h, w in [g]]
    return TokenizedGenerateReqInput(rid, [1, 2, 3], SamplingParams(), MultimodalInputs(items))


# ----------------------------------------------------------------------------- routing
def test_least_outstanding_work_spreads_one_requests_items():
    pool = EncoderPool(["http://a", "http://b/"])
    assert pool.urls == ["http://a", "http://b"]
    plan = pool.assign([64, 16, 4, 16])
    assert plan == {"http://a": [0], "http://b": [1, 2, 3]}  # largest first, each to the least loaded
    pool.begin("http://a", 100)
    assert pool.assign([4]) == {"http://b": [0]}
    assert pool.pick() == "http://b"
    pool.end("http://a", 100, ok=True)
    assert pool.assign([4]) == {"http://a": [0]}  # ties go in list order


def test_a_failed_encoder_is_skipped_for_its_cooloff():
    clock = Clock()
    pool = EncoderPool(["http://a", "http://b"], cooloff_s=5, clock=clock)
    pool.begin("http://a", 1)
    pool.end("http://a", 1, ok=False)
    assert not pool.healthy("http://a") and pool.failures["http://a"] == 1
    assert pool.assign([1, 1, 1]) == {"http://b": [0, 1, 2]}
    assert pool.pick(exclude=["http://b"]) == "http://a"  # still tried when nothing else is left
    clock.t = 5.0
    assert pool.healthy("http://a") and set(pool.assign([1, 1])) == {"http://a", "http://b"}


class FakeDispatcher(EncodeDispatcher):
    """`_post` answered by a table: url -> 'ok' | 'down' | 'bad' (400); records the calls."""

    def __init__(self, urls, behaviour, inbox=None, backend="zmq_to_scheduler", **kw):
        super().__init__(urls, backend, "tcp://127.0.0.1:1", inbox=inbox, **kw)
        self.behaviour = behaviour
        self.calls: list[tuple[str, float]] = []

    async def _post(self, url, body):
        from sglang.srt.disaggregation.encode_wire import decode_request_body

        self.calls.append((url, time.monotonic()))
        await asyncio.sleep(0)
        what = self.behaviour[url]
        if what == "down":
            raise ConnectionRefusedError("connection refused")
        if what == "bad":
            raise _EncoderRefused('{"error": {"message": "corrupt or truncated image data"}}')
        req, _ = decode_request_body(body, 1 << 30)  # what an encoder reads: the typed wire form
        if self.inbox is not None:
            self.inbox.deliver(EncodedEmbeddings(req.rid, req.item_indices,
                                                 [torch.full((it.num_tokens, 3), float(i))
                                                  for i, it in zip(req.item_indices, req.items)], 1.5))
        return {"ok": True, "encode_ms": 1.5}


def test_items_of_a_failed_encoder_go_to_another_and_the_request_waits_for_embeddings():
    req = _req("r1")
    d = FakeDispatcher(["http://a", "http://b"], {"http://a": "down", "http://b": "ok"})
    timings = asyncio.run(d.encode(req))
    assert {u for u, _ in d.calls} == {"http://a", "http://b"}
    assert req.epd_pending_items == (0, 1, 2)  # zmq_to_scheduler: the scheduler waits for all three
    assert all(it.feature is None and it.precomputed_embeddings is None for it in req.mm_inputs.mm_items)
    assert timings["epd_encode"] == 1.5 and timings["epd_transfer"] >= 0
    assert not d.pool.healthy("http://a") and d.pool.outstanding == {"http://a": 0, "http://b": 0}


def test_zmq_to_tokenizer_attaches_the_embeddings():
    req = _req("r2")

    async def run():
        d = FakeDispatcher(["http://a", "http://b"], {"http://a": "ok", "http://b": "ok"}, inbox=EmbeddingInbox(),
                           backend="zmq_to_tokenizer")
        await d.encode(req)
        return d

    d = asyncio.run(run())
    assert len({u for u, _ in d.calls}) == 2  # spread over both
    assert req.epd_pending_items == ()
    for i, it in enumerate(req.mm_inputs.mm_items):
        assert it.feature is None and torch.equal(it.precomputed_embeddings, torch.full((it.num_tokens, 3), float(i)))


def test_every_encoder_down_is_a_503_at_once():
    req = _req("r3")
    # a timeout far past the bound below: waiting on it instead of failing at once cannot pass
    d = FakeDispatcher(["http://a", "http://b", "http://c"], dict.fromkeys(["http://a", "http://b", "http://c"], "down"),
                       timeout_s=600)
    t0 = time.monotonic()
    with pytest.raises(GenerateError) as e:
        asyncio.run(d.encode(req))
    assert e.value.status_code == 503 and "no encoder could encode" in e.value.message
    assert time.monotonic() - t0 < 60
    assert {u for u, _ in d.calls} == {"http://a", "http://b", "http://c"}
    assert all(v == 0 for v in d.pool.outstanding.values())


def test_an_encoders_400_is_the_requests_400_without_retries():
    req = _req("r4", grids=((1, 4, 4),))
    d = FakeDispatcher(["http://a", "http://b"], {"http://a": "bad", "http://b": "bad"})
    with pytest.raises(GenerateError) as e:
        asyncio.run(d.encode(req))
    assert e.value.status_code == 400 and "corrupt" in e.value.message
    assert len(d.calls) == 1 and d.pool.healthy("http://a")


def test_embeddings_that_never_arrive_are_a_503_within_the_timeout():
    class Silent(FakeDispatcher):
        async def _post(self, url, body):
            return {"ok": True, "encode_ms": 0.0}

    async def run():
        d = Silent(["http://a"], {}, inbox=EmbeddingInbox(), backend="zmq_to_tokenizer", timeout_s=0.2)
        await d.encode(_req("r5"))

    with pytest.raises(GenerateError) as e:
        asyncio.run(run())
    assert e.value.status_code == 503 and "did not arrive" in e.value.message


# ----------------------------------------------------------------------------- scheduler rank 0 (zmq_to_scheduler)
def _pending(rid: str, n: int = 2) -> TokenizedGenerateReqInput:
    req = _req(rid, grids=((1, 2, 2),) * n)
    req.epd_pending_items = tuple(range(n))
    for it in req.mm_inputs.mm_items:
        it.feature = None
    return req


def _emb(rid, idx):
    return EncodedEmbeddings(rid, list(idx), [torch.full((1, 2), float(i)) for i in idx])


def test_rendezvous_holds_a_request_until_all_its_embeddings_came_in_any_order():
    clock = Clock()
    rv = EmbeddingRendezvous(wait_s=10, clock=clock)
    other = TokenizedGenerateReqInput("text", [1], SamplingParams())
    early = _emb("a", [1])
    assert rv.admit([early, _pending("a"), other]) == [other]  # not held up by "a"
    assert len(rv) == 1
    clock.t = 0.5
    out = rv.admit([_emb("a", [0])])
    assert [m.rid for m in out] == ["a"] and len(rv) == 0
    a = out[0]
    assert a.epd_pending_items == () and a.epd_error is None and a.epd_wait_ms == pytest.approx(500)
    assert [float(it.precomputed_embeddings[0, 0]) for it in a.mm_inputs.mm_items] == [0.0, 1.0]


def test_rendezvous_gives_up_after_its_deadline_and_forgets_strays():
    clock = Clock()
    rv = EmbeddingRendezvous(wait_s=2, ttl_s=5, clock=clock)
    assert rv.admit([_pending("b"), _emb("b", [0]), _emb("stray", [0])]) == []
    clock.t = 2.0
    (b,) = rv.admit([])
    assert b.rid == "b" and "1 item(s) did not reach the scheduler within 2 s" in b.epd_error
    clock.t = 6.0
    rv.admit([])
    assert rv.arrived == {} and len(rv) == 0


def test_an_abort_answers_a_held_request():
    """The held request comes out failed (the scheduler answers it), not silently forgotten: on a018ab2 only
    the abort came out and the client never got an answer."""
    rv = EmbeddingRendezvous()
    rv.admit([_pending("c"), _emb("c", [0])])
    abort = AbortReq("c")
    released, passed = rv.admit([abort])
    assert passed is abort and released.rid == "c" and "while waiting for its image embeddings" in released.epd_error
    assert len(rv) == 0 and rv.arrived == {} and rv.arrived_bytes == 0


def test_held_requests_count_against_max_queued_requests():
    """On a018ab2 any number of requests could wait for embeddings beyond --max-queued-requests."""
    rv = EmbeddingRendezvous()
    out = rv.admit([_pending("h1"), _pending("h2"), _pending("h3")], queued=1, limit=3)
    assert [m.rid for m in out] == ["h3"] and out[0].epd_error == "The request queue is full."
    assert set(rv.held) == {"h1", "h2"}
    assert rv.admit([_pending("h4")]) == [] and len(rv) == 3  # no limit given: held as before


def test_strays_are_bounded_in_count_and_bytes_and_expire_without_traffic():
    clock = Clock()
    rv = EmbeddingRendezvous(wait_s=2, ttl_s=5, clock=clock, max_stray=3, max_stray_bytes=10 * 8)
    rv.admit([_pending("held")])
    rv.admit([_emb(f"s{k}", [0]) for k in range(5)])
    assert len(rv.arrived) == 3 and "s4" in rv.arrived and "s0" not in rv.arrived  # oldest dropped first
    big = EncodedEmbeddings("big", [0], [torch.zeros(1, 20)])  # 80 bytes: the byte bound drops the others
    rv.admit([big])
    assert set(rv.arrived) == {"big"} and rv.arrived_bytes == 80
    assert rv.needs_ticks()  # the loop wakes to expire them even when nothing else arrives
    clock.t = 6.0
    rv.admit([])
    assert rv.arrived == {} and rv.arrived_bytes == 0 and rv.dropped == 6


def test_embeddings_of_the_wrong_shape_fail_their_request_only():
    rv = EmbeddingRendezvous()
    good, bad = _pending("good", 1), _pending("bad", 1)
    out = rv.admit([good, bad, _emb("good", [0]), EncodedEmbeddings("bad", [0], [torch.zeros(7, 2)])])
    by = {r.rid: r for r in out}
    assert by["good"].epd_error is None and by["good"].mm_inputs.mm_items[0].precomputed_embeddings is not None
    assert "shape (7, 2)" in by["bad"].epd_error and by["bad"].mm_inputs.mm_items[0].precomputed_embeddings is None


# ----------------------------------------------------------------------------- data-parallel controller
def test_embeddings_follow_their_request_to_its_replica():
    clock = Clock()
    router = EmbeddingRouter(max_routes=2, ttl_s=10, clock=clock)
    assert router.on_embeddings("r1", b"e1") is None  # before its request: kept
    assert router.on_request("r1", 1) == [b"e1"]  # sent ahead of the request
    assert router.on_embeddings("r1", b"e2") == 1
    router.on_request("r2", 0)
    router.on_request("r3", 0)
    assert "r1" not in router.routes  # bounded
    router.on_embeddings("lost", b"x")
    clock.t = 11
    router.expire()
    assert router.early == {}


# ----------------------------------------------------------------------------- the real HTTP client
def test_http_5xx_timeouts_and_refused_connections_move_items_on(tmp_path):
    """EncodeDispatcher._post against live aiohttp servers: a 500, one that hangs past the timeout, a closed
    port; the last encoder answers. Then every one failing: 503 naming each, as soon as the slowest failed."""
    from aiohttp import web

    from sglang.srt.utils.network import pick_unused_port

    async def run():
        hits: dict[str, int] = {}
        release = asyncio.Event()  # the hanging encoder answers only at the end

        def app(kind: str) -> web.Application:
            async def encode(request):
                hits[kind] = hits.get(kind, 0) + 1
                await request.read()
                if kind == "500":
                    return web.Response(status=500, text="boom")
                if kind == "hang":
                    await release.wait()
                return web.json_response({"ok": True, "encode_ms": 2.0})

            async def register(request):
                return web.json_response({"ok": True})

            a = web.Application()
            a.router.add_post("/encode", encode)
            a.router.add_post("/register", register)
            return a

        runners, urls = [], {}
        for kind in ("500", "hang", "ok"):
            runner = web.AppRunner(app(kind))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            urls[kind] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        closed = f"http://127.0.0.1:{pick_unused_port()}"
        try:
            order = [urls["500"], urls["hang"], closed, urls["ok"]]
            d = EncodeDispatcher(order, "zmq_to_scheduler", "tcp://127.0.0.1:1", timeout_s=0.5)
            # every item to the 500 first: the others are reached only through retries
            d.pool.outstanding.update({urls["hang"]: 1, closed: 2, urls["ok"]: 3})
            req = _req("h1", grids=((1, 2, 2),))
            await d.encode(req)
            assert req.epd_pending_items == (0,)
            assert hits == {"500": 1, "hang": 1, "ok": 1}
            assert not d.pool.healthy(urls["500"]) and not d.pool.healthy(closed) and d.pool.healthy(urls["ok"])
            await d.close()

            d = EncodeDispatcher([urls["500"], urls["hang"], closed], "zmq_to_scheduler", "tcp://127.0.0.1:1",
                                 timeout_s=0.5)
            t0 = time.monotonic()
            with pytest.raises(GenerateError) as e:
                await d.encode(_req("h2", grids=((1, 2, 2),)))
            assert time.monotonic() - t0 < 30  # the hanging one is held until the end: waiting on it never ends
            assert e.value.status_code == 503 and "3 tried" in e.value.message and "HTTP 500" in e.value.message
            await d.close()
        finally:
            release.set()
            for r in runners:
                await r.cleanup()

    asyncio.run(run())
