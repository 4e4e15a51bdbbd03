"""The tokenizer side of /update_weights_from_disk on a fake host: the update waits for requests in flight
and holds new ones back, abort_all_requests aborts first, every replica commits only when all loaded
(else all roll back), and weight_version changes only with a commit; the body's fields are checked."""

from __future__ import annotations

import asyncio

import pytest

from sglang.srt.entrypoints.weight_routes import update_weights_request
from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqOutput
from sglang.srt.managers.tokenizer_update_weights_mixin import TokenizerUpdateWeightsMixin


class FakeHost(TokenizerUpdateWeightsMixin):
    def __init__(self, replica_ok: list[bool]):
        self._init_weight_updates("v0")
        self.model_path = "/old"
        self.replica_ok = replica_ok
        self.phases: list[str] = []
        self.aborted = 0

    async def _control_all(self, req, timeout):
        self.phases.append(req.phase)
        if req.phase == "load":
            return [UpdateWeightFromDiskReqOutput(ok, "Succeeded." if ok else f"replica {k} failed", k)
                    for k, ok in enumerate(self.replica_ok)]
        return [UpdateWeightFromDiskReqOutput(True, req.phase, k) for k in range(len(self.replica_ok))]

    def abort_request(self, rid="", abort_all=False):
        self.aborted += 1
        return 0


def test_the_update_waits_for_requests_in_flight_and_holds_new_ones():
    async def run():
        host = FakeHost([True, True])
        request = object()
        host._request_started(request)  # one request in flight
        update = asyncio.ensure_future(host.update_weights_from_disk("/new", weight_version="v1"))
        await asyncio.sleep(0)
        newcomer = asyncio.ensure_future(host._wait_weights_ready())
        for _ in range(5):
            await asyncio.sleep(0)
        assert host.phases == [] and not newcomer.done()  # nothing loads under a running request
        host._request_ended(request)
        ok, message = await update
        await newcomer  # the gate opens again
        return host, ok, message

    host, ok, message = asyncio.run(run())
    assert ok and host.phases == ["load", "commit"]
    assert host.weight_version == "v1" and host.model_path == "/new"
    assert "Weight version updated to v1." in message


def test_one_failing_replica_rolls_every_replica_back():
    async def run():
        host = FakeHost([True, False])
        return host, await host.update_weights_from_disk("/bad", weight_version="v1", abort_all_requests=True)

    host, (ok, message) = asyncio.run(run())
    assert not ok and message == "replica 1 failed"
    assert host.phases == ["load", "rollback"] and host.aborted == 1
    assert host.weight_version == "v0" and host.model_path == "/old"


def test_body_fields():
    assert update_weights_request({"model_path": "/m"}) == {
        "model_path": "/m", "load_format": None, "abort_all_requests": False, "weight_version": None,
        "flush_cache": True, "abort_on_drain_timeout": False}
    assert update_weights_request({"model_path": "/m", "is_async": False, "token_step": 3})["model_path"] == "/m"
    for body, words in (({}, "model_path"), ({"model_path": "/m", "is_async": True}, "is_async"),
                        ({"model_path": "/m", "what": 1}, "Unrecognized request argument supplied: what"),
                        ({"model_path": "/m", "abort_all_requests": "yes"}, "abort_all_requests")):
        with pytest.raises(GenerateError, match=words):
            update_weights_request(body)
