"""The tokenizer side of /update_weights_from_disk on a TokenizerManager with no processes (fake scheduler
replies): a request the scheduler finished no longer holds an update even when its stream is never read; the
wait for requests in flight is bounded (409 naming how many still run, or, asked to, they are aborted and the
update goes on), and requests held at the gate are sent once the update gives up; a caller cancelled between
"load" and "commit" neither stops the commit nor opens the gate early; a --language-only server refuses."""

from __future__ import annotations

import asyncio

import pytest

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchStrOut,
    FinishReason,
    TokenizedGenerateReqInput,
    UpdateWeightFromDiskReqOutput,
)
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.metrics.stage_timer import VlmStageTimer
from sglang.srt.sampling.sampling_params import SamplingParams

GUARD_S = 60.0  # only bounds a failure: every wait below ends on its condition


class _Sock:
    def __init__(self, tm: TokenizerManager):
        self.tm = tm
        self.sent = []
        self.sent_under_update: list[bytes] = []  # requests sent while an update held the gate
        self.on_abort = None  # the fake scheduler's answer to an AbortReq

    async def send(self, payload, copy=False):
        if getattr(self.tm, "_update_gate", None) is not None:
            self.sent_under_update.append(payload)
        self.sent.append(payload)

    def send_pyobj(self, obj):
        self.sent.append(obj)
        if isinstance(obj, AbortReq) and self.on_abort is not None:
            self.on_abort(obj)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class _Builder:
    def take_unsent_shm(self, rid):
        return []


class _Schedulers:
    """Answers the update's phases for one replica; "load" waits for `release_load` when it is cleared."""

    def __init__(self):
        self.phases: list[str] = []
        self.in_flight_at_load: list[int] = []
        self.release_load = asyncio.Event()
        self.release_load.set()

    def attach(self, tm: TokenizerManager) -> None:
        async def control_all(req, timeout):
            self.phases.append(req.phase)
            if req.phase == "load":
                self.in_flight_at_load.append(tm.num_in_flight)
                await self.release_load.wait()
            return [UpdateWeightFromDiskReqOutput(True, "Succeeded." if req.phase == "load" else req.phase, 0)]

        tm._control_all = control_all


def _manager(drain_timeout: float, language_only: bool = False) -> tuple[TokenizerManager, _Schedulers]:
    tm = TokenizerManager.__new__(TokenizerManager)  # only the request plumbing and the update gate are used
    tm.healthy, tm._closing, tm.dead_reason = True, False, None
    tm.rid_to_state, tm.metrics = {}, None
    tm._preparing, tm._aborted_early = {}, set()
    tm.builder, tm.stage_timer = _Builder(), VlmStageTimer(False)
    tm._send_sock = _Sock(tm)
    tm.model_path = "/old"
    tm._init_weight_updates("v0", drain_timeout, language_only)
    schedulers = _Schedulers()
    schedulers.attach(tm)
    return tm, schedulers


def _tokenized(rid: str) -> TokenizedGenerateReqInput:
    return TokenizedGenerateReqInput(rid=rid, input_ids=[1, 2], sampling_params=SamplingParams(max_new_tokens=9),
                                     stream=True)


def _out(rid: str, text: str, fr: FinishReason | None) -> BatchStrOut:
    return BatchStrOut([rid], [text], [[7]], [fr], [2], [1], [0], [{}])


async def _until(pred, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD_S
    while not pred():
        assert loop.time() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.005)


async def _start(tm: TokenizerManager, rid: str):
    """A stream whose request reached the (fake) scheduler, and the task reading its first chunk."""
    stream = tm.generate_tokenized(_tokenized(rid), rid.encode())
    first = asyncio.ensure_future(stream.__anext__())
    await _until(lambda: rid.encode() in tm._send_sock.sent, f"{rid} to be sent")
    return stream, first


async def _collect(stream) -> list[dict]:
    return [out async for out in stream]


def test_a_finished_request_whose_stream_is_unread_does_not_hold_the_update():
    async def scenario():
        tm, schedulers = _manager(drain_timeout=3600.0)  # only the unread stream could hold it
        stream, first = await _start(tm, "unread")
        tm._handle_batch_str_out(_out("unread", "a", None))
        assert (await first)["text"] == "a"
        # the scheduler finishes the request; its client never asks for the rest of the stream
        tm._handle_batch_str_out(_out("unread", "b", FinishReason("length")))
        ok, message = await asyncio.wait_for(tm.update_weights_from_disk("/new", weight_version="v1"), GUARD_S)
        await stream.aclose()
        return tm, schedulers, ok

    tm, schedulers, ok = asyncio.run(scenario())
    assert ok and schedulers.phases == ["load", "commit"] and schedulers.in_flight_at_load == [0]
    assert tm.weight_version == "v1" and tm.num_in_flight == 0


