"""Variable-length, non-causal attention over packed segments (the ViT's attention: one segment per image
for Qwen3-VL, one per window for Qwen2.5-VL, all of them in a single launch).

Shapes and invariants (N packed rows, S segments, Hq = GROUP * Hk heads, head dim D):

- q (N, Hq, D); k, v (N, Hk, D) (usually Hk = Hq), any row/head strides.
- cu_seqlens (S+1,) int32/int64, non-decreasing, cu_seqlens[0] = 0 and cu_seqlens[S] = N. Segment i is
  rows [cu_seqlens[i], cu_seqlens[i+1]) and attends only within itself; length-0 segments are allowed.
- max_seqlen >= the longest segment, known on the host: it sizes the grid (no device sync).
- Query head h reads kv head h // GROUP.

Returns (N, Hq, D) in q's dtype, or writes into `out`. Softmax accumulates in float32.
"""

from __future__ import annotations

import torch

from sgl_kernel.attention._common import (
    check_fp32_precision, check_heads, check_indptr, output, require_kernel, unit_last_stride,
)

_NAME = "varlen_attention_fwd"


def _check(q, k, v, cu_seqlens) -> None:
    check_heads(_NAME, q, k, v)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"{_NAME}: q has {q.shape[0]} rows, k/v {k.shape[0]}")
    check_indptr(_NAME, "cu_seqlens", cu_seqlens, q.device)


def varlen_attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    sm_scale: float,
    out: torch.Tensor | None = None,
    fp32_precision: str = "tf32",
) -> torch.Tensor:
    """Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1); see the module docstring for shapes.
    float32 inputs on CUDA use tf32 tensor cores unless `fp32_precision="ieee"` (always exact on CPU).
    Memory is O(N * Hq * D): no score matrix is materialized."""
    check_fp32_precision(_NAME, fp32_precision)
    _check(q, k, v, cu_seqlens)
    out = output(_NAME, q, out)
    require_kernel(_NAME, q)
    from sgl_kernel.attention._prefill_triton import prefill_attention_triton

    return prefill_attention_triton(
        unit_last_stride(q), unit_last_stride(k), unit_last_stride(v), out,
        cu_seqlens, cu_seqlens, None, int(max_seqlen), float(sm_scale), causal=False,
        fp32_precision=fp32_precision,
    )


def varlen_attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    sm_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pure-torch reference: one segment at a time, float32 math. Reads cu_seqlens on the host (syncs);
    `max_seqlen` is accepted for signature parity. Rows of a fresh output outside every segment are 0."""
    _check(q, k, v, cu_seqlens)
    out = torch.zeros_like(q) if out is None else output("varlen_attention_torch", q, out)
    n_heads, d = q.shape[1], q.shape[2]
    hk = k.shape[1]
    group = n_heads // hk
    cu = cu_seqlens.tolist()
    for i in range(len(cu) - 1):
        lo, hi = cu[i], cu[i + 1]
        if hi == lo:
            continue
        qs = q[lo:hi].float().view(hi - lo, hk, group, d)
        scores = torch.einsum("qhgd,nhd->hgqn", qs, k[lo:hi].float()) * sm_scale
        probs = torch.softmax(scores, dim=-1)
        os_ = torch.einsum("hgqn,nhd->qhgd", probs, v[lo:hi].float()).reshape(hi - lo, n_heads, d)
        out[lo:hi] = os_.to(out.dtype)
    return out
