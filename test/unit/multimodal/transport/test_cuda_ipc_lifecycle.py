"""cuda_ipc lifecycle on CPU (the pool in /dev/shm, two ranks in this process): whatever happens to
the requests - served, rejected or aborted after arrival, never sent (build or send failed, caller
gone), a rank that died - every slice comes back: pool free bytes return to the start value, and no
rank reads a freed slice (debug generation checks on)."""

from __future__ import annotations

import os
import pickle
import random

import torch

from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs
from sglang.srt.multimodal.transport.cuda_ipc import CudaIpcReceiver, CudaIpcSender, release_unsent
from sglang.srt.multimodal.transport.cuda_ipc_handle_cache import IpcHandleCache
from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool
from sglang.srt.multimodal.transport.shm import SHM_DIR, ShmPointerMMData, segment_prefix, unlink_segments

PREFIX = segment_prefix(6, os.getpid())


def _req(rng: random.Random):
    items = [MultimodalDataItem(Modality.IMAGE, torch.full((rng.randint(1, 300), 16), float(rng.randint(0, 9))))
             for _ in range(rng.randint(1, 4))]
    return MultimodalInputs(items)


def test_every_slice_returns_whatever_the_requests_fate():
    rng = random.Random(0)
    # small enough that the pool fills up and some items fall back to shared memory
    sender = CudaIpcSender(CudaIpcPool(40 * 1024, 2, PREFIX, kind="host", max_slots=32), PREFIX, wait_s=0.0)
    start = sender.pool.free_bytes
    ranks = [CudaIpcReceiver(r, IpcHandleCache(), debug=True) for r in range(2)]
    fates = []
    try:
        for i in range(300):
            mm = _req(rng)
            want = [it.feature.clone() for it in mm.mm_items]
            names = sender.items_to_pool(mm, rid=str(i))
            fate = rng.choice(["served", "served", "rejected", "aborted", "never_sent"])
            fates.append(fate)
            if fate == "never_sent":  # build or send failed, or the caller went away: the tokenizer releases
                assert release_unsent(names) == len(names)
                continue
            raw = pickle.dumps(mm)
            seg_names = []
            for rx in ranks:  # every rank materializes right after the broadcast, whatever comes next
                got = pickle.loads(raw)
                for it, w in zip(got.mm_items, want):
                    if isinstance(it.feature, ShmPointerMMData):
                        seg_names.append(it.feature.name)
                        it.feature = it.feature.materialize()
                    else:
                        it.feature = rx.materialize(it.feature)
                    assert torch.equal(it.feature, w)
                rx.poll()
            unlink_segments(seg_names)  # the shm path's own release (rank 0, after the barrier)
            # served, rejected by the scheduler or aborted: the pixels were already copied out
        assert {"served", "rejected", "aborted", "never_sent"} <= set(fates)
        assert sender.fallback_count > 0  # the pool did fill up
        sender.pool.reclaim()
        assert sender.pool.free_bytes == start and sender.pool.num_outstanding == 0
        # a rank that dies holding slices: shutdown returns them
        mm = _req(rng)
        sender.items_to_pool(mm)
        ranks[0].materialize(pickle.loads(pickle.dumps(mm)).mm_items[0].feature)
        ranks[0].poll()
        assert sender.pool.reclaim() == 0
    finally:
        for rx in ranks:
            rx.close()
        sender.close()
    assert sender.pool.free_bytes == start
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)] == []
