"""Control replies (flush cache, server info) resolve the waiter whose id they carry: a reply that
arrives after its waiter timed out is dropped instead of answering the next request."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from sglang.srt.managers.io_struct import GetServerInfoReq, GetServerInfoReqOutput
from sglang.srt.errors import GenerateError
from sglang.srt.managers.tokenizer_manager import TokenizerManager


class _Sock:
    def __init__(self):
        self.sent = []

    async def send_pyobj(self, obj):
        self.sent.append(obj)


def _manager() -> TokenizerManager:
    tm = TokenizerManager.__new__(TokenizerManager)  # no processes: only the control plumbing is used
    tm.healthy, tm._closing, tm.dead_reason = True, False, None
    tm._control_waiters, tm._control_ids = {}, itertools.count(1)
    tm._send_sock = _Sock()
    return tm


def test_late_reply_is_dropped_and_the_next_waiter_gets_its_own():
    async def scenario():
        tm = _manager()
        with pytest.raises(GenerateError) as e:
            await tm._control_all(GetServerInfoReq(), timeout=0.01)
        assert e.value.status_code == 504
        first_id = tm._send_sock.sent[0].req_id
        second = asyncio.ensure_future(tm._control_all(GetServerInfoReq(), timeout=5))
        while len(tm._send_sock.sent) < 2:
            await asyncio.sleep(0)
        second_id = tm._send_sock.sent[1].req_id
        assert second_id != first_id
        tm._resolve_control(GetServerInfoReqOutput({"who": "late reply to the first"}, req_id=first_id))
        assert not second.done()  # the late reply did not resolve the wrong waiter
        tm._resolve_control(GetServerInfoReqOutput({"who": "second"}, req_id=second_id))
        (out,) = await second
        assert out.info == {"who": "second"}
        assert tm._control_waiters == {}

    asyncio.run(scenario())


def test_replies_out_of_order_reach_their_own_waiters():
    async def scenario():
        tm = _manager()
        a = asyncio.ensure_future(tm._control_all(GetServerInfoReq(), timeout=5))
        b = asyncio.ensure_future(tm._control_all(GetServerInfoReq(), timeout=5))
        while len(tm._send_sock.sent) < 2:
            await asyncio.sleep(0)
        ida, idb = (m.req_id for m in tm._send_sock.sent)
        tm._resolve_control(GetServerInfoReqOutput({"n": "b"}, req_id=idb))
        tm._resolve_control(GetServerInfoReqOutput({"n": "a"}, req_id=ida))
        assert (await a)[0].info == {"n": "a"} and (await b)[0].info == {"n": "b"}

    asyncio.run(scenario())


def test_a_control_request_waits_for_every_replica_and_get_load_orders_them():
    """At --dp-size 2 each control request is answered by both replicas: the first reply alone resolves
    nothing, and /get_load lists the replicas by dp_rank whatever order they answered in."""
    from sglang.srt.managers.io_struct import GetLoadReqOutput

    async def scenario():
        tm = _manager()
        tm.dp_size = 2
        task = asyncio.ensure_future(tm.get_load(timeout=5))
        while not tm._send_sock.sent:
            await asyncio.sleep(0)
        rid = tm._send_sock.sent[0].req_id
        tm._resolve_control(GetLoadReqOutput(dp_rank=1, num_reqs=3, num_waiting_reqs=1, num_tokens=70,
                                              num_pending_tokens=20, ts_tic=5.0, req_id=rid))
        await asyncio.sleep(0)
        assert not task.done()
        tm._resolve_control(GetLoadReqOutput(dp_rank=0, num_reqs=0, num_waiting_reqs=0, num_tokens=0, req_id=rid))
        loads = await task
        assert loads == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0,
                          "num_pending_tokens": 0, "ts_tic": 0.0},
                         {"dp_rank": 1, "num_reqs": 3, "num_waiting_reqs": 1, "num_tokens": 70,
                          "num_pending_tokens": 20, "ts_tic": 5.0}]
        assert tm._control_waiters == {}

    asyncio.run(scenario())
