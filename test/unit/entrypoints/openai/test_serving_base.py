"""The HTTP helpers every endpoint shares (serving_base): error bodies, SSE framing and closing,
draining generations, giving up on a client that went away, finish reasons and usage."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from sglang.srt.entrypoints.openai.serving_base import (
    SSE_DONE,
    error_body,
    error_response,
    finish_reason_str,
    json_response,
    parse_json_body,
    sampling_from_request,
    sse,
    sse_stream,
    usage_from_meta,
)
from sglang.srt.entrypoints.openai.streams import collect_until_disconnect, drain, gather_finals
from sglang.srt.errors import GenerateError, ServerUnhealthyError


class _Gen:
    """An async iterator over `items` that records whether it was closed and can fail or hang."""

    def __init__(self, items, fail: GenerateError | None = None, hang: bool = False):
        self.items, self.fail, self.hang = list(items), fail, hang
        self.closed = False
        self.cancelled = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.items:
            return self.items.pop(0)
        if self.fail is not None:
            raise self.fail
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        raise StopAsyncIteration

    async def aclose(self):
        self.closed = True


async def _collect(agen):
    return [x async for x in agen]


def test_error_body_and_response():
    err = GenerateError("bad thing", 422, "invalid_request_error")
    assert error_body(err) == {"error": {"message": "bad thing", "type": "invalid_request_error", "code": 422}}
    resp = error_response(ServerUnhealthyError("down"))
    assert resp.status_code == 503 and resp.media_type == "application/json"
    assert orjson.loads(resp.body) == {"error": {"message": "down", "type": "service_unavailable", "code": 503}}
    assert json_response({"a": 1}, 201).status_code == 201


def test_parse_json_body_names_the_problem():
    assert parse_json_body(b'{"x": 1}') == {"x": 1}
    with pytest.raises(GenerateError, match="invalid JSON body"):
        parse_json_body(b"{")
    with pytest.raises(GenerateError, match="must be a JSON object, got list"):
        parse_json_body(b"[1]")


def test_sse_frames_and_done():
    assert sse({"a": "é"}) == b'data: {"a":"\xc3\xa9"}\n\n'
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_sse_stream_ends_with_done_and_closes_both_iterators():
    outputs = _Gen([{"n": 1}, {"n": 2}])
    events = _Gen([{"e": 1}])
    chunks = asyncio.run(_collect(sse_stream(events, outputs)))
    assert chunks == [sse({"e": 1}), SSE_DONE]
    assert events.closed and outputs.closed


def test_sse_stream_turns_a_generate_error_into_one_error_event():
    events = _Gen([{"n": 1}], fail=GenerateError("scheduler gone", 503, "service_unavailable"))
    chunks = asyncio.run(_collect(sse_stream(events)))
    assert chunks == [sse({"n": 1}), sse(error_body(events.fail)), SSE_DONE]
    assert events.closed


def test_sse_stream_closes_the_generation_when_the_reader_stops_early():
    async def scenario():
        outputs = _Gen([{"n": i} for i in range(10)])
        stream = sse_stream(outputs)
        assert await stream.__anext__() == sse({"n": 0})
        await stream.aclose()  # the response stopped reading: the generation must be closed (aborted)
        return outputs

    assert asyncio.run(scenario()).closed


def test_drain_returns_the_last_item_or_none():
    assert asyncio.run(drain(_Gen([1, 2, 3]))) == 3
    assert asyncio.run(drain(_Gen([]))) is None


def test_gather_finals_keeps_order_and_cancels_on_close():
    async def scenario():
        finals = await _collect(gather_finals([_Gen([1, 2]), _Gen(["a"])]))
        assert finals == [[2, "a"]]
        hanging = _Gen([], hang=True)
        agen = gather_finals([hanging])
        task = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        return hanging

    assert asyncio.run(scenario()).cancelled


class _Request:
    def __init__(self, disconnect_after: float | None):
        self.disconnect_after = disconnect_after

    async def receive(self):
        if self.disconnect_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.disconnect_after)
        return {"type": "http.disconnect"}


def test_collect_until_disconnect():
    async def scenario():
        assert await collect_until_disconnect(_Request(None), _Gen([1, 2])) == 2
        hanging = _Gen([1], hang=True)
        assert await collect_until_disconnect(_Request(0.01), hanging) is None
        await asyncio.sleep(0)
        assert hanging.cancelled  # the generation was cancelled, which aborts its request
        with pytest.raises(GenerateError, match="boom"):
            await collect_until_disconnect(_Request(None), _Gen([], fail=GenerateError("boom")))

    asyncio.run(scenario())


def test_finish_reason_and_usage():
    assert finish_reason_str(None) is None
    assert finish_reason_str({"type": "length"}) == "length"
    assert finish_reason_str({"type": "abort", "message": "aborted"}) == "abort"
    assert finish_reason_str({"type": "stop", "matched": 5}) == "stop"
    assert finish_reason_str({}) == "stop"
    usage = usage_from_meta({"prompt_tokens": 7, "completion_tokens": 3, "cached_tokens": 4})
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (7, 3, 10)
    assert usage.prompt_tokens_details.cached_tokens == 4


def test_sampling_from_request_takes_a_zero_limit_and_refuses_a_negative_one_by_name():
    class Req:
        temperature = top_p = top_k = min_p = seed = stop = stop_token_ids = stop_regex = None
        frequency_penalty = presence_penalty = repetition_penalty = min_tokens = logit_bias = custom_params = None
        ignore_eos, skip_special_tokens, n, no_stop_trim = False, True, 1, False

        def logprob_params(self):
            return {"return_logprob": False, "top_logprobs_num": 0}

    assert sampling_from_request(Req(), 5)["max_new_tokens"] == 5
    assert sampling_from_request(Req(), None)["max_new_tokens"] is None
    assert sampling_from_request(Req(), 0)["max_new_tokens"] == 0  # prompt scoring: no output token
    with pytest.raises(GenerateError, match="max_completion_tokens must be at least 0, got -1"):
        sampling_from_request(Req(), -1, "max_completion_tokens")


# ----------------------------------------------------------------------------- held streams
def test_a_held_stream_turns_an_early_failure_into_its_status_and_closes_the_others():
    """A full queue answers a stream before it runs: the status is the 503, not a 200 whose stream carries
    the error (a018ab2 held only constrained streams)."""
    import asyncio

    from sglang.srt.entrypoints.openai.streams import hold_for_first_output
    from sglang.srt.errors import GenerateError

    closed = []

    async def ok():
        try:
            yield {"text": "a"}
            yield {"text": "b"}
        finally:
            closed.append("ok")

    async def full():
        raise GenerateError("The request queue is full.", 503, "service_unavailable")
        yield  # pragma: no cover

    async def run():
        streams = await hold_for_first_output(None, [ok()])
        got = [x async for x in streams[0]]
        assert got == [{"text": "a"}, {"text": "b"}]  # the held first output is not lost
        try:
            await hold_for_first_output(None, [ok(), full()])
        except GenerateError as e:
            return e

    e = asyncio.run(run())
    assert e.status_code == 503 and closed == ["ok", "ok"]


def test_a_client_that_leaves_while_its_stream_is_held_aborts_it():
    import asyncio

    from sglang.srt.entrypoints.openai.streams import ClientGone, hold_for_first_output

    closed = []

    class Leaving:
        async def receive(self):
            return {"type": "http.disconnect"}

    async def never():
        try:
            await asyncio.Event().wait()
            yield {}
        finally:
            closed.append(True)

    async def run():
        try:
            await hold_for_first_output(Leaving(), [never()])
        except ClientGone:
            return True

    assert asyncio.run(run()) and closed == [True]
