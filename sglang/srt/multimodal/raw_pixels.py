"""uint8 pixels -> the vision tower's float32 pixel values, where the tower runs (SGLANG_MM_UINT8_PIXELS).

With the switch on, the tokenizer process stops after the resize: an item's `feature` is the resized
image (H, W, 3) or the sampled frames (F, H, W, 3) as uint8, and `item.pixel_norm` (a `PixelNorm`) says
how the processor would have finished them. `item_pixels` finishes them on the rank's device
(`device_pixels`): the uint8 bytes are copied there (a quarter of the float32 bytes for a video, an eighth
for an image, whose float32 patches repeat it over the temporal patch), laid out in patch order as uint8,
then gathered through a (3, 256) float32 table into the float32 pixel values.

Why the result is the baseline's bit for bit (not merely within float32 rounding): rescale and normalize
are a function of (channel, uint8 value) alone, so a table of all 256 values per channel, computed once
on the CPU by the processor's own code (`qwen_image.image_norm_table`, which the image processor itself
gathers from; `video_pixels._normalize`, run on every value, for videos), holds every value the
processor can produce. The gather copies entries and the layout moves them, no arithmetic runs on the
device, so CPU and CUDA give the same bits. `reference_pixels` (the processor's code on the carrier) is
the oracle the tests compare against.

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
    return device_pixels(u8, norm, device)


def check_carrier(u8: torch.Tensor, norm: PixelNorm) -> None:
    """The carrier's dtype and rank match its recipe (the receiving side's guard)."""
    rank = 3 if norm.kind == "image" else 4
    if u8.dtype != torch.uint8 or u8.dim() != rank or u8.shape[-1] != 3:
        raise TypeError(f"a {norm.kind} PixelNorm needs a uint8 {'(H, W, 3)' if rank == 3 else '(F, H, W, 3)'} "
                        f"feature, got {tuple(u8.shape)} {u8.dtype}")


_TABLES: dict = {}  # (PixelNorm, device) -> (3 * 256,) float32 table; a server has a few recipes at most


def norm_table(norm: PixelNorm) -> torch.Tensor:
    """(3, 256) float32 on the CPU: every value the processor gives each channel's uint8 inputs."""
    from sglang.srt.multimodal.processors.qwen_image import image_norm_table
    from sglang.srt.multimodal.processors.video_pixels import _normalize

    if norm.kind == "image":
        return torch.from_numpy(image_norm_table(norm))
    x = torch.arange(256, dtype=torch.uint8).view(1, 1, 1, 256).expand(1, 3, 1, 256)  # (T, C, H, W)
    return _normalize(x, norm)[0, :, 0].contiguous()


def _device_table(norm: PixelNorm, device: torch.device) -> torch.Tensor:
    key = (norm, str(device))
    table = _TABLES.get(key)
    if table is None:  # a racing thread builds the same table: harmless
        table = _TABLES[key] = norm_table(norm).reshape(-1).to(device)
    return table


def device_pixels(u8: torch.Tensor, norm: PixelNorm, device, gather: bool | None = None) -> torch.Tensor:
    """uint8 carrier -> (patches, C*T*P*P) float32 pixel values on `device`, in transformers' patch order:
    merge windows (gh/m, gw/m, m, m), then channel, temporal patch, patch row, patch column.

    `gather` (default: on everywhere but the CPU) runs the table gather in torch on the device. On the CPU
    the processor's own numpy path is 2.3x faster (one 736x1280 image, one thread: 35 vs 81 ms) and gives
    the same bits, so a CPU rank runs that; tests force `gather=True` to check the device layout on CPU."""
    x = u8.to(device, non_blocking=True)
    if gather is None:
        gather = x.device.type != "cpu"
    if not gather:
        return reference_pixels(x, norm)
    table = _device_table(norm, x.device)
    p, m, tp = norm.patch_size, norm.merge_size, norm.temporal_patch_size
    chan = torch.arange(3, device=x.device) * 256  # channel c's entries start at c * 256
    if norm.kind == "image":
        h, w, _ = x.shape
        gh, gw = h // p, w // p
        # (gh/m, m, p, gw/m, m, p, C) -> (gh/m, gw/m, m, m, C, p, p), still uint8
        u = x.reshape(gh // m, m, p, gw // m, m, p, 3).permute(0, 3, 1, 4, 6, 2, 5)
        vals = table[u.long() + chan.view(3, 1, 1)]
        # the still image repeated over the temporal patch, as the processor does
        vals = vals.unsqueeze(5).expand(gh // m, gw // m, m, m, 3, tp, p, p)
        return vals.reshape(gh * gw, 3 * tp * p * p)
    f, h, w, _ = x.shape
    gt, gh, gw = -(-f // tp), h // p, w // p
    if f % tp:  # the last frame repeats to fill the last temporal patch
        x = torch.cat([x, x[-1:].expand(gt * tp - f, h, w, 3)])
    # (gt, tp, gh/m, m, p, gw/m, m, p, C) -> (gt, gh/m, gw/m, m, m, C, tp, p, p)
    u = x.reshape(gt, tp, gh // m, m, p, gw // m, m, p, 3).permute(0, 2, 5, 3, 6, 8, 1, 4, 7)
    vals = table[u.long() + chan.view(3, 1, 1, 1)]
    return vals.reshape(gt * gh * gw, 3 * tp * p * p)


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


__all__ = ["check_carrier", "device_pixels", "item_pixels", "norm_table", "reference_pixels"]
