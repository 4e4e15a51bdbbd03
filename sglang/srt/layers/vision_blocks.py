"""Building blocks shared by the Qwen-VL vision towers."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.activation import SiluAndMul, get_act_fn
from sglang.srt.layers.attention.vision_attention import VisionAttention
from sglang.srt.layers.layernorm import LayerNorm, RMSNorm
from sglang.srt.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from sglang.srt.layers.checkpoint_tensor import materialize


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


class _ConvWeightLinear(ReplicatedLinear):
    """A Linear whose weight loads from a Conv3d checkpoint tensor (out, C, T, P, P) by flattening it."""

    def __init__(self, conv_shape: tuple[int, ...], embed_dim: int, bias: bool, dtype=None):
        self.conv_shape = (embed_dim, *conv_shape)
        in_features = 1
        for d in conv_shape:
            in_features *= d
        super().__init__(in_features, embed_dim, bias=bias, dtype=dtype)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        if param.dim() == 2 and loaded.dim() == 5:
            if tuple(loaded.shape) != self.conv_shape:
                raise ValueError(
                    f"patch_embed: checkpoint conv weight {tuple(loaded.shape)} != expected {self.conv_shape}"
                )
            # Row-major (C, T, P, P) flattening is the order of each pixel row, so this is exact.
            loaded = materialize(loaded).reshape(self.conv_shape[0], -1)
        super().weight_loader(param, loaded, shard_id)


class LinearPatchEmbed(nn.Module):
    """Patch embedding as one matrix product (switch SGLANG_VIT_PATCH_EMBED_LINEAR).

    The Conv3d of the baseline has kernel == stride and each input row is exactly one kernel window,
    so it never slides: conv(x) == x @ W.reshape(out, C*T*P*P).T + b. Checkpoints keep the 5-D conv
    weight under the same name (`patch_embed.proj.weight`); it is flattened at load."""

    def __init__(
        self, patch_size: int, temporal_patch_size: int, in_channels: int, embed_dim: int, bias: bool, dtype=None
    ):
        super().__init__()
        self.shape = (in_channels, temporal_patch_size, patch_size, patch_size)
        self.embed_dim = embed_dim
        self.proj = _ConvWeightLinear(self.shape, embed_dim, bias=bias, dtype=dtype)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = pixel_values.view(-1, self.proj.in_features).to(self.proj.weight.dtype)
        return self.proj(x)


def make_patch_embed(
    linear: bool, patch_size: int, temporal_patch_size: int, in_channels: int, embed_dim: int, bias: bool, dtype=None
) -> nn.Module:
    """`linear=False` is exactly the baseline Conv3d module; both read the same checkpoint tensors."""
    cls = LinearPatchEmbed if linear else Conv3dPatchEmbed
    return cls(patch_size, temporal_patch_size, in_channels, embed_dim, bias=bias, dtype=dtype)


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

    def forward(self, x, cu_seqlens: list[int], cos: torch.Tensor, sin: torch.Tensor, sp=None):
        x = x + self.attn(self.norm1(x), cu_seqlens, cos, sin, sp)
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
