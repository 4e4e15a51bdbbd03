"""The receiver's handle cache on CPU with a fake opener: one open per (process, pool) when on, one
open and close per read when off (the baseline), stale entries reopened, a failing cached read
invalidated and retried exactly once."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.multimodal.transport.cuda_ipc_handle_cache import IpcHandleCache, OpenedPool
from sglang.srt.multimodal.transport.cuda_ipc_pool import PoolDesc


def _desc(pool_id="p1", handle=(b"h1",)):
    return PoolDesc(pool_id, "host", handle, 64, f"board_{pool_id}", 4, 1)


class FakeOpener:
    def __init__(self):
        self.opened: list[PoolDesc] = []
        self.closed = 0
        self.fail_next = 0

    def __call__(self, desc):
        if self.fail_next:
            self.fail_next -= 1
            raise OSError("cannot open")
        self.opened.append(desc)
        base = torch.arange(desc.nbytes, dtype=torch.uint8)
        return OpenedPool(base, None, self._on_close)

    def _on_close(self):
        self.closed += 1


def test_cached_pool_is_opened_once_per_pool():
    op = FakeOpener()
    c = IpcHandleCache(op, enabled=True)
    for _ in range(10):
        assert c.read(_desc(), lambda b: int(b[5])) == 5
    c.read(_desc("p2"), lambda b: None)
    assert len(op.opened) == 2 and op.closed == 0 and len(c) == 2
    assert (c.stats.hits, c.stats.misses, c.stats.opens) == (9, 2, 2)
    assert c.close_all() == 2 and op.closed == 2


def test_switch_off_opens_and_closes_per_read_and_finishes_reads_first():
    op = FakeOpener()
    c = IpcHandleCache(op, enabled=False)
    finished = []
    for i in range(5):
        c.read(_desc(), lambda b: i, done=finished.append)
    assert len(op.opened) == 5 and op.closed == 5 and len(c) == 0 and finished == [0, 1, 2, 3, 4]
    assert c.stats.hits == 0 and c.stats.opens == c.stats.closes == 5


def test_stale_entry_is_reopened():
    op = FakeOpener()
    c = IpcHandleCache(op)
    c.read(_desc(handle=(b"old",)), lambda b: None)
    c.read(_desc(handle=(b"new",)), lambda b: None)  # same id, another export
    assert [d.handle for d in op.opened] == [(b"old",), (b"new",)] and op.closed == 1
    assert c.stats.invalidations == 1 and c.stats.misses == 2


def test_failing_cached_read_is_retried_once_on_a_fresh_open():
    op = FakeOpener()
    c = IpcHandleCache(op)
    c.read(_desc(), lambda b: None)
    calls = []

    def flaky(b):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("invalid device pointer")
        return "ok"

    assert c.read(_desc(), flaky) == "ok"
    assert len(op.opened) == 2 and op.closed == 1 and c.stats.retries == 1

    def broken(b):
        raise RuntimeError("still broken")

    with pytest.raises(RuntimeError, match="still broken"):
        c.read(_desc(), broken)
    assert c.stats.retries == 2 and len(c) == 0  # the failed entry is not kept
    op.fail_next = 1
    with pytest.raises(OSError):
        c.read(_desc(), lambda b: None)
    assert c.read(_desc(), lambda b: "back") == "back"


def test_unrelated_errors_are_not_retried():
    op = FakeOpener()
    c = IpcHandleCache(op)
    c.read(_desc(), lambda b: None)
    with pytest.raises(KeyError):
        c.read(_desc(), lambda b: {}["x"])
    assert len(op.opened) == 1 and c.stats.retries == 0
