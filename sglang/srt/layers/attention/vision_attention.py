"""Bidirectional ViT attention over packed images (cu_seqlens delimit each attention segment)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.attention.sdpa import sdpa
from sglang.srt.layers.linear import QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.rotary_embedding import apply_rotary_vision


@dataclass(frozen=True)
class VisionSegments:
    """Attention segments already on the device, for a forward that must not build them from host ints
    (a captured CUDA graph replays with new contents in the same `cu_dev` buffer). `max_len` bounds every
    segment (the kernel's grid); `cu_host` mirrors `cu_dev` for the per-segment SDPA path, None when the
    contents change under replay (then only the "triton" backend can run it)."""

    cu_dev: torch.Tensor
    max_len: int
    cu_host: tuple[int, ...] | None = None


def _host_segments(cu_seqlens) -> list[int]:
    if not isinstance(cu_seqlens, VisionSegments):
        return cu_seqlens
    if cu_seqlens.cu_host is None:
        raise ValueError("device-only vision segments (ViT CUDA graphs) need --mm-attention-backend triton")
    return list(cu_seqlens.cu_host)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int], scale: float):
    """q/k/v: (N, H, D); attention within each [cu_seqlens[i], cu_seqlens[i+1]) segment only.
    One SDPA call per segment (the "sdpa" backend; the reference), on 4-D views: torch runs 3-D inputs
    on its math backend only, which materializes every segment's score matrix."""
    out = torch.empty_like(q)
    cu_seqlens = _host_segments(cu_seqlens)
    for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        if e > s:
            seg = sdpa(q[s:e].transpose(0, 1)[None], k[s:e].transpose(0, 1)[None], v[s:e].transpose(0, 1)[None],
                       scale=scale)
            out[s:e] = seg[0].transpose(0, 1)
    return out


@functools.lru_cache(maxsize=8)
def _cu_seqlens_tensor(cu_seqlens: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Every layer of one forward passes the same segments: one host-to-device copy for all of them."""
    return torch.tensor(cu_seqlens, dtype=torch.int32).to(device, non_blocking=True)


def varlen_packed_attention(q, k, v, cu_seqlens: list[int], scale: float, fp32_precision: str = "tf32") -> torch.Tensor:
    """The "triton" backend: every segment (image or window) in one kernel launch."""
    from sgl_kernel.attention import varlen_attention_fwd

    if isinstance(cu_seqlens, VisionSegments):
        return varlen_attention_fwd(q, k, v, cu_seqlens.cu_dev, cu_seqlens.max_len, scale, fp32_precision=fp32_precision)
    cu = _cu_seqlens_tensor(tuple(cu_seqlens), q.device)
    max_len = max((e - s for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:])), default=0)
    return varlen_attention_fwd(q, k, v, cu, max_len, scale, fp32_precision=fp32_precision)


VISION_ATTENTION_IMPLS = {"sdpa": packed_attention, "triton": varlen_packed_attention}


def configure_vision_attention(model: nn.Module, backend: str, fp32_precision: str = "tf32") -> None:
    """Chooses the vision towers' attention once, when the runner builds the model."""
    if backend not in VISION_ATTENTION_IMPLS:
        raise ValueError(f"unknown vision attention backend {backend!r}; choose from {sorted(VISION_ATTENTION_IMPLS)}")
    attend = VISION_ATTENTION_IMPLS[backend]
    if backend == "triton":
        attend = functools.partial(attend, fp32_precision=fp32_precision)
    for m in model.modules():
        if isinstance(m, VisionAttention):
            m.attend = attend


class VisionAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, tp: TPInfo = SINGLE_RANK, dtype=None):
        super().__init__()
        self.head_dim = hidden_size // num_heads
        self.qkv = QKVParallelLinear(hidden_size, self.head_dim, num_heads, num_heads, bias=True, tp=tp, dtype=dtype)
        self.proj = RowParallelLinear(hidden_size, hidden_size, bias=True, tp=tp, dtype=dtype)
        self.num_local_heads = self.qkv.num_heads
        self.scale = self.head_dim**-0.5
        self.attend = packed_attention  # configure_vision_attention picks the backend

    def forward(self, x: torch.Tensor, cu_seqlens: list[int], cos: torch.Tensor, sin: torch.Tensor, sp=None) -> torch.Tensor:
        """`sp` (an `UlyssesShards`, switch `--enable-vit-ulysses-sp`): x, cos and sin hold this rank's
        tokens only, `cu_seqlens` stay global; attention runs on all tokens for 1/P of the heads."""
        n = x.shape[0]
        q, k, v = self.qkv.split_qkv(self.qkv(x))
        q = q.view(n, self.num_local_heads, self.head_dim)
        k = k.view(n, self.num_local_heads, self.head_dim)
        v = v.view(n, self.num_local_heads, self.head_dim)
        q, k = apply_rotary_vision(q, k, cos, sin)
        if sp is not None:
            q, k, v = sp.seq_to_heads(torch.stack((q, k, v), dim=1)).unbind(1)  # one all-to-all for q, k, v
            out = sp.heads_to_seq(self.attend(q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens, self.scale))
            return self.proj(out.reshape(n, self.num_local_heads * self.head_dim))  # n may be 0 on a rank
        out = self.attend(q, k, v, cu_seqlens, self.scale)
        return self.proj(out.reshape(n, -1))
