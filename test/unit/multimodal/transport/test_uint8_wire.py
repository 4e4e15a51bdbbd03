"""SGLANG_MM_UINT8_PIXELS on the wire: the same request carries a quarter of the bytes or less (an eighth
for images, whose float32 patches repeat the still image over the temporal patch) inline (ZMQ and the
TP broadcast pickle it), in shared memory, and in the cuda_ipc pool (its /dev/shm stand-in here, the
GPU pool in the gpu test); every transport hands the uint8 carrier over intact and the receiving side
finishes it to the baseline's pixel values bit for bit."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
from sglang.srt.multimodal.raw_pixels import item_pixels
from sglang.srt.multimodal.transport.cuda_ipc import CudaIpcReceiver, CudaIpcSender
from sglang.srt.multimodal.transport.cuda_ipc_handle_cache import IpcHandleCache
from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool
from sglang.srt.multimodal.transport.shm import (
    SHM_DIR,
    materialize_mm_features,
    mm_items_to_shm,
    segment_prefix,
    unlink_segments,
)
from sglang.srt.sampling.sampling_params import SamplingParams

IMG, VID, VS, VE = 151655, 151656, 151652, 151653
PREFIX = segment_prefix(9, os.getpid())
# Qwen3-VL's image processor (patch 16, mean/std 0.5); 1280x720 -> 736x1280, 3680 patches
QWEN3 = QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3, min_pixels=65536,
                             max_pixels=16777216)


def _request(uint8: bool, seed: int = 0):
    """Two 1280x720 images and a 6-frame 320x240 video, built by the processor with the switch off / on."""
    proc = QwenVLProcessor(None, QWEN3, model_type="qwen3_vl")
    proc.uint8_pixels = uint8
    rng = np.random.default_rng(seed)
    imgs = [Image.fromarray(rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8)) for _ in range(2)]
    frames = [Image.fromarray(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)) for _ in range(6)]
    proc.timestamp_ids = lambda s: [7]  # no tokenizer here; the timestamps' ids do not matter to the bytes
    _, vcfg = proc.media_config({"num_frames": 6})
    ids, mm = proc.process([1, VS, IMG, VE, VS, IMG, VE, VS, VID, VE], imgs, videos=[frames], video_config=vcfg)
    return TokenizedGenerateReqInput("r", ids, SamplingParams(max_new_tokens=1), mm)


def _feature_bytes(req) -> list[int]:
    return [it.feature.numel() * it.feature.element_size() for it in req.mm_inputs.mm_items]


@pytest.fixture(scope="module")
def reqs():
    return {False: _request(False), True: _request(True)}


def test_item_bytes_are_an_eighth_for_images_a_quarter_for_videos(reqs):
    off, on = _feature_bytes(reqs[False]), _feature_bytes(reqs[True])
    assert [o / n for o, n in zip(off, on)] == [8.0, 8.0, 4.0]  # 6 frames: no pair padding in the float32
    assert all(it.feature.dtype == torch.uint8 for it in reqs[True].mm_inputs.mm_items)


def test_inline_pickle_carries_at_least_4x_fewer_bytes(reqs):
    """What ZMQ and the TP broadcast (SGLANG_MM_SHM_TRANSPORT=0, or another node) send."""
    off, on = len(pickle.dumps(reqs[False])), len(pickle.dumps(reqs[True]))
    assert off / on >= 6.0, (off, on)  # 2 images at 8x and a video at 4x
    back = pickle.loads(pickle.dumps(reqs[True]))
    for a, b in zip(back.mm_inputs.mm_items, reqs[False].mm_inputs.mm_items):
        assert a.pixel_norm is not None and torch.equal(item_pixels(a, "cpu"), b.feature)


def _fresh(uint8: bool):
    return _request(uint8).mm_inputs


def test_shared_memory_segments_hold_the_uint8_carrier():
    base = _fresh(False)
    sizes = {}
    for uint8 in (False, True):
        mm = _fresh(uint8)
        names = mm_items_to_shm(mm, PREFIX)
        try:
            sizes[uint8] = sum(it.feature.nbytes for it in mm.mm_items)
            got = pickle.loads(pickle.dumps(TokenizedGenerateReqInput("r", [1], None, mm)))
            materialize_mm_features([got])
            for a, b in zip(got.mm_inputs.mm_items, base.mm_items):
                assert torch.equal(item_pixels(a, "cpu"), b.feature)
        finally:
            unlink_segments(names)
    assert sizes[False] / sizes[True] >= 6.0
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)] == []


class _Msg:
    def __init__(self, mm_inputs):
        self.mm_inputs = mm_inputs


def test_cuda_ipc_pool_carries_uint8_and_the_receiver_hands_it_back():
    base = _fresh(False)
    sizes = {}
    for uint8 in (False, True):
        sender = CudaIpcSender(CudaIpcPool(64 << 20, 1, PREFIX, kind="host", max_slots=8), None, wait_s=0.01)
        try:
            mm = _fresh(uint8)
            sender.items_to_pool(mm)
            sizes[uint8] = sum(it.feature.nbytes for it in mm.mm_items)
            rx = CudaIpcReceiver(0, IpcHandleCache())
            got = [rx.materialize(it.feature) for it in mm.mm_items]
            if uint8:
                for it, t, b in zip(mm.mm_items, got, base.mm_items):
                    assert t.dtype == torch.uint8
                    it.feature = t
                    assert torch.equal(item_pixels(it, "cpu"), b.feature)
            rx.close()
        finally:
            sender.close()
    assert sizes[False] / sizes[True] >= 6.0


def _bcast_rank(rank, port, q):
    import torch.distributed as dist

    from sglang.srt.distributed.communication_op import broadcast_pyobj
    from sglang.srt.distributed.parallel_state import init_tp_group

    tp = init_tp_group(2, rank, f"127.0.0.1:{port}", "gloo", 60)
    sent = {}
    for uint8 in (False, True):
        msgs = [_request(uint8)] if rank == 0 else []
        sent[uint8] = len(pickle.dumps(msgs))
        got = broadcast_pyobj(msgs, tp)
        if uint8:  # every rank finishes the carrier to the baseline's values
            base = _request(False).mm_inputs.mm_items
            ok = all(torch.equal(item_pixels(a, "cpu"), b.feature) for a, b in zip(got[0].mm_inputs.mm_items, base))
    q.put((rank, sent, ok))
    dist.destroy_process_group()


def test_tp_broadcast_sends_at_least_4x_fewer_bytes():
    from sglang.testing.ranks import run_ranks

    res = run_ranks(_bcast_rank, 2)
    sent, _ = res[0]
    assert sent[False] / sent[True] >= 6.0
    assert all(ok for _, ok in res.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_pool_uint8_is_normalized_on_the_device():
    base = _fresh(False)
    sender = CudaIpcSender(CudaIpcPool(64 << 20, 1, PREFIX, kind="cuda", device="cuda:0"), None)
    try:
        mm = _fresh(True)
        sender.items_to_pool(mm)
        rx = CudaIpcReceiver(0, IpcHandleCache())
        for it, b in zip(mm.mm_items, base.mm_items):
            it.feature = rx.materialize(it.feature)
            assert it.feature.device.type == "cuda" and it.feature.dtype == torch.uint8
            out = item_pixels(it, "cuda")
            assert torch.equal(out.cpu(), b.feature)
        torch.cuda.synchronize()
        rx.close()
    finally:
        sender.close()
