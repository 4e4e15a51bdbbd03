"""Extend (prefill with a cached prefix) attention over a paged KV pool.

Shapes and invariants (B requests, T new tokens in all, Hq = GROUP * Hk query heads, head dim D):

- q (T, Hq, D): every request's new tokens concatenated; request b's queries are
  q[qo_indptr[b]:qo_indptr[b+1]] (q_len_b of them, possibly 0). qo_indptr (B+1,) int32/int64,
  non-decreasing, qo_indptr[0] = 0 and qo_indptr[B] = T.
- k_buffer, v_buffer (num_slots, Hk, D): the KV pool of one layer (any row/head strides). Request b's
  keys, in sequence order, are at slots kv_indices[kv_indptr[b]:kv_indptr[b+1]] (kv_len_b >= q_len_b of
  them); kv_indices 1-D int32/int64, kv_indptr (B+1,). The slots are token-level, so any page size works
  (with page size P they simply come in runs of P).
- The new tokens' K/V are already in the pool: they are the last q_len_b of request b's slots. Query j of
  request b sits at position kv_len_b - q_len_b + j and attends keys 0..that position: all of the cached
  prefix, causal among the new tokens.
- max_q_len >= max_b q_len_b, known on the host: it sizes the grid, so the launch needs no device sync.
- Query head h reads kv head h // GROUP; K/V are never repeated in memory.

Returns (T, Hq, D) in q's dtype, or writes into `out` (same shape, any float dtype, unit stride along D).
Scores and softmax accumulate in float32.
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

_NAME = "extend_attention_fwd"


def _check(q, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices) -> None:
    check_heads(_NAME, q, k_buffer, v_buffer)
    check_indptr(_NAME, "qo_indptr", qo_indptr, q.device)
    check_indptr(_NAME, "kv_indptr", kv_indptr, q.device)
    check_index(_NAME, "kv_indices", kv_indices, q.device)
    if qo_indptr.shape != kv_indptr.shape:
        raise ValueError(
            f"{_NAME}: qo_indptr {tuple(qo_indptr.shape)} and kv_indptr {tuple(kv_indptr.shape)} must both "
            f"be (B+1,)"
        )


def extend_attention_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_q_len: int,
    sm_scale: float,
    out: torch.Tensor | None = None,
    fp32_precision: str = "tf32",
) -> torch.Tensor:
    """Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1); see the module docstring for shapes.
    float32 inputs on CUDA use tf32 tensor cores unless `fp32_precision="ieee"` (always exact on CPU).
    Memory is O(T * Hq * D): no score matrix is materialized."""
    check_fp32_precision(_NAME, fp32_precision)
    _check(q, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices)
    out = output(_NAME, q, out)
    require_kernel(_NAME, q)
    from sgl_kernel.attention._prefill_triton import prefill_attention_triton

    return prefill_attention_triton(
        unit_last_stride(q), unit_last_stride(k_buffer), unit_last_stride(v_buffer), out,
        qo_indptr, kv_indptr, kv_indices, int(max_q_len), float(sm_scale), causal=True,
        fp32_precision=fp32_precision,
    )


def extend_attention_torch(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_q_len: int,
    sm_scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pure-torch reference: one request at a time, float32 math, explicit position mask. Reads the
    index tensors on the host (syncs); `max_q_len` is accepted for signature parity and not needed.
    Rows of a fresh output that belong to no request are zero."""
    _check(q, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices)
    out = torch.zeros_like(q) if out is None else output("extend_attention_torch", q, out)
    hq, d = q.shape[1], q.shape[2]
    hk = k_buffer.shape[1]
    group = hq // hk
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        if kv_len < q_len:
            raise ValueError(f"extend_attention_torch: request {b} has {q_len} queries but {kv_len} keys")
        if q_len == 0:
            continue
        slots = kv_indices[kv[b]:kv[b + 1]].long()
        k = k_buffer[slots].float()  # (kv_len, Hk, D)
        v = v_buffer[slots].float()
        qb = q[qo[b]:qo[b + 1]].float().view(q_len, hk, group, d)
        scores = torch.einsum("qhgd,nhd->hgqn", qb, k) * sm_scale
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
        k_pos = torch.arange(kv_len, device=q.device)
        visible = k_pos[None, :] <= q_pos[:, None]  # (q_len, kv_len)
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        ob = torch.einsum("hgqn,nhd->qhgd", probs, v).reshape(q_len, hq, d)
        out[qo[b]:qo[b + 1]] = ob.to(out.dtype)
    return out
