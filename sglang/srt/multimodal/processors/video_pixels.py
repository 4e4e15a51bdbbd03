"""Video pixels: uint8 frames -> frames at the model's size -> normalized float32 patches, as transformers'
Qwen-VL video processors compute them (torch's antialiased bicubic on uint8, which is what torchvision's
resize runs on CPU tensors; `(x - mean * 255) / (std * 255)` in float32; frames taken in pairs).

Memory: a frame is resized alone (`resize_frame`), so the loader can resize each frame as it is decoded
and keep only what the model sees; the pixel values are written one temporal patch at a time into the
one output tensor, so no second copy of the clip in float32 exists at any point. Both are bit-identical to
resizing and normalizing the whole clip at once: every op is per frame (the resize) or per element.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from sglang.srt.multimodal.processors.base import MultimodalInputError


def resize_frame(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(H, W, 3) uint8 -> (size[0], size[1], 3) uint8 (a view; the caller copies it where it keeps it)."""
    if frame.shape[:2] == tuple(size):
        return frame
    # a contiguous (1, C, H, W) copy: the layout the whole-clip resize ran on (and a writable array, which
    # a decoded PIL image's is not)
    x = torch.from_numpy(np.ascontiguousarray(frame.transpose(2, 0, 1)))[None]
    out = F.interpolate(x, size=tuple(size), mode="bicubic", antialias=True, align_corners=False)
    return out[0].permute(1, 2, 0).numpy()


def resize_frames(frames: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(T, H, W, 3) uint8 -> (T, size[0], size[1], 3) uint8, one frame at a time."""
    if frames.shape[1:3] == tuple(size):
        return frames
    out = np.empty((len(frames), size[0], size[1], 3), np.uint8)
    for i, frame in enumerate(frames):
        out[i] = resize_frame(frame, size)
    return out


def pixel_values(frames: np.ndarray, cfg) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """(T, H, W, 3) uint8 frames already at the model's size -> (t*h*w, 3*T*P*P) float32 and (t, h, w);
    `cfg` gives patch sizes, rescale and normalization (a QwenVLVideoProcessor)."""
    if not len(frames):
        raise MultimodalInputError("a video needs at least one frame")
    x = torch.from_numpy(frames).permute(0, 3, 1, 2)  # (T, C, H, W) view
    return patchify(x, cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size, lambda g: _normalize(g, cfg))


def _normalize(x: torch.Tensor, cfg) -> torch.Tensor:
    x = x.to(torch.float32)
    if cfg.do_rescale and cfg.do_normalize:
        mean = torch.tensor(cfg.image_mean) * (1.0 / cfg.rescale_factor)
        std = torch.tensor(cfg.image_std) * (1.0 / cfg.rescale_factor)
        x = x.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))
    elif cfg.do_normalize:
        x = x.sub_(torch.tensor(cfg.image_mean).view(-1, 1, 1)).div_(torch.tensor(cfg.image_std).view(-1, 1, 1))
    elif cfg.do_rescale:
        x = x * cfg.rescale_factor
    return x


def frame_grid(thw: tuple[int, int, int], cfg) -> tuple[int, int, int]:
    """(t, h, w) patch grid of F frames of H x W at the model's size, as `patchify` lays them out (the last
    frame repeated up to a multiple of the temporal patch); refused as `patchify` refuses them."""
    f, h, w = (int(v) for v in thw)
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if not f:
        raise MultimodalInputError("a video needs at least one frame")
    if h % (p * m) or w % (p * m):
        raise MultimodalInputError(f"resized frames {h}x{w} are not a multiple of {p * m}")
    return -(-f // tp), h // p, w // p


def patchify(x: torch.Tensor, tp: int, p: int, m: int, transform=None) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """(T, C, H, W) -> ((T' / tp) * (H / p) * (W / p), C * tp * p * p), T' = T with the last frame repeated
    up to a multiple of `tp`; rows of one temporal patch are contiguous and in merge-window order.
    `transform` (e.g. uint8 -> normalized float32) runs on each group of `tp` frames before it is laid out,
    so only one group exists in its intermediate form at a time."""
    t_all, c, h, w = x.shape
    gt, gh, gw = -(-t_all // tp), h // p, w // p
    if h % (p * m) or w % (p * m):
        raise MultimodalInputError(f"resized frames {h}x{w} are not a multiple of {p * m}")
    rows = gh * gw
    out = None
    for g in range(gt):
        # the last frame repeats to fill the last temporal patch
        idx = [min(g * tp + k, t_all - 1) for k in range(tp)]
        group = x[idx] if idx[-1] - idx[0] != tp - 1 else x[idx[0]: idx[0] + tp]
        if transform is not None:
            group = transform(group)
        if out is None:
            out = torch.empty((gt * rows, c * tp * p * p), dtype=group.dtype)
        patches = group.reshape(1, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        out[g * rows:(g + 1) * rows] = patches.reshape(rows, c * tp * p * p)
    return out, (gt, gh, gw)


__all__ = ["frame_grid", "patchify", "pixel_values", "resize_frame", "resize_frames"]
