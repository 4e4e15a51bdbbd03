"""Triton kernels behind `decode_attention_fwd` (split-KV, two stages). Imported lazily: triton is
optional, and `triton.jit` decides compiled vs interpreted (TRITON_INTERPRET=1) when this module is
imported.

Stage 1, grid (B, Hk, S): the program for (request b, kv head g, split s) takes every query head of g's
group at once (GROUP rows, padded to BLOCK_H >= 16 for tl.dot), so each K/V row is read once per group.
Request b's kv_len_b keys are cut into S chunks of ceil(kv_len_b / S) keys; split s streams its chunk with
an online softmax and writes, per query head, its normalized partial output o_s (D floats) and its
log-sum-exp lse_s (base 2) into float32 workspaces. An empty chunk (kv_len_b < S) writes lse_s = -inf.

Stage 2, grid (B, Hq): merges the S partials: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M).
A request with kv_len 0 (every lse_s = -inf) gets an output of zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan, dot_precision

_LOG2E = 1.4426950408889634


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, mid_o_ptr, mid_lse_ptr,
    kv_indptr_ptr, kv_indices_ptr,
    qk_scale,  # sm_scale * log2(e)
    head_dim,
    stride_qb, stride_qh,
    stride_kt, stride_kh,
    stride_vt, stride_vh,
    stride_mb, stride_mh, stride_ms,  # mid_o (B, Hq, S, BLOCK_D); mid_lse (B, Hq, S) shares the first 3
    stride_lb, stride_lh,
    GROUP: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    kv_len = (tl.load(kv_indptr_ptr + b + 1).to(tl.int64) - kv_start).to(tl.int32)
    split_len = tl.cdiv(kv_len, NUM_SPLITS)
    lo = tl.minimum(split * split_len, kv_len)
    hi = tl.minimum(lo + split_len, kv_len)

    offs_g = tl.arange(0, BLOCK_H)
    heads = kvh * GROUP + offs_g
    h_mask = offs_g < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    offs_n0 = tl.arange(0, BLOCK_N)

    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full((BLOCK_H,), -1.0e30, tl.float32)
    l_i = tl.full((BLOCK_H,), 0.0, tl.float32)
    acc = tl.full((BLOCK_H, BLOCK_D), 0.0, tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_mask = offs_n < hi
        slots = tl.load(kv_indices_ptr + kv_start + offs_n, mask=n_mask, other=0).to(tl.int64)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + slots[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + slots[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
        m_i = m_new

    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    lse = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))
    row = b * stride_mb + heads * stride_mh + split * stride_ms
    tl.store(mid_o_ptr + row[:, None] + offs_d[None, :], acc / l_safe[:, None], mask=h_mask[:, None])
    tl.store(mid_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=h_mask)


@triton.jit
def _decode_merge_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr,
    head_dim,
    stride_mb, stride_mh, stride_ms,
    stride_lb, stride_lh,
    stride_ob, stride_oh,
    NUM_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    # Finite initial max: 2^(-inf - m) = 0 for empty splits, never NaN. (1,)-shaped loop carries.
    m = tl.full((1,), -1.0e30, tl.float32)
    l = tl.full((1,), 0.0, tl.float32)
    acc = tl.full((BLOCK_D,), 0.0, tl.float32)
    for s in range(NUM_SPLITS):
        lse = tl.load(mid_lse_ptr + b * stride_lb + h * stride_lh + s)
        o = tl.load(mid_o_ptr + b * stride_mb + h * stride_mh + s * stride_ms + offs_d)
        m_new = tl.maximum(m, lse)
        scale = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * scale + w * o
        l = l * scale + w
        m = m_new
    acc = acc / tl.where(l > 0.0, l, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, acc.to(out_ptr.dtype.element_ty),
             mask=offs_d < head_dim)


def plan_decode(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, out: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, num_kv_splits: int, sm_scale: float,
    mid_o: torch.Tensor, mid_lse: torch.Tensor, on_cuda: bool, fp32_precision: str = "tf32",
) -> tuple[LaunchPlan, LaunchPlan]:
    """The two stages' launches (shapes, strides and dtypes only: meta tensors do). mid_o
    (B, Hq, S, BLOCK_D) and mid_lse (B, Hq, S) float32 come from `decode_workspace`."""
    batch, hq, head_dim = q.shape
    hk = k_buffer.shape[1]
    group = hq // hk
    block_d = mid_o.shape[-1]
    split = LaunchPlan(
        _decode_split_kernel, (batch, hk, num_kv_splits),
        dict(
            q_ptr=q, k_ptr=k_buffer, v_ptr=v_buffer, mid_o_ptr=mid_o, mid_lse_ptr=mid_lse,
            kv_indptr_ptr=kv_indptr, kv_indices_ptr=kv_indices, qk_scale=sm_scale * _LOG2E, head_dim=head_dim,
            stride_qb=q.stride(0), stride_qh=q.stride(1), stride_kt=k_buffer.stride(0), stride_kh=k_buffer.stride(1),
            stride_vt=v_buffer.stride(0), stride_vh=v_buffer.stride(1),
            stride_mb=mid_o.stride(0), stride_mh=mid_o.stride(1), stride_ms=mid_o.stride(2),
            stride_lb=mid_lse.stride(0), stride_lh=mid_lse.stride(1),
        ),
        dict(GROUP=group, NUM_SPLITS=num_kv_splits, BLOCK_H=max(16, triton.next_power_of_2(group)),
             BLOCK_N=64 if on_cuda else 16, BLOCK_D=block_d, DOT_PRECISION=dot_precision(q.dtype, on_cuda, fp32_precision)),
        dict(num_warps=4, num_stages=2) if on_cuda else {},
    )
    merge = LaunchPlan(
        _decode_merge_kernel, (batch, hq),
        dict(
            mid_o_ptr=mid_o, mid_lse_ptr=mid_lse, out_ptr=out, head_dim=head_dim,
            stride_mb=mid_o.stride(0), stride_mh=mid_o.stride(1), stride_ms=mid_o.stride(2),
            stride_lb=mid_lse.stride(0), stride_lh=mid_lse.stride(1),
            stride_ob=out.stride(0), stride_oh=out.stride(1),
        ),
        dict(NUM_SPLITS=num_kv_splits, BLOCK_D=block_d),
        dict(num_warps=1) if on_cuda else {},
    )
    return split, merge


def decode_workspace(batch: int, hq: int, head_dim: int, num_kv_splits: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 partial outputs, padded to BLOCK_D so neither stage needs a D mask on them, and lses."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    mid_o = torch.empty((batch, hq, num_kv_splits, block_d), dtype=torch.float32, device=device)
    mid_lse = torch.empty((batch, hq, num_kv_splits), dtype=torch.float32, device=device)
    return mid_o, mid_lse


def decode_attention_triton(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, out: torch.Tensor,
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, num_kv_splits: int, sm_scale: float,
    fp32_precision: str = "tf32",
) -> torch.Tensor:
    """Launches both stages; arguments already checked by `decode_attention_fwd`. q/out (B, Hq, D),
    k/v buffers (num_slots, Hk, D), unit stride along D."""
    batch, hq, head_dim = q.shape
    if batch == 0 or hq == 0:
        return out
    mid_o, mid_lse = decode_workspace(batch, hq, head_dim, num_kv_splits, q.device)
    for plan in plan_decode(q, k_buffer, v_buffer, out, kv_indptr, kv_indices, num_kv_splits, sm_scale,
                            mid_o, mid_lse, q.is_cuda, fp32_precision):
        plan.launch()
    return out
