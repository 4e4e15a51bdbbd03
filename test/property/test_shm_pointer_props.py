"""ShmPointerMMData: any number of pickle round trips keep the metadata, pickle to well under 1 KB
whatever the tensor size, and materialize to the exact bytes; unlinking the name after mapping
leaves the data readable."""

from __future__ import annotations

import os
import pickle

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.multimodal.transport.shm import (
    SHM_DIR,
    ShmPointerMMData,
    cleanup_own_segments,
    materialize_mm_features,
    mm_items_to_shm,
    segment_prefix,
    unlink_segments,
    write_segment,
)
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs

PREFIX = segment_prefix(1, os.getpid())
class _Req:
    """Stands in for TokenizedGenerateReqInput (anything with `mm_inputs`)."""

    def __init__(self, mm_inputs):
        self.mm_inputs = mm_inputs


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.uint8]


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 64), min_size=1, max_size=3),
    dtype=st.sampled_from(DTYPES),
    trips=st.integers(1, 5),
    copy=st.booleans(),
)
def test_round_trips_keep_metadata_and_bytes(shape, dtype, trips, copy):
    t = (torch.randn(shape) * 100).to(dtype)
    ptr = write_segment(t, PREFIX)
    try:
        obj = ptr
        for _ in range(trips):
            data = pickle.dumps(obj)
            assert len(data) < 1024
            obj = pickle.loads(data)
        assert (obj.name, obj.shape, obj.dtype, obj.offset, obj.nbytes) == (ptr.name, ptr.shape, ptr.dtype, ptr.offset, ptr.nbytes)
        out = obj.materialize(copy=copy)
        assert out.dtype == dtype and tuple(out.shape) == tuple(t.shape)
        assert torch.equal(out.view(torch.uint8), t.contiguous().view(torch.uint8)) if t.numel() else out.numel() == 0
    finally:
        unlink_segments([ptr.name])


def test_pickled_size_independent_of_pixels():
    small, big = torch.zeros(4, 1536), torch.zeros(20_000, 1536)  # 24 KB vs 123 MB
    ps, pb = write_segment(small, PREFIX), write_segment(big, PREFIX)
    try:
        assert abs(len(pickle.dumps(ps)) - len(pickle.dumps(pb))) < 16 and len(pickle.dumps(pb)) < 1024
    finally:
        unlink_segments([ps.name, pb.name])


def test_data_survives_unlink_after_mapping_and_request_helpers():
    items = [MultimodalDataItem(Modality.IMAGE, feature=torch.randn(6, 8)) for _ in range(3)]
    originals = [it.feature.clone() for it in items]
    mm = MultimodalInputs(mm_items=items)
    names = mm_items_to_shm(mm, PREFIX)
    try:
        _check_mapping_outlives_name(mm, names, originals)
    finally:
        unlink_segments(names)
    assert cleanup_own_segments(PREFIX) == 0


def _check_mapping_outlives_name(mm, names, originals):
    items = mm.mm_items
    assert len(names) == 3 and all(isinstance(it.feature, ShmPointerMMData) for it in items)
    received = pickle.loads(pickle.dumps([_Req(mm), _Req(None)]))
    mapped = materialize_mm_features(received)
    assert sorted(mapped) == sorted(names)
    assert unlink_segments(mapped) == 3
    assert not [n for n in os.listdir(SHM_DIR) if n in names]
    for it, ref in zip(received[0].mm_inputs.mm_items, originals):
        assert torch.equal(it.feature, ref)  # the mapping outlives the name
