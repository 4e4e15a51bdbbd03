"""Per-grid-shape caches for the ViT's position inputs (switch SGLANG_VIT_FAST_POS_EMBED).

The baseline rebuilds, on every forward and for every image, (a) the bilinear resampling of the learned
position table (linspace, floor, clamp, four gathers and a dozen small elementwise ops) and (b) the 2D
rotary (row, col) indices (a Python loop, then a host-to-device copy) followed by cos/sin of every
patch. Both depend only on the grid shape, so here they are computed once per (h, w) on the CPU, kept on
the device in a bounded LRU, and each forward only concatenates the cached rows and gathers:

- position embedding: cached (indices, weights) of the four bilinear taps per patch, in merge-window
  order; the device runs one weighted gather (`sgl_kernel.vision.gather_blend_rows`, Triton on CUDA,
  a fused `embedding_bag` elsewhere);
- rotary: cached (row, col, row, col) table indices per patch; cos/sin come from a (positions, head_dim/4)
  table precomputed with the same float32 products as the baseline.

Frames (t) of one grid share positions, so the key is (h, w, device) and t only repeats rows.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from sglang.srt.layers.rotary_embedding import VisionRotaryEmbedding
from sglang.srt.layers.vision_blocks import rot_pos_ids
from sglang.srt.mem_cache.lru import ByteBoundedLRU, tensors_nbytes

try:
    from sgl_kernel.vision import gather_blend_rows
except ImportError:  # sgl-kernel not installed: the same weighted gather in plain torch, float32 blend

    def gather_blend_rows(table, idx, weights, out_dtype=None, backend="auto"):
        out = F.embedding_bag(idx, table.float(), per_sample_weights=weights, mode="sum")
        return out.to(out_dtype or table.dtype)


Grid = tuple[int, int, int]
# Per-cache byte budget on the device. A 960x1280 image at patch 16 (4,800 patches) costs 150 KiB of
# bilinear taps and 75 KiB of rotary indices, so 32 MiB holds a few hundred distinct shapes.
DEFAULT_CACHE_BYTES = 32 << 20


class GridLRU(ByteBoundedLRU[tuple, tuple[torch.Tensor, ...]]):
    """Bounded LRU of tensor tuples keyed by grid shape, bound in bytes (`ByteBoundedLRU`'s rule: a
    value larger than the whole budget is built, returned and not kept). `get(key, build)` returns the
    cached value or builds, stores and returns it."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES):
        super().__init__(max_bytes, tensors_nbytes)

    def get(self, key: tuple, build: Callable[[], tuple[torch.Tensor, ...]] | None = None):
        if build is None:
            return super().get(key)
        return self.get_or_build(key, build)

    @property
    def nbytes(self) -> int:
        return self.current_bytes


