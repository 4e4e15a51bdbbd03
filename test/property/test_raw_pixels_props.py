"""Device-side normalize + patchify (SGLANG_MM_UINT8_PIXELS, `raw_pixels.device_pixels`) against the
processors' own float32 output (hypothesis): any merge-window grid, any frame count (odd ones pad the
last temporal patch), both families' patch sizes and mean/std, rescale and normalize on or off, images
and videos. Equality is bitwise (`torch.equal`), not a tolerance: see raw_pixels' docstring for why."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from sglang.srt.multimodal.mm_types import PixelNorm
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor
from sglang.srt.multimodal.raw_pixels import device_pixels, norm_table, reference_pixels

IMAGE_CFGS = {  # Qwen3-VL and Qwen2.5-VL image processors; pixel limits that never resize the drawn sizes
    "qwen3": QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3, min_pixels=1,
                                  max_pixels=1 << 30),
    "qwen2": QwenVLImageProcessor(min_pixels=1, max_pixels=1 << 30),
}
FLAGS = st.sampled_from([(True, True), (True, False), (False, True), (False, False)])  # do_rescale, do_normalize


@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(sorted(IMAGE_CFGS)), wh=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       flags=FLAGS, seed=st.integers(0, 2**31))
def test_image_device_pixels_equal_the_processor(family, wh, flags, seed):
    cfg = dataclasses.replace(IMAGE_CFGS[family], do_rescale=flags[0], do_normalize=flags[1])
    h, w = wh[0] * cfg.factor, wh[1] * cfg.factor
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    expected, grid = cfg.preprocess(Image.fromarray(arr))  # PIL keeps a same-size image as it is
    norm = PixelNorm.of("image", cfg)
    got = device_pixels(torch.from_numpy(arr), norm, "cpu", gather=True)  # the accelerators' path
    assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(expected))
    assert torch.equal(reference_pixels(torch.from_numpy(arr), norm), got)
    assert grid == (1, h // cfg.patch_size, w // cfg.patch_size)


@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(["qwen3", "qwen2"]), wh=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       frames=st.integers(1, 5), flags=FLAGS, seed=st.integers(0, 2**31))
def test_video_device_pixels_equal_the_processor(family, wh, frames, flags, seed):
    cfg = dataclasses.replace(QwenVLVideoProcessor.defaults(family), do_rescale=flags[0], do_normalize=flags[1])
    h, w = wh[0] * cfg.factor, wh[1] * cfg.factor
    arr = np.random.default_rng(seed).integers(0, 256, (frames, h, w, 3), dtype=np.uint8)
    expected, grid = cfg.process(arr, resized=True)
    got = device_pixels(torch.from_numpy(arr), PixelNorm.of("video", cfg), "cpu", gather=True)
    assert torch.equal(got, expected)
    assert torch.equal(device_pixels(torch.from_numpy(arr), PixelNorm.of("video", cfg), "cpu"), expected)
    assert grid == (-(-frames // cfg.temporal_patch_size), h // cfg.patch_size, w // cfg.patch_size)


@settings(max_examples=20, deadline=None)
@given(family=st.sampled_from(["qwen3", "qwen2"]), flags=FLAGS)
def test_video_table_holds_every_value_the_processor_computes(family, flags):
    """The exhaustive half of the argument: one frame holding all 256 values per channel, normalized by the
    processor, reads exactly the table's entries."""
    cfg = dataclasses.replace(QwenVLVideoProcessor.defaults(family), do_rescale=flags[0], do_normalize=flags[1])
    side = cfg.factor * 2  # at least 256 pixels, every value present
    vals = np.arange(side * side, dtype=np.int64) % 256
    arr = np.stack([vals.reshape(side, side).astype(np.uint8)] * 3, axis=-1)[None].repeat(2, axis=0)
    expected, _ = cfg.process(arr, resized=True)
    table = norm_table(PixelNorm.of("video", cfg))
    got = device_pixels(torch.from_numpy(arr), PixelNorm.of("video", cfg), "cpu", gather=True)
    assert torch.equal(got, expected)
    assert set(np.unique(expected.numpy())) <= set(table.reshape(-1).numpy().tolist())
