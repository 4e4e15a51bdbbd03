"""SGLANG_MM_COMPACT_STILL_IMAGES on the tokenizer side and where the pixels are finished: a still image's
patch rows hold one temporal frame (half the float32 bytes of the duplicated pair), on every path (float32,
uint8 carriers, deferred JPEGs), widened back they are the baseline's rows bit for bit; videos are unchanged;
hashes keep their meaning (the same image, the same hash; different images, different hashes); the request
builder reads the switch and its built items carry half the bytes."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.multimodal import deferred_decode as dd
from sglang.srt.multimodal.hashing import ensure_item_hashes
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor, still_image_config
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
from sglang.srt.multimodal.raw_pixels import device_pixels, item_pixels
from sglang.srt.multimodal.still_images import concat_pixel_rows, widen_still_rows
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.network import pick_unused_port

IMG, VID, VS, VE = 151655, 151656, 151652, 151653
QWEN3 = QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3, min_pixels=65536,
                             max_pixels=1 << 20)
FULL = 3 * 2 * 16 * 16


def _img(seed: int, w: int = 320, h: int = 240) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    _img(seed).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _processor(compact: bool, uint8: bool = False, deferred: bool = False) -> QwenVLProcessor:
    proc = QwenVLProcessor(None, QWEN3, model_type="qwen3_vl")
    proc.compact_still_images, proc.uint8_pixels, proc.deferred_jpeg = compact, uint8, deferred
    proc.timestamp_ids = lambda s: [7]  # no tokenizer here: timestamp ids do not matter to the pixels
    return proc


def _build(proc, images, video=None):
    ids = [1] + [VS, IMG, VE] * len(images) + ([VS, VID, VE] if video is not None else [])
    extra = {}
    if video is not None:
        extra = {"videos": [video], "video_config": proc.media_config({"num_frames": 4})[1]}
    return proc.process(ids, images, **extra)[1]


def test_still_rows_are_one_frame_and_widen_to_the_baseline_bit_for_bit():
    imgs, frames = [_img(0), _img(1, 200, 300)], [_img(10 + k) for k in range(4)]
    base, compact = _build(_processor(False), imgs, frames), _build(_processor(True), imgs, frames)
    for b, c in zip(base.mm_items[:2], compact.mm_items[:2]):
        assert b.image_grid_thw == c.image_grid_thw and b.offsets == c.offsets  # same placeholders
        assert b.feature.shape[1] == FULL and c.feature.shape[1] == FULL // 2
        assert c.feature.numel() * c.feature.element_size() * 2 == b.feature.numel() * b.feature.element_size()
        assert torch.equal(widen_still_rows(c.feature, FULL), b.feature)
    assert torch.equal(base.mm_items[2].feature, compact.mm_items[2].feature)  # the video is unchanged
    mixed = concat_pixel_rows([c.feature for c in compact.mm_items])  # as one tower call sees them
    assert torch.equal(mixed, torch.cat([b.feature for b in base.mm_items]))


def test_uint8_carriers_finish_to_compact_rows():
    """SGLANG_MM_UINT8_PIXELS with compact images: the carrier is the same uint8 image, its recipe says one
    frame, and both finishing paths (the processor's CPU code, the device gather) give the compact rows."""
    img = _img(2)
    c = _build(_processor(True), [img]).mm_items[0]
    u = _build(_processor(True, uint8=True), [img]).mm_items[0]
    assert u.feature.dtype == torch.uint8 and u.pixel_norm.temporal_patch_size == 1
    assert torch.equal(item_pixels(u, "cpu"), c.feature)
    assert torch.equal(device_pixels(u.feature, u.pixel_norm, "cpu", gather=True), c.feature)


def test_deferred_jpegs_decode_to_compact_rows():
    data = _jpeg(3)
    c = _build(_processor(True), [data]).mm_items[0]
    d = _build(_processor(True, deferred=True), [data]).mm_items[0]
    assert d.feature.processor.temporal_patch_size == 1
    assert torch.equal(dd.materialize_pixels([d], "cpu"), c.feature)  # PIL where the tower runs: bit for bit
    # the device pipeline (nvJPEG's, run here on the CPU) lays the one frame out as the pair's first frame
    rgb = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)
    pair = dd.device_pixels(rgb, dataclasses.replace(d.feature, processor=QWEN3), "cpu")
    assert torch.equal(widen_still_rows(dd.device_pixels(rgb, d.feature, "cpu"), FULL), pair)


def test_hashes_keep_their_meaning():
    """Equal images share a hash and different ones do not, switch on or off; the numbers differ between the
    settings (the rows hashed differ: one frame, not two), which nothing compares (docs/optimizations)."""
    a, a2, b = _img(4), _img(4), _img(5)
    for compact in (False, True):
        mm = _build(_processor(compact), [a, a2, b])
        ensure_item_hashes(mm, "xxh3_128")
        ha, ha2, hb = (it.hash for it in mm.mm_items)
        assert ha == ha2 != hb
    off, on = (_build(_processor(c), [a]) for c in (False, True))
    ensure_item_hashes(off, "xxh3_128")
    ensure_item_hashes(on, "xxh3_128")
    assert off.mm_items[0].hash != on.mm_items[0].hash


def test_the_config_is_cached_and_a_one_frame_config_is_kept():
    assert still_image_config(QWEN3) is still_image_config(QWEN3)
    assert still_image_config(QWEN3).temporal_patch_size == 1 and QWEN3.temporal_patch_size == 2
    one = still_image_config(QWEN3)
    assert still_image_config(one) is one


def test_widening_refuses_rows_that_are_not_one_frame():
    with pytest.raises(ValueError, match="cannot be widened"):
        widen_still_rows(torch.zeros(2, 100), FULL)


@pytest.mark.parametrize("compact", ["0", "1"])
def test_the_request_builder_reads_the_switch(tiny_model_dir, monkeypatch, compact):
    monkeypatch.setenv("SGLANG_MM_COMPACT_STILL_IMAGES", compact)
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")  # the item keeps its pixels
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    builder = RequestBuilder(ServerArgs(model_path=path, port=pick_unused_port()), path)
    try:
        obj = GenerateReqInput(text="look <|vision_start|><|image_pad|><|vision_end|>", image_data=[_img(6)],
                               sampling_params={"max_new_tokens": 1})
        item = builder.build(builder.check(obj, "r"))[0].mm_inputs.mm_items[0]
    finally:
        builder.close()
    p, t = builder.processor.image_processor.patch_size, builder.processor.image_processor.temporal_patch_size
    assert builder.processor.compact_still_images is (compact == "1")
    assert item.feature.shape[1] == 3 * p * p * (1 if compact == "1" else t)
