"""Weighted row gather: out[n] = sum_k weights[n, k] * table[idx[n, k]], accumulated in float32.

This is the device half of the ViT's interpolated position embedding: the host computes each patch's
bilinear taps (indices and weights into the learned table) once per grid shape, and the device only
gathers and blends. The same operation serves any tap count (4 for bilinear, 16 for bicubic).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_kernel import pick_backend


def _check(table: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> None:
    if table.dim() != 2 or idx.dim() != 2 or weights.shape != idx.shape:
        raise ValueError(
            f"expected table (V, D), idx (N, K) and weights (N, K); got {tuple(table.shape)}, "
            f"{tuple(idx.shape)}, {tuple(weights.shape)}"
        )
    if idx.dtype not in (torch.int32, torch.int64) or weights.dtype != torch.float32:
        raise ValueError(f"idx must be int32/int64 and weights float32, got {idx.dtype} and {weights.dtype}")
    if not (table.device == idx.device == weights.device):
        raise ValueError(f"tensors on different devices: {table.device}, {idx.device}, {weights.device}")


def gather_blend_rows_torch(
    table: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Pure-torch path: one fused `embedding_bag` (fixed-size bags, per-sample weights) over a float32
    view of the table, so half-precision tables are blended in float32 like the reference."""
    _check(table, idx, weights)
    out_dtype = out_dtype or table.dtype
    if idx.shape[0] == 0:
        return torch.empty((0, table.shape[1]), dtype=out_dtype, device=table.device)
    out = F.embedding_bag(idx, table.float(), per_sample_weights=weights, mode="sum")
    return out.to(out_dtype)


def gather_blend_rows(
    table: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """table (V, D) any float dtype; idx (N, K) int32/int64 with 0 <= idx < V; weights (N, K) float32.
    Returns (N, D) in `out_dtype` (default: the table's).

    backend "auto" takes the Triton kernel for CUDA tensors when triton imports, else the torch path;
    "triton" forces the kernel (on CPU only under TRITON_INTERPRET=1, float32); "torch" the fallback."""
    if pick_backend(backend, table) == "torch":
        return gather_blend_rows_torch(table, idx, weights, out_dtype)
    _check(table, idx, weights)
    from sgl_kernel.vision._pos_embed_triton import gather_blend_rows_triton

    out_dtype = out_dtype or table.dtype
    return gather_blend_rows_triton(table.contiguous(), idx.contiguous(), weights.contiguous(), out_dtype)
