"""Video pixels: uint8 frames -> frames at the model's size -> normalized float32 patches, as transformers'
Qwen-VL video processors compute them (torch's antialiased bicubic on uint8, which is what torchvision's
resize runs on CPU tensors; `(x - mean * 255) / (std * 255)` in float32; frames taken in pairs).

Memory: a frame is resized alone (`resize_frame`), so the loader can resize each frame as it is decoded
and keep only what the model sees; the pixel values are written one temporal patch at a time into the
one output tensor, so no second copy of the clip in float32 exists at any point. Both are bit-identical to
resizing and normalizing the whole clip at once: every op is per frame (the resize) or per element.

Within a frame, the resize holds no full-size copy: torch's antialiased resize is separable and runs its
horizontal pass first, into a uint8 buffer, then its vertical pass (both its AVX2 uint8 kernel and its
generic one). So the horizontal pass is run here on bands of rows (rows are independent in it), each band
read in place or copied alone, into one (H, new W) uint8 array, and the vertical pass once on that; each
call gets a channels-last view, which torch's uint8 kernel reads as it is. Bit-identical to the one call on
the whole (1, 3, H, W) frame (test_video_frame_memory.py compares them over sizes, band heights and
torch's CPU kernels). The whole-frame call made a (3, H, W) copy and torch unpacked it again to 4 bytes a
pixel: 2.3 frames on top of the decoded one (an 8000x8000 frame: +427 MiB).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from sglang.srt.multimodal.processors.base import MultimodalInputError


# bytes of full-size rows the horizontal pass reads per torch call (a band is copied when it is not
# readable in place): bounds what a frame costs above itself, whatever its size
_BAND_BYTES = 2 << 20


def resize_frame(frame, size: tuple[int, int]) -> np.ndarray:
    """(H, W, 3) uint8 -> (size[0], size[1], 3) uint8, with no full-size copy of the frame (module doc).

    `frame`: an array (any strides, read-only allowed; returned as is when already at `size`) or an RGB
    PIL image (read in bands of rows, so its pixels are never copied out twice)."""
    pil = isinstance(frame, Image.Image)
    if pil and frame.mode != "RGB":
        raise ValueError(f"resize_frame takes RGB images, got mode {frame.mode}")
    h, w = (frame.height, frame.width) if pil else frame.shape[:2]
    oh, ow = (int(v) for v in size)
    step = max(1, _BAND_BYTES // (w * 3))
    x = frame
    if ow != w:
        x = np.empty((h, ow, 3), np.uint8)
        for y in range(0, h, step):
            x[y:y + step] = _bicubic(_rows(frame, y, min(h, y + step)), (min(step, h - y), ow))
    elif pil:  # no horizontal pass: the vertical one (or the caller) needs the rows as one array
        x = np.empty((h, w, 3), np.uint8)
        for y in range(0, h, step):
            x[y:y + step] = _rows(frame, y, min(h, y + step))
    if oh != h:
        x = _bicubic(x, (oh, ow))
    return x


def _rows(frame, y0: int, y1: int) -> np.ndarray:
    if isinstance(frame, Image.Image):
        return np.asarray(frame.crop((0, y0, frame.width, y1)), dtype=np.uint8)
    return frame[y0:y1]


def _bicubic(a: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """torch's antialiased bicubic on one (H, W, 3) uint8 array, given to torch as a channels-last view.
    A view torch cannot take as is (strided rows, read-only memory, which torch only warns about) is
    copied first; callers pass bands or the small intermediate, so that copy is small."""
    if not (a.flags.c_contiguous and a.flags.writeable):
        a = np.array(a, dtype=np.uint8, order="C")
    x = torch.from_numpy(a).permute(2, 0, 1)[None]
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
