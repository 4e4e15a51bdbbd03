"""Rotary position embeddings: multimodal M-RoPE for the text model and 2D rotary for the ViT.

Both use the "rotate half" (NeoX) layout: a head vector is split into two halves that rotate
together, and frequency j of the first half pairs with frequency j of the second.
"""

from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (tokens, heads, head_dim); cos/sin: (tokens, head_dim), already in the compute dtype."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return x * cos + rotate_half(x) * sin


def mrope_axis_of_frequency(mrope_section: tuple[int, ...], interleaved: bool) -> torch.Tensor:
    """For each of the head_dim/2 frequencies, which position row (0=t, 1=h, 2=w) drives it.

    Sectioned (Qwen2.5-VL): the first section[0] frequencies follow t, the next section[1] h, then w.
    Interleaved (Qwen3-VL): frequencies cycle t,h,w; h takes j%3==1 for j < 3*section[1], w takes
    j%3==2 for j < 3*section[2], everything else stays on t.
    """
    half = sum(mrope_section)
    axis = torch.zeros(half, dtype=torch.long)
    if interleaved:
        for a in (1, 2):
            axis[a : 3 * mrope_section[a] : 3] = a
    else:
        start = 0
        for a, n in enumerate(mrope_section):
            axis[start : start + n] = a
            start += n
    return axis


class MRotaryEmbedding(nn.Module):
    """Multimodal rotary embedding over (3, tokens) positions; 1-D positions mean text-only."""

    def __init__(self, head_dim: int, rope_theta: float, mrope_section: tuple[int, ...], interleaved: bool):
        super().__init__()
        if sum(mrope_section) * 2 != head_dim:
            raise ValueError(f"mrope_section {mrope_section} must sum to head_dim // 2 = {head_dim // 2}")
        self.head_dim = head_dim
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("axis", mrope_axis_of_frequency(tuple(mrope_section), interleaved), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            positions = positions.unsqueeze(0).expand(3, -1)
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)  # (3, T, D/2)
        idx = self.axis.to(positions.device).view(1, 1, -1).expand(1, freqs.shape[1], -1)
        freqs = freqs.gather(0, idx).squeeze(0)  # (T, D/2): each frequency from its own axis
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q: (T, Hq, D), k: (T, Hk, D)."""
        cos, sin = self.cos_sin(positions, q.dtype)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


class VisionRotaryEmbedding(nn.Module):
    """2D rotary for ViT patches: the first quarter of frequencies follow the row, the next the column."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        spatial = head_dim // 2
        inv_freq = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def cos_sin(self, pos_hw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pos_hw: (N, 2) row/col indices -> float32 cos, sin of shape (N, head_dim)."""
        freqs = pos_hw[..., None].float() * self.inv_freq.to(pos_hw.device)  # (N, 2, D/4)
        hw = freqs.flatten(1)  # [row freqs | col freqs]
        emb = torch.cat((hw, hw), dim=-1)
        return emb.cos(), emb.sin()


def apply_rotary_vision(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotation in float32 regardless of the activation dtype, as the reference does."""
    dtype = q.dtype
    q = apply_rotary(q.float(), cos, sin).to(dtype)
    k = apply_rotary(k.float(), cos, sin).to(dtype)
    return q, k
