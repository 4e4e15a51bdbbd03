"""TokenizerManager.abort_request (/abort_request): the request stays registered until the scheduler
reports it finished with reason "abort", and its caller gets that as its last output (not an
error); unknown ids are ignored; abort_all reaches every request. Aborts carrying a status stay
errors."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang.srt.managers.io_struct import AbortReq, BatchStrOut, FinishReason, GenerateReqInput, TokenizedGenerateReqInput
from sglang.srt.errors import GenerateError
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.metrics.stage_timer import VlmStageTimer


class _Sock:
    def __init__(self):
        self.sent = []

    async def send(self, payload, copy=False):
        self.sent.append(payload)

    def send_pyobj(self, obj):
        self.sent.append(obj)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class _Builder:
    """Stands in for the request builder; `build` waits for `release` (images still decoding)."""

    def __init__(self):
        self.release = threading.Event()
        self.taken = []

    def check(self, obj, rid):
        return rid

    def build(self, rid):
        assert self.release.wait(10)
        return _tokenized(rid), b"payload"

    def take_unsent_shm(self, rid):
        self.taken.append(rid)
        return []


def _manager() -> TokenizerManager:
    tm = TokenizerManager.__new__(TokenizerManager)  # no processes: only the request plumbing is used
    tm.healthy, tm._closing, tm.dead_reason = True, False, None
    tm.rid_to_state, tm.metrics = {}, None
    tm._preparing, tm._aborted_early = {}, set()
    tm.builder, tm.stage_timer = _Builder(), VlmStageTimer(False)
    tm._send_sock = _Sock()
    return tm


def _tokenized(rid: str) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(rid=rid, input_ids=[1, 2], sampling_params=SamplingParams(max_new_tokens=9),
                                     stream=True)


def _out(rid: str, text: str, fr: FinishReason | None) -> BatchStrOut:
    return BatchStrOut([rid], [text], [[7]], [fr], [2], [1], [0], [{}])


def _aborts(tm) -> list[AbortReq]:
    return [m for m in tm._send_sock.sent if isinstance(m, AbortReq)]


def test_abort_request_ends_the_stream_with_finish_reason_abort():
    async def scenario():
        tm = _manager()
        outs = []

        async def client():
            async for out in tm.generate_tokenized(_tokenized("a"), b"payload"):
                outs.append(out)

        task = asyncio.ensure_future(client())
        await asyncio.sleep(0)
        tm._handle_batch_str_out(_out("a", "Hi", None))
        await asyncio.sleep(0)
        assert tm.abort_request("unknown") == 0 and _aborts(tm) == []
        assert tm.abort_request("a") == 1
        assert [(m.rid, m.reason) for m in _aborts(tm)] == [("a", "aborted by an abort_request")]
        assert "a" in tm.rid_to_state  # kept until the scheduler reports it finished
        tm._handle_batch_str_out(_out("a", "!", FinishReason("abort", message="aborted by an abort_request")))
        await asyncio.wait_for(task, 1)
        assert outs[-1]["text"] == "Hi!"
        assert outs[-1]["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted by an abort_request"}
        assert tm.rid_to_state == {} and len(_aborts(tm)) == 1  # finished normally: no second abort

    asyncio.run(scenario())


def test_abort_all_reaches_every_request():
    async def scenario():
        tm = _manager()
        gens = [tm.generate_tokenized(_tokenized(r), b"p") for r in ("x", "y")]
        tasks = [asyncio.ensure_future(g.__anext__()) for g in gens]
        await asyncio.sleep(0)
        assert tm.abort_request(abort_all=True) == 2
        assert sorted(m.rid for m in _aborts(tm)) == ["x", "y"]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())


def test_abort_with_a_status_is_still_an_error():
    async def scenario():
        tm = _manager()
        gen = tm.generate_tokenized(_tokenized("b"), b"p")
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        tm._handle_batch_str_out(_out("b", "", FinishReason("abort", message="bad input", status_code=400)))
        with pytest.raises(GenerateError) as e:
            await task
        assert e.value.status_code == 400 and e.value.message == "bad input"

    asyncio.run(scenario())


def test_a_caller_that_leaves_aborts_and_forgets_its_request():
    async def scenario():
        tm = _manager()
        gen = tm.generate_tokenized(_tokenized("c"), b"p")
        task = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert tm.rid_to_state == {}
        assert [(m.rid, m.reason) for m in _aborts(tm)] == [("c", "aborted by client")]

    asyncio.run(scenario())


def test_an_abort_while_the_request_is_still_being_prepared_ends_it_before_it_is_sent():
    async def main():
        tm = _manager()
        tm._request_pool = ThreadPoolExecutor(1)
        prep = asyncio.ensure_future(tm.tokenize_request(GenerateReqInput(text="x", rid="early")))
        while "early" not in tm._preparing:
            await asyncio.sleep(0)
        with pytest.raises(GenerateError, match="already in use"):
            await tm.tokenize_request(GenerateReqInput(text="x", rid="early"))
        assert tm.abort_request("early") == 1
        tm.builder.release.set()
        tokenized, payload = await prep
        outs = [o async for o in tm.generate_tokenized(tokenized, payload)]
        assert len(outs) == 1 and outs[0]["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted by an abort_request"}
        assert tm._send_sock.sent == []  # never reached a scheduler
        assert tm.builder.taken == ["early"] and tm._preparing == {} and tm._aborted_early == set() and tm.rid_to_state == {}
        # the same id is free again, and without an abort a prepared request is sent as usual
        tokenized, payload = await tm.tokenize_request(GenerateReqInput(text="x", rid="early"))
        gen = tm.generate_tokenized(tokenized, payload)
        task = asyncio.ensure_future(gen.__anext__())
        while not tm._send_sock.sent:
            await asyncio.sleep(0)
        assert tm._send_sock.sent == [b"payload"] and "early" in tm.rid_to_state
        task.cancel()
        tm._request_pool.shutdown()

    asyncio.run(main())


def test_abort_all_reaches_requests_still_being_prepared():
    async def main():
        tm = _manager()
        tm._preparing = {"p1": 0.0, "p2": 0.0}
        tm.rid_to_state = {}
        assert tm.abort_request(abort_all=True) == 2 and tm._aborted_early == {"p1", "p2"}
        outs = [o async for o in tm.generate_tokenized(_tokenized("p1"))]
        assert outs[-1]["meta_info"]["finish_reason"]["type"] == "abort" and tm._send_sock.sent == []

    asyncio.run(main())


def test_ids_only_outputs_have_no_text_key_streamed_or_final():
    """--skip-tokenizer-init (`ids_only`): chunks and the final output carry output_ids, no text (upstream's shape)."""
    async def scenario():
        tm = _manager()
        tm.ids_only = True
        outs = []

        async def client():
            async for out in tm.generate_tokenized(_tokenized("a"), b"payload"):
                outs.append(out)

        task = asyncio.ensure_future(client())
        await asyncio.sleep(0)
        tm._handle_batch_str_out(_out("a", "", None))
        await asyncio.sleep(0)
        tm._handle_batch_str_out(_out("a", "", FinishReason("length")))
        await asyncio.wait_for(task, 1)
        assert [o["output_ids"] for o in outs] == [[7], [7, 7]] and all("text" not in o for o in outs)
        assert outs[-1]["meta_info"]["finish_reason"] == {"type": "length"}

    asyncio.run(scenario())
