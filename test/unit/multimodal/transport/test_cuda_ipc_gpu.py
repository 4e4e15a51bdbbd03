"""cuda_ipc on a real GPU: the pool's CUDA IPC export opened in other processes (once with the handle
cache, once per item without), bytes equal, slices released by the ranks' stamps."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

from sglang.srt.multimodal.transport.shm import SHM_DIR, segment_prefix

pytestmark = pytest.mark.gpu
PREFIX = segment_prefix(7, os.getpid())


def _rank(ptrs, rank, cached, q):
    import torch

    from sglang.srt.multimodal.transport.cuda_ipc import CudaIpcReceiver
    from sglang.srt.multimodal.transport.cuda_ipc_handle_cache import IpcHandleCache

    torch.cuda.set_device(0)
    rx = CudaIpcReceiver(rank, IpcHandleCache(enabled=cached), debug=True)
    sums = [float(rx.materialize(p).double().sum()) for p in ptrs]
    torch.cuda.synchronize()
    rx.poll()
    q.put((sums, rx.stats()))
    rx.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cached", [True, False])
def test_ranks_open_the_pool_across_processes(cached):
    from sglang.srt.multimodal.transport.cuda_ipc import CudaIpcSender
    from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool

    sender = CudaIpcSender(CudaIpcPool(64 << 20, 2, PREFIX, kind="cuda", device="cuda:0"), None)
    try:
        items = [torch.full((3680, 1536 // 16), float(i + 1)) for i in range(8)]
        ptrs = [sender.to_pool(t) for t in items]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(ptrs, r, cached, q)) for r in range(2)]
        for p in procs:
            p.start()
        results = [q.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        for sums, stats in results:
            assert sums == [float(t.double().sum()) for t in items]
            assert stats["mm_ipc_handle_opens"] == (1 if cached else 8)
            assert stats["mm_ipc_handle_hits"] == (7 if cached else 0)
        assert sender.pool.reclaim() == 8 and sender.pool.free_bytes == sender.pool.capacity
    finally:
        sender.close()
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)] == []