def bilinear_taps(h: int, w: int, side: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four bilinear (align-corners) taps of a side x side table for every patch of an h x w grid, in
    merge-window order: int32 indices (h*w, 4) and float32 weights (h*w, 4), taps ordered
    (h0,w0), (h0,w1), (h1,w0), (h1,w1). Built on the CPU with the baseline's exact arithmetic
    (`Qwen3VisionTransformer.interpolated_pos_embed`), so the weights are its weights bit for bit."""
    hs = torch.linspace(0, side - 1, h)
    ws = torch.linspace(0, side - 1, w)
    h0, w0 = hs.floor().long(), ws.floor().long()
    h1, w1 = (h0 + 1).clamp(max=side - 1), (w0 + 1).clamp(max=side - 1)
    dh, dw = (hs - h0)[:, None], (ws - w0)[None, :]
    idx = torch.stack(
        [h0[:, None] * side + w0[None, :], h0[:, None] * side + w1[None, :],
         h1[:, None] * side + w0[None, :], h1[:, None] * side + w1[None, :]],
        dim=-1,
    )
    wts = torch.stack([(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw], dim=-1)

    def window_order(t: torch.Tensor) -> torch.Tensor:
        return t.view(h // merge, merge, w // merge, merge, 4).permute(0, 2, 1, 3, 4).reshape(h * w, 4)

    return window_order(idx).to(torch.int32).contiguous(), window_order(wts).contiguous()


def _repeat_per_frame(parts: list[torch.Tensor], grid_thw: list[Grid]) -> torch.Tensor:
    """Rows of every image in order, each image's rows repeated over its t frames (one cat)."""
    seq = [p for p, (t, _, _) in zip(parts, grid_thw) for _ in range(t)]
    return seq[0] if len(seq) == 1 else torch.cat(seq, dim=0)


class FastPosEmbedInterpolator:
    """Interpolated learned position embedding from cached bilinear taps; equals the baseline."""

    def __init__(self, side: int, merge: int, max_bytes: int = DEFAULT_CACHE_BYTES, backend: str = "auto"):
        self.side = side
        self.merge = merge
        self.backend = backend  # see sgl_kernel.vision.gather_blend_rows
        self.cache = GridLRU(max_bytes)

    def taps(self, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        def build():
            idx, wts = bilinear_taps(h, w, self.side, self.merge)
            return idx.to(device), wts.to(device)

        return self.cache.get((h, w, str(device)), build)

    def __call__(self, table: torch.Tensor, grid_thw: list[Grid], out_dtype: torch.dtype) -> torch.Tensor:
        """table: (side*side, D) learned embedding -> (sum t*h*w, D) in `out_dtype`."""
        entries = [self.taps(h, w, table.device) for _, h, w in grid_thw]
        idx = _repeat_per_frame([e[0] for e in entries], grid_thw)
        wts = _repeat_per_frame([e[1] for e in entries], grid_thw)
        return gather_blend_rows(table, idx, wts, out_dtype, backend=self.backend)


class CachedVisionRotary:
    """2D rotary cos/sin from a per-position table and per-grid cached indices; equals
    `rotary.cos_sin(rot_pos_ids(grid_thw, merge))`."""

    def __init__(self, rotary: VisionRotaryEmbedding, merge: int, max_bytes: int = DEFAULT_CACHE_BYTES):
        self.rotary = rotary
        self.merge = merge
        self.cache = GridLRU(max_bytes)
        self._tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def table(self, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of p * inv_freq for p < size, float32 (P, head_dim/4). Built once per device: 256 rows
        cover grids up to 4096 pixels a side at patch 16; larger grids grow it to a power of two."""
        have = self._tables.get(str(device))
        if have is None or have[0].shape[0] < size:
            n = max(256, 1 << (size - 1).bit_length())
            inv_freq = self.rotary.inv_freq.to(device)
            # Same float32 product as VisionRotaryEmbedding.cos_sin, so the angles are identical.
            freqs = torch.arange(n, device=device)[:, None].float() * inv_freq
            have = self._tables[str(device)] = (freqs.cos(), freqs.sin())
        return have

    def ids(self, h: int, w: int, device: torch.device) -> torch.Tensor:
        """(h*w, 4) int32 table rows (row, col, row, col): one gather yields [row | col | row | col],
        the baseline's cat((hw, hw)) layout."""

        def build():
            pos = rot_pos_ids([(1, h, w)], self.merge)
            return (pos.to(torch.int32).repeat(1, 2).to(device),)

        return self.cache.get((h, w, str(device)), build)[0]

    def cos_sin(self, grid_thw: list[Grid], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """-> float32 cos, sin of shape (sum t*h*w, head_dim)."""
        cos_t, sin_t = self.table(max(max(h, w) for _, h, w in grid_thw), device)
        idx = _repeat_per_frame([self.ids(h, w, device) for _, h, w in grid_thw], grid_thw)
        n = idx.shape[0]
        return F.embedding(idx, cos_t).view(n, -1), F.embedding(idx, sin_t).view(n, -1)
