"""The tokenizer side of cuda_ipc on CPU (pool in /dev/shm): items become pointers, a full pool waits
briefly and then sends that item through shared memory (counted), errors roll the request back, and
`release_unsent` returns the slices of a request that never reached a scheduler."""

from __future__ import annotations

import os

import pytest
import torch

from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs
from sglang.srt.multimodal.transport.cuda_ipc import CudaIpcPointerMMData, CudaIpcSender, release_unsent
from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool
from sglang.srt.multimodal.transport.shm import SHM_DIR, ShmPointerMMData, segment_prefix

PREFIX = segment_prefix(4, os.getpid())


def _mm(*sizes):
    return MultimodalInputs([MultimodalDataItem(Modality.IMAGE, torch.full((n, 4), float(i)))
                             for i, n in enumerate(sizes)])


@pytest.fixture
def sender():
    pool = CudaIpcPool(16 * 1024, 1, PREFIX, kind="host", max_slots=8)
    s = CudaIpcSender(pool, PREFIX, wait_s=0.01)
    yield s
    s.close()
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)] == []


def test_items_become_pointers_and_unsent_ones_are_released(sender):
    mm = _mm(10, 20, 30)
    names = sender.items_to_pool(mm)
    assert all(isinstance(it.feature, CudaIpcPointerMMData) for it in mm.mm_items)
    assert len(names) == 3 and sender.pool.num_outstanding == 3
    assert release_unsent(names) == 3 and release_unsent(names) == 0  # idempotent
    assert sender.pool.free_bytes == sender.pool.capacity


def test_full_pool_falls_back_to_shared_memory_per_item(sender, caplog):
    mm = _mm(600, 600, 10)  # 9.6 KB each: the second does not fit in 16 KB
    names = sender.items_to_pool(mm, rid="r1")
    kinds = [type(it.feature) for it in mm.mm_items]
    assert kinds == [CudaIpcPointerMMData, ShmPointerMMData, CudaIpcPointerMMData]
    assert torch.equal(mm.mm_items[1].feature.materialize(), torch.full((600, 4), 1.0))
    assert sender.fallback_count == 1 and sender.stats()["cuda_ipc_fallback_count"] == 1
    assert "feature pool is full" in caplog.text
    release_unsent(names)
    assert sender.pool.free_bytes == sender.pool.capacity


def test_without_shm_a_full_pool_leaves_the_item_inline():
    pool = CudaIpcPool(4096, 1, PREFIX, kind="host", max_slots=8)
    s = CudaIpcSender(pool, None, wait_s=0.0)
    try:
        mm = _mm(600)
        assert s.items_to_pool(mm) == [] and isinstance(mm.mm_items[0].feature, torch.Tensor)
    finally:
        s.close()


def test_an_error_rolls_the_whole_request_back(sender, monkeypatch):
    mm = _mm(10, 20)
    originals = [it.feature for it in mm.mm_items]
    calls = []

    def failing(dst, src):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("copy failed")
        dst.copy_(src.reshape(-1).view(torch.uint8))

    monkeypatch.setattr(sender, "_copy_in", failing)
    with pytest.raises(RuntimeError):
        sender.items_to_pool(mm)
    assert [it.feature for it in mm.mm_items] == originals
    assert sender.pool.free_bytes == sender.pool.capacity and sender.pool.num_outstanding == 0
