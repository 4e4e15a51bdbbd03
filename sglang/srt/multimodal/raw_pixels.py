"""uint8 pixels -> the vision tower's float32 pixel values, where the tower runs (SGLANG_MM_UINT8_PIXELS).

With the switch on, the tokenizer process stops after the resize: an item's `feature` is the resized
image (H, W, 3) or the sampled frames (F, H, W, 3) as uint8, and `item.pixel_norm` (a `PixelNorm`) says
how the processor would have finished them. `item_pixels` finishes them here with the processor's own
functions (`qwen_image.normalize_and_patchify` for images, `video_pixels.pixel_values` for videos), so the
values are the baseline's bit for bit: the same code on the same bytes.

Invariant: an item's feature is uint8 exactly when it has a `pixel_norm`; anything else is refused
(a float32 tensor normalized twice, or uint8 bytes fed to the tower as values, would run silently).
"""

from __future__ import annotations

import numpy as np
import torch

from sglang.srt.multimodal.mm_types import PixelNorm


def item_pixels(item, device) -> torch.Tensor:
    """The pixel values (patches, C*T*P*P) of one item on `device`: float32 features as they are (the
    baseline), uint8 ones normalized and patchified."""
    feature, norm = item.feature, getattr(item, "pixel_norm", None)
    if norm is None:
        if isinstance(feature, torch.Tensor) and feature.dtype == torch.uint8:
            raise TypeError("a uint8 pixel feature came without its PixelNorm (SGLANG_MM_UINT8_PIXELS carrier "
                            "lost its recipe)")
        return torch.as_tensor(feature).to(device)
    u8 = torch.as_tensor(feature)
    check_carrier(u8, norm)
    return reference_pixels(u8, norm).to(device)


def check_carrier(u8: torch.Tensor, norm: PixelNorm) -> None:
    """The carrier's dtype and rank match its recipe (the receiving side's guard)."""
    rank = 3 if norm.kind == "image" else 4
    if u8.dtype != torch.uint8 or u8.dim() != rank or u8.shape[-1] != 3:
        raise TypeError(f"a {norm.kind} PixelNorm needs a uint8 {'(H, W, 3)' if rank == 3 else '(F, H, W, 3)'} "
                        f"feature, got {tuple(u8.shape)} {u8.dtype}")


def reference_pixels(u8: torch.Tensor, norm: PixelNorm) -> torch.Tensor:
    """The processor's own CPU path on the uint8 carrier: the baseline's pixel values bit for bit."""
    from sglang.srt.multimodal.processors.qwen_image import image_norm_table, normalize_and_patchify
    from sglang.srt.multimodal.processors.video_pixels import pixel_values

    arr = np.ascontiguousarray(u8.cpu().numpy())
    if norm.kind == "image":
        pv, _ = normalize_and_patchify(arr, image_norm_table(norm), norm.patch_size, norm.merge_size,
                                       norm.temporal_patch_size)
        return torch.from_numpy(pv)
    pv, _ = pixel_values(arr, norm)
    return pv


__all__ = ["check_carrier", "item_pixels", "reference_pixels"]
