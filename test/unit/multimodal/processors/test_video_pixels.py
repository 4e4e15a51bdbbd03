"""Frames resized one at a time as they are decoded give the same pixel values, bit for bit, as the whole
clip decoded at full size and resized at once (the path that is compared with transformers' processors in
test_video_processor_gpu.py and test_video_parity.py): both families, request pixel limits, odd frame
counts, encoded files, frame lists and RawVideo."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

av = pytest.importorskip("av")

from PIL import Image  # noqa: E402

from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor, load_and_process_video  # noqa: E402
from sglang.srt.multimodal.video_io import RawVideo, decode_video  # noqa: E402
from sglang.testing.sample_video import bar_frames, make_clip  # noqa: E402


def whole_clip_reference(frames: np.ndarray, cfg: QwenVLVideoProcessor) -> tuple[torch.Tensor, tuple]:
    """The previous path, written out: the full-size clip resized as one (T, C, H, W) batch, normalized
    as one float32 tensor, patchified with one view/permute."""
    num, h, w = frames.shape[:3]
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    rh, rw = cfg.resized_size(num, h, w)
    if (rh, rw) != (h, w):
        video = F.interpolate(video.contiguous(), size=(rh, rw), mode="bicubic", antialias=True, align_corners=False)
    x = video.to(torch.float32)
    mean = torch.tensor(cfg.image_mean) * (1.0 / cfg.rescale_factor)
    std = torch.tensor(cfg.image_std) * (1.0 / cfg.rescale_factor)
    x = x.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if pad := -x.shape[0] % tp:
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)], dim=0)
    t_all, c, hh, ww = x.shape
    gt, gh, gw = t_all // tp, hh // p, ww // p
    patches = x.view(gt, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(gt * gh * gw, c * tp * p * p).contiguous(), (gt, gh, gw)


CONFIGS = [("qwen3", {}), ("qwen2", {}), ("qwen3", {"max_pixels": 96 * 64}), ("qwen2", {"max_pixels": 40 * 40}),
           ("qwen2", {"min_pixels": 512 * 512}), ("qwen3", {"num_frames": 5})]


@pytest.mark.parametrize("family,kwargs", CONFIGS)
@pytest.mark.parametrize("w,h,fps,seconds", [(131, 97, 10, 1.5), (320, 180, 6, 2.0), (67, 45, 5, 1.0)])
def test_encoded_clip_equals_the_whole_clip_path(family, kwargs, w, h, fps, seconds):
    cfg = QwenVLVideoProcessor.defaults(family).for_request(kwargs, "kw")
    data = make_clip(w, h, fps, seconds, "mkv")
    full = decode_video(data, cfg.sample_indices)  # no FrameFit: full-size frames
    assert not full.resized and full.frames.shape[1:3] == (h, w)
    ref, grid = whole_clip_reference(full.frames, cfg)
    ours = load_and_process_video(data, cfg)
    assert ours.grid_thw == grid and ours.pixel_values.dtype == torch.float32
    assert torch.equal(ours.pixel_values, ref)
    # and the public whole-clip entry point (frames given at full size) is the same function
    assert torch.equal(cfg.process(full.frames)[0], ref)


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_frame_lists_and_raw_videos_equal_the_whole_clip_path(family):
    cfg = QwenVLVideoProcessor.defaults(family).for_request({"max_pixels": 128 * 96}, "kw")
    frames = bar_frames(251, 163, 7, seed=3)  # odd count: the last frame is repeated into a pair
    ref, grid = whole_clip_reference(frames, cfg)
    listed = load_and_process_video([Image.fromarray(f) for f in frames], cfg)
    assert listed.grid_thw == grid and torch.equal(listed.pixel_values, ref)
    raw = load_and_process_video(RawVideo(frames, 7.0), cfg)
    idx = cfg.sample_indices(7, 7.0)
    raw_ref, raw_grid = whole_clip_reference(frames[idx], cfg)
    assert raw.grid_thw == raw_grid and torch.equal(raw.pixel_values, raw_ref)
