"""Decode attention over a paged KV pool: one query per request, at the request's last position.

Shapes and invariants (B requests, Hq = GROUP * Hk query heads, head dim D):

- q (B, Hq, D): request b's single new query (its K/V already written to the pool).
- k_buffer, v_buffer (num_slots, Hk, D): one layer's KV pool (any row/head strides). Request b's keys
  are at slots kv_indices[kv_indptr[b]:kv_indptr[b+1]] (kv_len_b of them, token-level, so any page size
  works); kv_indices 1-D int32/int64, kv_indptr (B+1,) int32/int64, non-decreasing.
- The query attends all kv_len_b keys (no mask: it is the last position). kv_len_b = 0 is allowed and
  gives an output of zeros.
- max_kv_len: a host-known upper bound of kv_len_b. Only a hint (the kernel reads the true lengths on
  the device): the number of splits is capped at max(1, max_kv_len), since more would all be empty.
- num_kv_splits >= 1: each request's keys are cut into that many chunks processed by separate
  programs (stage 1), whose partial results are merged by a second kernel (stage 2), so a few long
  requests still fill the GPU. Workspace: B * Hq * splits * (D' + 1) float32 (D' = D padded to 2^k).
- Query head h reads kv head h // GROUP; K/V are never repeated in memory.

Returns (B, Hq, D) in q's dtype, or writes into `out`. Softmax accumulates in float32.
"""

from __future__ import annotations

import torch

from sgl_kernel.attention._common import (
    check_fp32_precision,
    check_heads,
    check_index,
    check_indptr,
    output,
    require_kernel,
    unit_last_stride,
)

_NAME = "decode_attention_fwd"


def _check(q, k_buffer, v_buffer, kv_indptr, kv_indices) -> None:
    check_heads(_NAME, q, k_buffer, v_buffer)
    check_indptr(_NAME, "kv_indptr", kv_indptr, q.device)
    check_index(_NAME, "kv_indices", kv_indices, q.device)
    if kv_indptr.shape[0] != q.shape[0] + 1:
        raise ValueError(f"{_NAME}: kv_indptr has {kv_indptr.shape[0]} entries for a batch of {q.shape[0]}")


def decode_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_kv_len: int,
    sm_scale: float,
    num_kv_splits: int = 8,
    out: torch.Tensor | None = None,
    fp32_precision: str = "tf32",
) -> torch.Tensor:
    """Triton split-KV kernel (CUDA, or CPU under TRITON_INTERPRET=1); see the module docstring.
    float32 inputs on CUDA use tf32 tensor cores unless `fp32_precision="ieee"` (always exact on CPU)."""
    check_fp32_precision(_NAME, fp32_precision)
    _check(q, k_buffer, v_buffer, kv_indptr, kv_indices)
    if int(num_kv_splits) < 1:
        raise ValueError(f"{_NAME}: num_kv_splits must be >= 1, got {num_kv_splits}")
    out = output(_NAME, q, out)
    require_kernel(_NAME, q)
    splits = max(1, min(int(num_kv_splits), int(max_kv_len)))
    from sgl_kernel.attention._decode_triton import decode_attention_triton

    return decode_attention_triton(
        unit_last_stride(q), unit_last_stride(k_buffer), unit_last_stride(v_buffer), out,
        kv_indptr, kv_indices, splits, float(sm_scale), fp32_precision,
    )


def decode_attention_torch(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_kv_len: int,
    sm_scale: float,
    num_kv_splits: int = 8,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pure-torch reference: one request at a time, float32 math, no splitting. Reads kv_indptr on the
    host (syncs); `max_kv_len` and `num_kv_splits` are accepted for signature parity. kv_len 0 gives 0."""
    _check(q, k_buffer, v_buffer, kv_indptr, kv_indices)
    out = output("decode_attention_torch", q, out)
    out.zero_()
    hq, d = q.shape[1], q.shape[2]
    hk = k_buffer.shape[1]
    group = hq // hk
    kv = kv_indptr.tolist()
    for b in range(q.shape[0]):
        if kv[b + 1] == kv[b]:
            continue
        slots = kv_indices[kv[b]:kv[b + 1]].long()
        k = k_buffer[slots].float()  # (kv_len, Hk, D)
        v = v_buffer[slots].float()
        qb = q[b].float().view(hk, group, d)
        probs = torch.softmax(torch.einsum("hgd,nhd->hgn", qb, k) * sm_scale, dim=-1)
        out[b] = torch.einsum("hgn,nhd->hgd", probs, v).reshape(hq, d).to(out.dtype)
    return out
