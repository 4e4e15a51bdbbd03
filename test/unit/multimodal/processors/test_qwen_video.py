"""Our video frame sampling, sizing and patch layout against transformers' own code.

transformers' video processors need torchvision (never installed on CPU machines), so their pieces are
reached without it: Qwen3-VL's `smart_resize` imports; the processors' methods (`sample_frames`, `patchify`) are
compiled from the installed source files and called on a stand-in `self` holding the class defaults;
Qwen2-VL's resize is the image `smart_resize`, imported from the PIL image
processor. The table covers 1-4 s clips at 5-30 fps and odd sizes; a GPU-only test
(test_video_processor_gpu.py) compares whole tensors with transformers' processors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_qwen2_image  # noqa: E402
from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_qwen3_smart_resize  # noqa: E402
from transformers.video_utils import VideoMetadata  # noqa: E402

from sglang.srt.multimodal.processors.base import MultimodalInputError  # noqa: E402
from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor  # noqa: E402
from sglang.testing.hf_video import QWEN2_VIDEO, QWEN3_VIDEO, hf_processor_self, hf_video_method  # noqa: E402

# (seconds, fps, width, height)
TABLE = [(1.0, 5, 67, 45), (1.0, 30, 131, 97), (2.0, 24, 640, 360), (2.5, 12, 33, 181), (3.0, 25, 1279, 719),
         (4.0, 30, 97, 1001), (4.0, 5, 301, 299), (1.5, 10, 1920, 1080), (3.3, 29.97, 853, 479)]


def _qwen2_sample_frames():
    return hf_video_method(QWEN2_VIDEO, "sample_frames")


def _qwen3(name: str):
    return hf_video_method(QWEN3_VIDEO, name)


def _hf_self(family: str, **over):
    return hf_processor_self(**over)


@pytest.mark.parametrize("seconds,fps,w,h", TABLE)
def test_qwen3_sampling_and_grid_equal_transformers(seconds, fps, w, h):
    ours = QwenVLVideoProcessor.defaults("qwen3")
    total = int(round(seconds * fps))
    ref_idx = _qwen3("sample_frames")(_hf_self("qwen3"), VideoMetadata(total_num_frames=total, fps=fps))
    idx = ours.sample_indices(total, fps)
    assert idx.tolist() == list(ref_idx)
    n = len(idx)
    rh, rw = hf_qwen3_smart_resize(n, h, w, temporal_factor=2, factor=32, min_pixels=128 * 32 * 32,
                                   max_pixels=32 * 32 * 768)
    assert ours.grid_thw(n, h, w) == ((n + 1) // 2, rh // 16, rw // 16)


@pytest.mark.parametrize("seconds,fps,w,h", TABLE)
def test_qwen2_sampling_and_grid_equal_transformers(seconds, fps, w, h):
    ours = QwenVLVideoProcessor.defaults("qwen2")
    total = int(round(seconds * fps))
    ref_idx = _qwen2_sample_frames()(_hf_self("qwen2"), VideoMetadata(total_num_frames=total, fps=fps))
    idx = ours.sample_indices(total, fps)
    assert idx.tolist() == ref_idx.tolist()
    n = len(idx)
    rh, rw = hf_qwen2_image.smart_resize(h, w, factor=28, min_pixels=128 * 28 * 28, max_pixels=28 * 28 * 768)
    assert ours.grid_thw(n, h, w) == (-(-n // 2), rh // 14, rw // 14)


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
@pytest.mark.parametrize("over", [dict(fps=1.0), dict(fps=4.0, max_frames=6), dict(num_frames=6, fps=None)])
def test_request_overrides_sample_like_transformers(family, over):
    ours = QwenVLVideoProcessor.defaults(family).for_request({k: v for k, v in over.items() if v is not None}, "kw")
    meta = VideoMetadata(total_num_frames=75, fps=25.0)
    if family == "qwen3":
        ref = _qwen3("sample_frames")(_hf_self(family, **over), meta, num_frames=over.get("num_frames"),
                                                            fps=over.get("fps"))
    else:
        ref = _qwen2_sample_frames()(_hf_self(family, **over), meta)
    assert ours.sample_indices(75, 25.0).tolist() == list(np.asarray(ref).tolist())


def test_qwen3_timestamps_follow_processor_rule():
    """Qwen3VLProcessor._calculate_timestamps: the mean time of each pair of sampled frames (the last
    repeated when the count is odd)."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    ours = QwenVLVideoProcessor.defaults("qwen3")
    for idx, fps in ([0, 7, 14, 22, 29], 12.0), ([0, 17, 34, 51], 30.0):
        ref = Qwen3VLProcessor._calculate_timestamps(None, list(idx), fps, 2)
        assert ours.timestamps(np.array(idx), fps) == ref


