"""Sender -> pickle -> receiver on CPU (the pool in /dev/shm, opened by the real host opener): tensors
equal the originals, slices return once every rank has read them, the handle cache opens the pool
once (switch on) or per item (switch off), and debug mode catches a read of a freed slice."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs
from sglang.srt.multimodal.transport import cuda_ipc
from sglang.srt.multimodal.transport.cuda_ipc import (
    CudaIpcReceiver,
    CudaIpcSender,
    StaleSliceError,
    materialize_ipc_features,
)
from sglang.srt.multimodal.transport.cuda_ipc_handle_cache import IpcHandleCache
from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool
from sglang.srt.multimodal.transport.shm import segment_prefix

PREFIX = segment_prefix(5, os.getpid())


class _Req:
    def __init__(self, mm_inputs):
        self.mm_inputs = mm_inputs


@pytest.fixture
def sender():
    s = CudaIpcSender(CudaIpcPool(1 << 20, 2, PREFIX, kind="host", max_slots=64), None)
    yield s
    s.close()


def _request(seed: int, n: int = 3):
    g = torch.Generator().manual_seed(seed)
    return MultimodalInputs([MultimodalDataItem(Modality.IMAGE, torch.randn(16 + i, 8, generator=g)) for i in range(n)])


@pytest.mark.parametrize("cached", [True, False])
def test_two_ranks_read_the_pixels_and_release_the_slices(sender, cached):
    originals, wire = [], []
    for seed in range(4):
        mm = _request(seed)
        originals.append([it.feature.clone() for it in mm.mm_items])
        sender.items_to_pool(mm)
        wire.append(pickle.dumps(_Req(mm)))
    receivers = [CudaIpcReceiver(r, IpcHandleCache(enabled=cached)) for r in range(2)]
    for rank, rx in enumerate(receivers):
        for raw, want in zip(wire, originals):
            req = pickle.loads(raw)
            for it in req.mm_inputs.mm_items:
                it.feature = rx.materialize(it.feature)
            rx.poll()
            assert all(torch.equal(it.feature, w) for it, w in zip(req.mm_inputs.mm_items, want))
        if rank == 0:
            assert sender.pool.reclaim() == 0  # rank 1 has not read anything yet
    assert sender.pool.reclaim() == 12 and sender.pool.free_bytes == sender.pool.capacity
    st = receivers[0].cache.stats
    assert (st.opens, st.hits) == ((1, 11) if cached else (12, 0))
    assert st.closes == (0 if cached else 12)
    for rx in receivers:
        rx.close()


def test_debug_mode_catches_a_freed_slice(sender):
    mm = _request(0, 1)
    sender.items_to_pool(mm)
    ptr = mm.mm_items[0].feature
    sender.pool.discard(ptr.slot, ptr.generation)  # a lifecycle bug: freed before the ranks read it
    rx = CudaIpcReceiver(0, IpcHandleCache(), debug=True)
    with pytest.raises(StaleSliceError, match="generation"):
        rx.materialize(ptr)
    rx.close()


def test_module_hook_materializes_messages_once_per_process(sender, monkeypatch):
    monkeypatch.setattr(cuda_ipc, "_RECEIVER", None)
    reqs = []
    for seed in range(3):
        mm = _request(seed, 2)
        sender.items_to_pool(mm)
        reqs.append(pickle.loads(pickle.dumps(_Req(mm))))
    assert materialize_ipc_features(reqs + [object()], rank=0) == 6
    assert all(isinstance(it.feature, torch.Tensor) for r in reqs for it in r.mm_inputs.mm_items)
    stats = cuda_ipc.ipc_receiver_stats()
    assert stats["mm_ipc_handle_opens"] == 1 and stats["mm_ipc_handle_hits"] == 5 and stats["mm_ipc_items"] == 6
    assert (sender.pool.board.done[:, 0] != 0).sum() == 6
    cuda_ipc.close_receiver()
    assert cuda_ipc.ipc_receiver_stats() == {}
