"""Triton kernel behind `extend_attention_fwd` and `varlen_attention_fwd`. Imported lazily: triton is
optional, and `triton.jit` decides compiled vs interpreted (TRITON_INTERPRET=1) when this module is
imported.

One kernel serves both: a program owns BLOCK_M consecutive queries of one request/segment and one query
head, and streams that request's keys in BLOCK_N blocks with an online softmax (running max `m`, running
denominator `l`, float32 accumulator), so no (q_len x kv_len) score matrix ever exists in memory.

- PAGED: key n of request b lives at row `kv_indices[kv_indptr[b] + n]` of the K/V buffers (extend), or
  at row `kv_indptr[b] + n` (varlen: packed, contiguous).
- CAUSAL: query j of a request with q_len queries and kv_len keys sits at absolute position
  `kv_len - q_len + j` and sees keys 0..that position (bottom-right aligned causal mask); otherwise every
  query sees every key of its request.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan, dot_precision, stride_unit

_LOG2E = 1.4426950408889634


@triton.jit
def _prefill_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    q_indptr_ptr, kv_indptr_ptr, kv_indices_ptr,
    qk_scale,  # sm_scale * log2(e): the softmax runs in base 2
    stride_qt, stride_qh,  # every stride in units of STRIDE_UNIT elements
    stride_kt, stride_kh,
    stride_vt, stride_vh,
    stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr,
    STRIDE_UNIT: tl.constexpr,  # 16 bytes' worth of elements when every stride is a multiple of it, else 1
    GROUP: tl.constexpr,  # query heads per kv head
    PAGED: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,  # the head dim's first columns: the largest power of two <= HEAD_DIM (>= 16)
    BLOCK_DT: tl.constexpr,  # the rest, padded to a power of two >= 16; 0: none (HEAD_DIM a power of two)
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // GROUP

    q_start = tl.load(q_indptr_ptr + b).to(tl.int64)
    q_len = (tl.load(q_indptr_ptr + b + 1).to(tl.int64) - q_start).to(tl.int32)
    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    kv_len = (tl.load(kv_indptr_ptr + b + 1).to(tl.int64) - kv_start).to(tl.int32)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n0 = tl.arange(0, BLOCK_N)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    # A head dim of 72 or 80 runs as 64 + 16 columns, not padded to 128 (44% / 37.5% wasted dots)
    if BLOCK_DT > 0:
        offs_dt = BLOCK_D + tl.arange(0, BLOCK_DT)
        dt_mask = offs_dt < HEAD_DIM
    # Strides arrive divided by STRIDE_UNIT: multiplied back by a constant, every row start is provably
    # 16-byte aligned, so rows load as 128-bit vectors even where the stride itself (72, 80 elements) is
    # not a multiple of 16.
    stride_qt = stride_qt * STRIDE_UNIT
    stride_qh = stride_qh * STRIDE_UNIT
    stride_kt = stride_kt * STRIDE_UNIT
    stride_kh = stride_kh * STRIDE_UNIT
    stride_vt = stride_vt * STRIDE_UNIT
    stride_vh = stride_vh * STRIDE_UNIT
    stride_ot = stride_ot * STRIDE_UNIT
    stride_oh = stride_oh * STRIDE_UNIT

    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :], other=0.0,
    )
    if BLOCK_DT > 0:
        q_t = tl.load(q_ptr + rows[:, None] * stride_qt + h * stride_qh + offs_dt[None, :],
                      mask=m_mask[:, None] & dt_mask[None, :], other=0.0)

    # Keys this block can see: all of them, or (causal) up to the last query's position.
    hi = kv_len
    if CAUSAL:
        prefix = kv_len - q_len
        hi = tl.minimum(kv_len, prefix + (pid_m + 1) * BLOCK_M)
    # A block entirely past the request's queries does no work (the grid is sized by the longest one).
    hi = tl.where(pid_m * BLOCK_M < q_len, hi, 0)

    # Finite initial max: a row that sees no key in a block keeps m, and exp2(-inf - m) = 0, no NaN.
    m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)
    l_i = tl.full((BLOCK_M,), 0.0, tl.float32)
    acc = tl.full((BLOCK_M, BLOCK_D), 0.0, tl.float32)
    if BLOCK_DT > 0:
        acc_t = tl.full((BLOCK_M, BLOCK_DT), 0.0, tl.float32)

    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_mask = offs_n < hi
        if PAGED:
            slots = tl.load(kv_indices_ptr + kv_start + offs_n, mask=n_mask, other=0).to(tl.int64)
        else:
            slots = (kv_start + offs_n).to(tl.int64)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + slots[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)
        if BLOCK_DT > 0:
            k_t = tl.load(k_ptr + slots[:, None] * stride_kt + kvh * stride_kh + offs_dt[None, :],
                          mask=n_mask[:, None] & dt_mask[None, :], other=0.0)
            s += tl.dot(q_t, tl.trans(k_t.to(q.dtype)), input_precision=DOT_PRECISION)
        s = s * qk_scale
        visible = n_mask[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= (prefix + offs_m)[:, None])
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + slots[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
        if BLOCK_DT > 0:
            v_t = tl.load(v_ptr + slots[:, None] * stride_vt + kvh * stride_vh + offs_dt[None, :],
                          mask=n_mask[:, None] & dt_mask[None, :], other=0.0)
            acc_t = acc_t * alpha[:, None] + tl.dot(p.to(q.dtype), v_t.to(q.dtype), input_precision=DOT_PRECISION)
        m_i = m_new

    # Every real query sees at least key 0, so l > 0 there; padding rows are never stored.
    inv_l = 1.0 / tl.where(l_i > 0.0, l_i, 1.0)
    tl.store(
        out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        (acc * inv_l[:, None]).to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )
    if BLOCK_DT > 0:
        tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_dt[None, :],
                 (acc_t * inv_l[:, None]).to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & dt_mask[None, :])


def head_dim_blocks(head_dim: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_DT): the largest power of two <= head_dim, then the rest padded to a power of two;
    both >= 16 (tl.dot's smallest), BLOCK_DT 0 when nothing is left. 72 -> (64, 16), 80 -> (64, 16),
    128 -> (128, 0), 8 -> (16, 0)."""
    main = max(16, 1 << (max(1, head_dim).bit_length() - 1))
    rest = head_dim - main
    return main, (max(16, triton.next_power_of_2(rest)) if rest > 0 else 0)


