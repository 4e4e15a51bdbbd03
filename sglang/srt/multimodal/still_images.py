"""Compact still images (SGLANG_MM_COMPACT_STILL_IMAGES) where the vision tower runs.

With the switch on, a still image's patch rows hold one temporal frame, C*P*P values, instead of the
baseline's C*T*P*P (the same frame repeated T times, `qwen_image.normalize_and_patchify`); videos keep full
rows. The tower's patch embedding takes either width (`layers/vision_blocks.py`: compact rows meet the
kernel folded over time). One tower call takes one tensor, so when compact and full rows meet in a call
(images beside videos, or a ViT CUDA graph whose buffers are full width) the compact rows are widened back:
repeated over the temporal patch exactly as the processor repeats them, which gives the baseline's rows bit
for bit. Only that call loses the halved patch-embed FLOPs; nothing changes in what it computes.
"""

from __future__ import annotations

import torch

# The Qwen-VL image and video processors make RGB rows only (QwenVLImageProcessor takes 3 means and stds).
CHANNELS = 3


def widen_still_rows(rows: torch.Tensor, width: int) -> torch.Tensor:
    """(n, C*P*P) compact rows -> (n, `width` = C*T*P*P), each frame repeated over the temporal patch in the
    processor's (C, T, P, P) order; rows already `width` wide are returned as they are."""
    n, w = rows.shape
    if w == width:
        return rows
    t = width // w
    if t * w != width or w % CHANNELS:
        raise ValueError(f"pixel rows of width {w} cannot be widened to {width} (not one frame of C*T*P*P)")
    pp = w // CHANNELS
    return rows.view(n, CHANNELS, 1, pp).expand(n, CHANNELS, t, pp).reshape(n, width)


def concat_pixel_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """The items' pixel rows as one tensor; compact rows are widened when wider rows are present."""
    widths = {p.shape[-1] for p in parts}
    if len(widths) > 1:
        full = max(widths)
        parts = [widen_still_rows(p, full) for p in parts]
    return torch.cat(parts, dim=0)


__all__ = ["CHANNELS", "concat_pixel_rows", "widen_still_rows"]