def test_patch_layout_equals_transformers_patchify():
    """Our pixel layout (pairs of frames, merge-window order) is transformers' patchify, here fed an odd
    frame count so the last frame is repeated."""
    ours = QwenVLVideoProcessor.defaults("qwen3")
    x = torch.randn(3, 3, 64, 96)
    pv, grid = ours.patchify(x.clone())
    ref, gt, gh, gw = _qwen3("patchify")(None, x[None], patch_size=16, merge_size=2,
                                                               temporal_patch_size=2)
    assert grid == (gt, gh, gw) == (2, 4, 6)
    assert torch.equal(pv, ref[0])


def test_config_files_fall_back_like_transformers():
    """video_preprocessor_config.json sizes are per clip (qwen3, `size` only) or per frame (qwen2, where
    the older top-level min/max_pixels win), as transformers reads them."""
    cfg = {"size": {"shortest_edge": 4096, "longest_edge": 25165824}, "min_pixels": 1, "max_pixels": 2, "fps": 1}
    q3 = QwenVLVideoProcessor.from_dict("qwen3", cfg)
    assert (q3.min_pixels, q3.max_pixels, q3.fps, q3.patch_size) == (4096, 25165824, 1.0, 16)
    q2 = QwenVLVideoProcessor.from_dict("qwen2", {"min_pixels": 3136, "max_pixels": 12845056})
    assert (q2.min_pixels, q2.max_pixels, q2.patch_size, q2.image_mean[0]) == (3136, 12845056, 14, 0.48145466)


@pytest.mark.parametrize("bad,word", [({"fps": 0}, "fps"), ({"fps": "2"}, "fps"), ({"max_frames": 0}, "max_frames"),
                                      ({"num_frames": 4, "fps": 1}, "not both"), ({"max_frames": 10 ** 6}, "limit"),
                                      ({"min_frames": 9, "max_frames": 8}, "min_frames")])
def test_bad_request_settings_name_the_key(bad, word):
    with pytest.raises(MultimodalInputError, match=word):
        QwenVLVideoProcessor.defaults("qwen3").for_request(bad, "mm_processor_kwargs")


def test_request_max_pixels_limits_each_frame():
    base = QwenVLVideoProcessor.defaults("qwen3")
    small = base.for_request({"max_pixels": 64 * 64}, "kw")
    assert small.grid_thw(8, 720, 1280)[1:] < base.grid_thw(8, 720, 1280)[1:]
    t, gh, gw = small.grid_thw(8, 720, 1280)
    assert gh * gw * 16 * 16 <= 64 * 64


def test_one_frame_is_refused():
    with pytest.raises(MultimodalInputError, match="at least 2"):
        QwenVLVideoProcessor.defaults("qwen3").grid_thw(1, 64, 64)
    with pytest.raises(MultimodalInputError, match="at least 2"):
        QwenVLVideoProcessor.defaults("qwen2").sample_indices(1, 30.0)


@pytest.mark.parametrize("n,h,w", [(4, 720, 1280), (20, 1080, 1920), (60, 720, 1280), (9, 97, 1001), (300, 360, 640)])
def test_qwen3_pixel_cap_equals_transformers(n, h, w):
    """cap_pixels_per_frame (off by default in transformers and here): Qwen3-VL's patch count equals
    transformers' get_num_of_video_patches with the cap on."""
    count = hf_video_method(QWEN3_VIDEO, "get_num_of_video_patches", {"smart_resize": hf_qwen3_smart_resize})
    hf_self = hf_processor_self(size={"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768}, patch_size=16,
                                merge_size=2, cap_pixels_per_frame=True, max_video_tokens=768)
    ours = QwenVLVideoProcessor.defaults("qwen3").for_request({"cap_pixels_per_frame": True}, "kw")
    t, gh, gw = ours.grid_thw(n, h, w)
    assert t * gh * gw == count(hf_self, n, h, w, {})


def test_qwen2_pixel_cap_bounds_the_clip():
    """Qwen2.5-VL with the cap: a long clip's frames shrink so the clip stays near max_video_tokens (90%
    budget), where uncapped every frame keeps the per-frame budget."""
    base = QwenVLVideoProcessor.defaults("qwen2")
    capped = dataclasses.replace(base, cap_pixels_per_frame=True, max_video_tokens=4096)
    tokens = lambda cfg, n: (lambda t, h, w: t * h * w // 4)(*cfg.grid_thw(n, 720, 1280))  # noqa: E731
    assert tokens(capped, 40) <= 4096 < tokens(base, 40)
    assert tokens(capped, 4) == tokens(base, 4)  # a short clip is under the budget: unchanged
