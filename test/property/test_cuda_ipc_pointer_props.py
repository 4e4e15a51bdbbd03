"""CudaIpcPointerMMData: any number of pickle round trips keep every field, the pickle is metadata only
(well under 1 KB whatever the tensor size), and the bytes the sender copied into the pool are the
tensor's bytes at the pointer's offset."""

from __future__ import annotations

import os
import pickle

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.multimodal.transport.cuda_ipc import CudaIpcPointerMMData, CudaIpcSender
from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool, PoolDesc
from sglang.srt.multimodal.transport.shm import segment_prefix

DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.int64])
SHAPES = st.lists(st.integers(0, 40), min_size=1, max_size=3).map(tuple)


@settings(max_examples=100, deadline=None)
@given(pool_id=st.text("0123456789abcdef", min_size=12, max_size=12), slot=st.integers(0, 8191),
       offset=st.integers(0, 2**40), shape=SHAPES, dtype=st.sampled_from(["float32", "bfloat16", "uint8"]),
       gen=st.integers(1, 2**32 - 1), trips=st.integers(1, 5),
       handle=st.tuples(st.integers(0, 7), st.binary(max_size=64), st.integers(0, 2**33)))
def test_round_trips_keep_metadata_only(pool_id, slot, offset, shape, dtype, gen, trips, handle):
    desc = PoolDesc(pool_id, "cuda", handle, 4 << 30, f"sglang_mm_1_2_ipcboard_{pool_id}", 8192, 8)
    nbytes = getattr(torch, dtype).itemsize * int(torch.Size(shape).numel())
    p = CudaIpcPointerMMData(desc, slot, offset, nbytes, shape, dtype, gen)
    q = p
    for _ in range(trips):
        raw = pickle.dumps(q, protocol=pickle.HIGHEST_PROTOCOL)
        assert len(raw) < 1024
        q = pickle.loads(raw)
    assert q == p and q.pool == desc and q.token == p.token


@settings(max_examples=30, deadline=None)
@given(shape=SHAPES, dtype=DTYPES, seed=st.integers(0, 1000))
def test_sender_copies_the_exact_bytes(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    t = (torch.rand(shape, generator=g) * 200).to(dtype)
    pool = CudaIpcPool(1 << 20, 1, segment_prefix(3, os.getpid()), kind="host", max_slots=8)
    try:
        ptr = CudaIpcSender(pool, None).to_pool(t)
        assert len(pickle.dumps(ptr)) < 1024
        got = pool.memory.buffer[ptr.offset:ptr.offset + ptr.nbytes].view(dtype).view(shape)
        assert torch.equal(got, t) and ptr.shape == tuple(t.shape) and ptr.dtype == str(dtype)[6:]
    finally:
        pool.close()
