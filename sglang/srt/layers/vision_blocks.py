"""Building blocks shared by the Qwen-VL vision towers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
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


def fold_temporal(weight: torch.Tensor, in_channels: int, temporal_patch_size: int) -> torch.Tensor:
    """A patch kernel (out, C*T*P*P) or (out, C, T, P, P) summed over its temporal axis: (out, C*P*P) or
    (out, C, 1, P, P). A still image's patch holds T identical frames, so W . [x, .., x] = (sum_t W_t) . x:
    one frame against the folded kernel gives the same embedding in exact arithmetic (summed in float32,
    then stored in the weight's dtype). Computed per call from the live weight, so a weight update is seen."""
    out = weight.shape[0]
    folded = weight.float().reshape(out, in_channels, temporal_patch_size, -1).sum(dim=2)
    shape = (out, in_channels, 1, *weight.shape[3:]) if weight.dim() == 5 else (out, -1)
    return folded.reshape(shape).to(weight.dtype)


def _row_kind(pixel_values: torch.Tensor, full: int, temporal_patch_size: int) -> bool:
    """True for compact still-image rows (C*P*P values: SGLANG_MM_COMPACT_STILL_IMAGES), False for full
    rows (C*T*P*P). Any other width is refused: viewing it as full rows would embed garbage silently."""
    width = pixel_values.shape[-1]
    if pixel_values.dim() == 2 and width == full:
        return False
    if pixel_values.dim() == 2 and temporal_patch_size > 1 and width * temporal_patch_size == full:
        return True
    raise ValueError(f"patch_embed: pixel rows of shape {tuple(pixel_values.shape)}; expected (n, {full}) or, for "
                     f"compact still images, (n, {full // temporal_patch_size})")


class Conv3dPatchEmbed(nn.Module):
    """Baseline patch embedding: a Conv3d whose kernel equals its stride, applied per flattened patch. Compact
    still-image rows (one frame) go through the same convolution with the kernel folded over time."""

    def __init__(self, patch_size: int, temporal_patch_size: int, in_channels: int, embed_dim: int, bias: bool, dtype=None):
        super().__init__()
        self.shape = (in_channels, temporal_patch_size, patch_size, patch_size)
        self.embed_dim = embed_dim
        k = (temporal_patch_size, patch_size, patch_size)
        self.proj = nn.Conv3d(in_channels, embed_dim, kernel_size=k, stride=k, bias=bias, dtype=dtype)
        for p in self.proj.parameters():
            p.requires_grad_(False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        c, t, p, _ = self.shape
        if not _row_kind(pixel_values, c * t * p * p, t):
            x = pixel_values.view(-1, *self.shape).to(self.proj.weight.dtype)
            return self.proj(x).view(-1, self.embed_dim)
        x = pixel_values.view(-1, c, 1, p, p).to(self.proj.weight.dtype)
        w = fold_temporal(self.proj.weight, c, t)
        return F.conv3d(x, w, self.proj.bias, stride=(1, p, p)).view(-1, self.embed_dim)


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
        c, t, _, _ = self.shape
        if not _row_kind(pixel_values, self.proj.in_features, t):
            x = pixel_values.view(-1, self.proj.in_features).to(self.proj.weight.dtype)
            return self.proj(x)
        # compact still-image rows: one frame against the kernel folded over time (half the FLOPs)
        x = pixel_values.to(self.proj.weight.dtype)
        return F.linear(x, fold_temporal(self.proj.weight, c, t), self.proj.bias)


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
