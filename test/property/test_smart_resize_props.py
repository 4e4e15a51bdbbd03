"""Property tests: smart_resize invariants and placeholder expansion / offsets."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from PIL import Image

from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor, SmartResizeError, smart_resize

from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

try:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as ref_smart_resize
except ImportError:  # pragma: no cover
    ref_smart_resize = None

IMG, VID, VS, VE = 151655, 151656, 151652, 151653

# (patch, merge, min_pixels, max_pixels): Qwen3-VL, Qwen2.5-VL, and common deployment overrides.
CONFIGS = [
    (16, 2, 65536, 16777216),
    (14, 2, 3136, 12845056),
    (14, 2, 256 * 28 * 28, 1280 * 28 * 28),
    (16, 2, 1024, 1024 * 32 * 32),
]

side = st.integers(min_value=1, max_value=40000)


@settings(max_examples=400, deadline=None)
@given(h=side, w=side, cfg=st.sampled_from(CONFIGS))
def test_smart_resize_invariants(h, w, cfg):
    patch, merge, min_px, max_px = cfg
    factor = patch * merge
    if max(h, w) / min(h, w) > 200:
        with pytest.raises(SmartResizeError, match="aspect ratio"):
            smart_resize(h, w, factor, min_px, max_px)
        if ref_smart_resize is not None:
            with pytest.raises(ValueError):
                ref_smart_resize(h, w, factor, min_px, max_px)
        return
    rh, rw = smart_resize(h, w, factor, min_px, max_px)
    assert rh % factor == 0 and rw % factor == 0
    assert rh >= factor and rw >= factor
    assert min_px <= rh * rw <= max_px
    if ref_smart_resize is not None:
        assert (rh, rw) == ref_smart_resize(h, w, factor, min_px, max_px)
    proc = QwenVLImageProcessor(patch_size=patch, merge_size=merge, min_pixels=min_px, max_pixels=max_px)
    assert proc.get_num_image_tokens(h, w) == rh * rw // (patch * merge) ** 2
    assert proc.get_grid_thw(h, w) == (1, rh // patch, rw // patch)


@settings(max_examples=200, deadline=None)
@given(
    short=st.integers(min_value=1, max_value=300),
    ratio=st.floats(min_value=1.0, max_value=200.0),
    tall=st.booleans(),
    cfg=st.sampled_from(CONFIGS),
)
def test_extreme_aspect_ratios_up_to_200_are_accepted(short, ratio, tall, cfg):
    long = int(short * ratio)
    assume(long / short <= 200)
    h, w = (long, short) if tall else (short, long)
    patch, merge, min_px, max_px = cfg
    rh, rw = smart_resize(h, w, patch * merge, min_px, max_px)
    assert min_px <= rh * rw <= max_px


# --------------------------------------------------------------------------- #
# Placeholder expansion
# --------------------------------------------------------------------------- #

_PROC = QwenVLProcessor(
    None,
    QwenVLImageProcessor(patch_size=14, merge_size=2, min_pixels=28 * 28, max_pixels=28 * 28 * 16),
    model_type="qwen2_5_vl",
)

text_ids = st.lists(st.integers(min_value=0, max_value=151000), max_size=6)
image_size = st.tuples(st.integers(1, 120), st.integers(1, 120)).filter(lambda s: max(s) / min(s) <= 200)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segments=st.lists(st.tuples(text_ids, image_size), max_size=4),
    tail=text_ids,
    wrap=st.booleans(),
)
def test_offsets_point_exactly_at_image_pads(segments, tail, wrap):
    prompt: list[int] = []
    images = []
    for txt, (h, w) in segments:
        prompt += txt
        prompt += [VS, IMG, VE] if wrap else [IMG]
        images.append(Image.new("RGB", (w, h), (h % 256, w % 256, 7)))
    prompt += tail

    ids, mm = _PROC.process(prompt, images)

    assert len(mm.mm_items) == len(images)
    covered = set()
    prev_end = -1
    for item, im in zip(mm.mm_items, images):
        ((s, e),) = item.offsets
        assert prev_end <= s  # in order, non-overlapping
        prev_end = e
        grid = _PROC.image_processor.get_grid_thw(im.height, im.width)
        assert item.image_grid_thw == grid
        assert e - s == item.num_tokens == grid[0] * grid[1] * grid[2] // 4
        assert item.feature.shape == (grid[0] * grid[1] * grid[2], 3 * 2 * 14 * 14)
        assert all(t == IMG for t in ids[s:e])
        covered.update(range(s, e))
    # every image pad belongs to exactly one item, and nothing else changed
    assert {i for i, t in enumerate(ids) if t == IMG} == covered
    assert [t for t in ids if t != IMG] == [t for t in prompt if t != IMG]
    assert len(ids) == len(prompt) - len(images) + len(covered)
    # positions: shape, and decode delta consistent with the max position
    assert mm.mrope_positions.shape == (3, len(ids))
    if ids:
        assert int(mm.mrope_positions.max()) + 1 == len(ids) + mm.mrope_position_delta
    # text tokens have equal rows
    text_cols = torch.tensor([t != IMG for t in ids], dtype=torch.bool)
    p = mm.mrope_positions[:, text_cols]
    assert torch.equal(p[0], p[1]) and torch.equal(p[1], p[2])
