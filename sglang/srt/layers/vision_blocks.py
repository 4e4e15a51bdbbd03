"""Building blocks shared by the Qwen-VL vision towers."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.activation import SiluAndMul, get_act_fn
from sglang.srt.layers.attention.vision_attention import VisionAttention
from sglang.srt.layers.layernorm import LayerNorm, RMSNorm
from sglang.srt.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, RowParallelLinear


class Conv3dPatchEmbed(nn.Module):
    """Baseline patch embedding: a Conv3d whose kernel equals its stride, applied per flattened patch."""

    def __init__(self, patch_size: int, temporal_patch_size: int, in_channels: int, embed_dim: int, bias: bool, dtype=None):
        super().__init__()
        self.shape = (in_channels, temporal_patch_size, patch_size, patch_size)
        self.embed_dim = embed_dim
        k = (temporal_patch_size, patch_size, patch_size)
        self.proj = nn.Conv3d(in_channels, embed_dim, kernel_size=k, stride=k, bias=bias, dtype=dtype)
        for p in self.proj.parameters():
            p.requires_grad_(False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = pixel_values.view(-1, *self.shape).to(self.proj.weight.dtype)
        return self.proj(x).view(-1, self.embed_dim)


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str, tp: TPInfo = SINGLE_RANK, dtype=None):
        super().__init__()
        self.linear_fc1 = ColumnParallelLinear(dim, hidden, bias=True, tp=tp, dtype=dtype)
        self.linear_fc2 = RowParallelLinear(hidden, dim, bias=True, tp=tp, dtype=dtype)
        self.act = get_act_fn(act)

    def forward(self, x):
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionGatedMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str, tp: TPInfo = SINGLE_RANK, dtype=None):
        super().__init__()
        if act != "silu":
            raise ValueError(f"gated vision MLP supports silu only, got {act!r}")
        self.gate_up_proj = MergedColumnParallelLinear(dim, [hidden, hidden], bias=True, tp=tp, dtype=dtype)
        self.down_proj = RowParallelLinear(hidden, dim, bias=True, tp=tp, dtype=dtype)
        self.act = SiluAndMul()

    def forward(self, x):
        return self.down_proj(self.act(self.gate_up_proj(x)))


class VisionBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp: nn.Module, norm: str, tp: TPInfo = SINGLE_RANK, dtype=None):
        super().__init__()
        norm_cls = LayerNorm if norm == "layernorm" else RMSNorm
        self.norm1 = norm_cls(dim, 1e-6, dtype)
        self.norm2 = norm_cls(dim, 1e-6, dtype)
        self.attn = VisionAttention(dim, num_heads, tp, dtype)
        self.mlp = mlp

    def forward(self, x, cu_seqlens: list[int], cos: torch.Tensor, sin: torch.Tensor):
        x = x + self.attn(self.norm1(x), cu_seqlens, cos, sin)
        return x + self.mlp(self.norm2(x))


def rot_pos_ids(grid_thw: list[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """(row, col) of every patch, in the order patches arrive: merge-window blocks, row-major."""
    out = []
    for t, h, w in grid_thw:
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        rows = rows.permute(0, 2, 1, 3).reshape(-1)
        cols = cols.permute(0, 2, 1, 3).reshape(-1)
        out.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))
    return torch.cat(out, dim=0)


def image_cu_seqlens(grid_thw: list[tuple[int, int, int]]) -> list[int]:
    """Attention segments: one per frame of each image."""
    cu = [0]
    for t, h, w in grid_thw:
        for _ in range(t):
            cu.append(cu[-1] + h * w)
    return cu