def test_the_drain_is_bounded_and_held_requests_run_once_the_update_gives_up_with_409():
    async def scenario():
        tm, schedulers = _manager(drain_timeout=0.2)
        stream, first = await _start(tm, "long")
        update = asyncio.ensure_future(tm.update_weights_from_disk("/new", weight_version="v1"))
        await _until(lambda: tm._update_lock is not None and tm._update_lock.locked(), "the update to begin")
        newcomer = asyncio.ensure_future(_collect(tm.generate_tokenized(_tokenized("new"), b"new")))
        await asyncio.wait({update}, timeout=GUARD_S)
        assert update.done(), "the update waited past its drain bound"
        with pytest.raises(GenerateError) as e:
            update.result()
        await _until(lambda: b"new" in tm._send_sock.sent, "the held request to be sent after the 409")
        assert tm._send_sock.sent_under_update == []  # held while the update waited
        tm._handle_batch_str_out(_out("new", "n", FinishReason("length")))
        tm._handle_batch_str_out(_out("long", "l", FinishReason("length")))
        await newcomer
        first.cancel()
        await stream.aclose()
        return tm, schedulers, e.value

    tm, schedulers, err = asyncio.run(scenario())
    assert err.status_code == 409 and "1 request(s) still running after 0.2 s" in err.message
    assert "--weight-update-drain-timeout" in err.message and "abort_on_drain_timeout" in err.message
    assert schedulers.phases == [] and tm.weight_version == "v0" and tm.model_path == "/old"


def test_abort_on_drain_timeout_aborts_the_requests_still_running_then_updates():
    async def scenario():
        tm, schedulers = _manager(drain_timeout=0.2)
        stream, first = await _start(tm, "long")
        aborted = []

        def scheduler_aborts(req: AbortReq) -> None:  # ends the request at its next step, and says so
            aborted.append(req.rid)
            asyncio.get_running_loop().call_soon(
                tm._handle_batch_str_out, _out(req.rid, "", FinishReason("abort", message=req.reason)))

        tm._send_sock.on_abort = scheduler_aborts
        ok, _ = await asyncio.wait_for(tm.update_weights_from_disk("/new", abort_on_drain_timeout=True), GUARD_S)
        assert aborted == ["long"]
        last = await first
        await stream.aclose()
        return schedulers, ok, last

    schedulers, ok, last = asyncio.run(scenario())
    # the load went out only once the scheduler had confirmed the abort
    assert ok and schedulers.phases == ["load", "commit"] and schedulers.in_flight_at_load == [0]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"


def test_a_caller_cancelled_between_load_and_commit_does_not_stop_the_commit_or_open_the_gate():
    async def scenario():
        tm, schedulers = _manager(drain_timeout=30.0)
        schedulers.release_load.clear()
        update = asyncio.ensure_future(tm.update_weights_from_disk("/new", weight_version="v1"))
        await _until(lambda: schedulers.phases == ["load"], "the load to start")
        update.cancel()  # the HTTP client disconnected
        await asyncio.wait({update}, timeout=GUARD_S)
        assert update.cancelled()
        newcomer = asyncio.ensure_future(_collect(tm.generate_tokenized(_tokenized("after"), b"after")))
        for _ in range(20):
            await asyncio.sleep(0)
        assert b"after" not in tm._send_sock.sent, "a request was sent between load and commit"
        schedulers.release_load.set()  # the schedulers answer the load
        await _until(lambda: b"after" in tm._send_sock.sent, "the held request after the commit")
        assert schedulers.phases == ["load", "commit"] and tm._send_sock.sent_under_update == []
        tm._handle_batch_str_out(_out("after", "x", FinishReason("length")))
        await newcomer
        # the lock was held by the update until it ended: the next one runs now
        ok, _ = await asyncio.wait_for(tm.update_weights_from_disk("/newer"), GUARD_S)
        return tm, schedulers, ok

    tm, schedulers, ok = asyncio.run(scenario())
    assert ok and schedulers.phases == ["load", "commit", "load", "commit"]
    assert tm.weight_version == "v1" and tm.model_path == "/newer"


def test_a_language_only_server_refuses_updates_naming_the_encoders():
    async def scenario():
        tm, schedulers = _manager(drain_timeout=30.0, language_only=True)
        with pytest.raises(GenerateError) as e:
            await tm.update_weights_from_disk("/new")
        return schedulers, e.value

    schedulers, err = asyncio.run(scenario())
    assert err.status_code == 400 and "--language-only" in err.message and "encoder" in err.message
    assert schedulers.phases == []


def test_the_drain_bound_is_a_flag_and_must_be_positive():
    from sglang.srt.server_args import ServerArgs

    assert ServerArgs.from_argv(["--weight-update-drain-timeout", "2.5"]).weight_update_drain_timeout == 2.5
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="--weight-update-drain-timeout must be a finite number of seconds > 0"):
            ServerArgs(weight_update_drain_timeout=bad)