def _blocks(head_dim: int, is_cuda: bool, max_q_len: int, elem_size: int = 2) -> tuple[int, int, int, dict]:
    """(BLOCK_M, BLOCK_N, width of the head-dim pieces, launch options). tl.dot needs every block dim >= 16;
    tiny blocks on the interpreter keep CPU tests fast. On CUDA the query block follows the longest
    segment: Qwen2.5-VL's windowed vision layers attend at most 64 patches, and a 128-row block would be
    half padding."""
    block_d = sum(head_dim_blocks(head_dim))
    if not is_cuda:
        return 16, 16, block_d, {}
    if block_d > 128:
        # head_dim 256 (Qwen3.5's full attention): float32 (tf32) tiles of 32 keys spill (464 bytes a thread on
        # sm_90a, triton 3.6); 16-key tiles keep wgmma with 0 spills. bf16 fits 32 keys without spilling.
        return 64, 32 if elem_size <= 2 else 16, block_d, dict(num_warps=8, num_stages=1)
    if max_q_len <= 64:
        return 64, 64, block_d, dict(num_warps=4, num_stages=3 if block_d <= 64 else 2)
    if block_d <= 64 and elem_size <= 2:
        return 128, 64, block_d, dict(num_warps=4, num_stages=3)
    # float32 (tf32) tiles are twice the bytes: 8 warps, or the 64-wide heads spill at 4
    return 128, 64, block_d, dict(num_warps=8, num_stages=2)


def plan_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    q_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor | None,
    max_q_len: int, sm_scale: float, causal: bool, on_cuda: bool, fp32_precision: str = "tf32",
) -> LaunchPlan:
    """Grid, arguments, constexprs and options of one launch. Shapes, strides and dtypes only (meta
    tensors do): the machine-code report compiles exactly what a launch would."""
    batch = q_indptr.shape[0] - 1
    hq, hk, head_dim = q.shape[1], k.shape[1], q.shape[2]
    block_m, block_n, _, opts = _blocks(head_dim, on_cuda, max_q_len, q.element_size())
    block_d, block_dt = head_dim_blocks(head_dim)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               out.stride(0), out.stride(1))
    unit = stride_unit(strides, q.element_size())
    s = [x // unit for x in strides]
    args = dict(
        q_ptr=q, k_ptr=k, v_ptr=v, out_ptr=out,
        q_indptr_ptr=q_indptr, kv_indptr_ptr=kv_indptr,
        kv_indices_ptr=kv_indices if kv_indices is not None else kv_indptr,
        qk_scale=sm_scale * _LOG2E,
        stride_qt=s[0], stride_qh=s[1], stride_kt=s[2], stride_kh=s[3],
        stride_vt=s[4], stride_vh=s[5], stride_ot=s[6], stride_oh=s[7],
    )
    constexprs = dict(
        HEAD_DIM=head_dim, STRIDE_UNIT=unit,
        GROUP=hq // hk, PAGED=kv_indices is not None, CAUSAL=causal,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DT=block_dt, DOT_PRECISION=dot_precision(q.dtype, on_cuda, fp32_precision),
    )
    grid = (triton.cdiv(max(max_q_len, 1), block_m), max(batch, 0), hq)
    return LaunchPlan(_prefill_fwd_kernel, grid, args, constexprs, opts)


def prefill_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    q_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor | None,
    max_q_len: int, sm_scale: float, causal: bool, fp32_precision: str = "tf32",
) -> torch.Tensor:
    """Launches the kernel; arguments already checked by the public wrappers. q/out (T, Hq, D),
    k/v (rows, Hk, D), all with unit stride along D. kv_indices None means packed (varlen)."""
    if q_indptr.shape[0] <= 1 or max_q_len <= 0 or q.shape[0] == 0:
        return out
    plan_prefill(q, k, v, out, q_indptr, kv_indptr, kv_indices, max_q_len, sm_scale, causal, q.is_cuda,
                 fp32_precision).launch()
    return out
