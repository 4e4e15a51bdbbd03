"""Triton kernels behind `sgl_kernel.moe`: the softmax top-k router and the grouped expert GEMM. Imported
lazily (triton is optional) and after the interpreter choice, see `sgl_kernel.testing`.

Reductions go through tl.reduce with triton.language.standard's combine functions and the tile loops
spell out their bounds (no tl.cdiv / tl.max / tl.zeros / tl.sum: @jit helpers), so
`sgl_kernel.testing.interpreted` can run this module on CPU."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan

_TL_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _topk_softmax_kernel(logits_ptr, w_ptr, ids_ptr, E, stride_l, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                         RENORMALIZE: tl.constexpr):
    """One token a program: softmax over E experts in float32, the TOP_K largest logits (ties: the lower
    expert id), their probabilities (renormalized to sum 1 when asked)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    ok = offs < E
    x = tl.load(logits_ptr + row * stride_l + offs, mask=ok, other=-float("inf")).to(tl.float32)
    mx = tl.reduce(x, 0, tl.standard._elementwise_max)
    p = tl.where(ok, tl.exp(x - mx), 0.0)
    p = p / tl.reduce(p, 0, tl.standard._sum_combine)
    left = tl.where(ok, x, -float("inf"))
    chosen = tl.full((BLOCK_E,), 0.0, tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.reduce(left, 0, tl.standard._elementwise_max)
        idx = tl.reduce(tl.where(left == best, offs, BLOCK_E), 0, tl.standard._elementwise_min)
        hit = offs == idx
        tl.store(ids_ptr + row * TOP_K + j, idx.to(tl.int32))
        chosen = tl.where(hit, p, chosen)
        left = tl.where(hit, -float("inf"), left)
    total = tl.reduce(chosen, 0, tl.standard._sum_combine)
    # the chosen probabilities again, in rank order: the ids were stored above
    for j in tl.static_range(TOP_K):
        idx = tl.load(ids_ptr + row * TOP_K + j)
        wj = tl.reduce(tl.where(offs == idx, p, 0.0), 0, tl.standard._sum_combine)
        if RENORMALIZE:
            wj = wj / total
        tl.store(w_ptr + row * TOP_K + j, wj)


def plan_topk_softmax(logits: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, renormalize: bool) -> LaunchPlan:
    t, e = logits.shape
    k = ids.shape[1]
    return LaunchPlan(
        _topk_softmax_kernel, (t,),
        dict(logits_ptr=logits, w_ptr=weights, ids_ptr=ids, E=e, stride_l=logits.stride(0)),
        dict(TOP_K=k, BLOCK_E=triton.next_power_of_2(e), RENORMALIZE=bool(renormalize)),
        dict(num_warps=1 if e <= 256 else 4),
    )


def topk_softmax_triton(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    t, e = logits.shape
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=logits.device)
    if t:
        plan_topk_softmax(logits if logits.stride(-1) == 1 else logits.contiguous(), weights, ids, renormalize).launch()
    return weights, ids


@triton.jit
def _fused_moe_kernel(a_ptr, b_ptr, c_ptr, w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_valid,
                      num_blocks_m, stride_am, stride_be, stride_bn, stride_cm, a_scale_ptr, b_scale_ptr,
                      stride_asm, stride_bse, stride_bsn, A_ROW_DIV: tl.constexpr,
                      GATE_UP: tl.constexpr, MUL_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWIZZLE: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, USE_FP8: tl.constexpr, GROUP_N: tl.constexpr,
                      GROUP_K: tl.constexpr):
    """C[s] = A[s // A_ROW_DIV] . B[e]^T over the rows s of one expert's block (`sorted_ids`, padded with
    num_valid). GATE_UP: B[e] holds 2N rows (gate, then up) and C[s] = silu(gate) * up (N columns).
    MUL_WEIGHT: each row scaled by its routing weight w[s].

    USE_FP8 (block-FP8 experts): A and B are e4m3; A has one float32 scale per row and GROUP_K columns
    (a_scale [rows, K / GROUP_K]), B one per GROUP_N rows and GROUP_K columns (b_scale [E, 2N or N /
    GROUP_N, K / GROUP_K], unit stride along K). GROUP_K is a multiple of BLOCK_K, so one K tile has one
    scale pair and each tile's dot is scaled once, in float32, before it is added."""
    pid = tl.program_id(0)
    grid_n = (N + BLOCK_N - 1) // BLOCK_N
    per_group = SWIZZLE * grid_n
    first_m = (pid // per_group) * SWIZZLE
    rows_in_group = tl.minimum(num_blocks_m - first_m, SWIZZLE)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return  # a padding block past the last expert's tokens

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(sorted_ids_ptr + offs_m)
    row_ok = rows < num_valid
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    a_ptrs = a_ptr + (rows // A_ROW_DIV).to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + expert * stride_be + offs_n.to(tl.int64)[None, :] * stride_bn + offs_k[:, None]
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    acc_up = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    if USE_FP8:
        as_ptrs = a_scale_ptr + (rows // A_ROW_DIV).to(tl.int64) * stride_asm
        bs_ptrs = b_scale_ptr + expert * stride_bse + (offs_n // GROUP_N).to(tl.int64) * stride_bsn
        bs_up_ptrs = b_scale_ptr + expert * stride_bse + ((offs_n + N) // GROUP_N).to(tl.int64) * stride_bsn
    for kb in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        k_ok = offs_k < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if USE_FP8:
            kg = (kb * BLOCK_K) // GROUP_K
            a_s = tl.load(as_ptrs + kg, mask=row_ok, other=0.0)
            b_s = tl.load(bs_ptrs + kg, mask=n_ok, other=0.0)
            acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        else:
            acc += tl.dot(a, b, input_precision=DOT_PRECISION)
        if GATE_UP:
            b_up = tl.load(b_ptrs + N * stride_bn, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if USE_FP8:
                b_s_up = tl.load(bs_up_ptrs + kg, mask=n_ok, other=0.0)
                acc_up += tl.dot(a, b_up) * a_s[:, None] * b_s_up[None, :]
            else:
                acc_up += tl.dot(a, b_up, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if GATE_UP:
        # rounded to the activations' dtype first, as the unfused product (linear, then silu * up) is
        gate = acc.to(c_ptr.dtype.element_ty).to(tl.float32)
        up = acc_up.to(c_ptr.dtype.element_ty).to(tl.float32)
        acc = gate / (1.0 + tl.exp(-gate)) * up
    if MUL_WEIGHT:
        acc = acc.to(c_ptr.dtype.element_ty).to(tl.float32)
        acc = acc * tl.load(w_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def moe_block_config(num_tokens: int, top_k: int, num_experts: int, on_cuda: bool = True) -> dict:
    """Default tile sizes of both GEMMs (no tuned file, see sgl_kernel.moe.configs): BLOCK_M follows the
    tokens an expert gets on average (decode: few)."""
    if not on_cuda:  # the interpreter: small tiles, the same math
        return dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=1)
    per_expert = num_tokens * top_k / max(1, num_experts)
    if per_expert <= 16:
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)


def plan_fused_moe(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, weights: torch.Tensor | None,
                   sorted_ids: torch.Tensor, expert_ids: torch.Tensor, num_post: torch.Tensor, num_valid: int,
                   a_row_div: int, gate_up: bool, config: dict, a_scale: torch.Tensor | None = None,
                   b_scale: torch.Tensor | None = None, block: tuple[int, int] | None = None) -> LaunchPlan:
    """One grouped GEMM launch (shapes, strides and dtypes only). b: [E, 2N, K] (gate_up) or [E, N, K].
    Block-FP8: a and b e4m3 with a_scale [rows, K / block[1]], b_scale [E, rows / block[0], K / block[1]];
    BLOCK_K is cut to a divisor of block[1] (one scale pair per K tile)."""
    n = b.shape[1] // 2 if gate_up else b.shape[1]
    k = b.shape[2]
    bm = config["BLOCK_M"]
    blocks_m = sorted_ids.shape[0] // bm
    grid = (blocks_m * triton.cdiv(n, config["BLOCK_N"]),)
    fp32 = a.dtype == torch.float32
    fp8 = a_scale is not None
    gn, gk = block if fp8 else (1, 1)
    bk = config["BLOCK_K"]
    if fp8:
        from math import gcd

        bk = gcd(bk, gk)
    scales = (a_scale, b_scale) if fp8 else (sorted_ids, sorted_ids)  # unread placeholders without FP8
    return LaunchPlan(
        _fused_moe_kernel, grid,
        dict(a_ptr=a, b_ptr=b, c_ptr=c, w_ptr=weights if weights is not None else sorted_ids, sorted_ids_ptr=sorted_ids,
             expert_ids_ptr=expert_ids, num_post_ptr=num_post, N=n, K=k, num_valid=num_valid, num_blocks_m=blocks_m,
             stride_am=a.stride(0), stride_be=b.stride(0), stride_bn=b.stride(1), stride_cm=c.stride(0),
             a_scale_ptr=scales[0], b_scale_ptr=scales[1], stride_asm=a_scale.stride(0) if fp8 else 0,
             stride_bse=b_scale.stride(0) if fp8 else 0, stride_bsn=b_scale.stride(1) if fp8 else 0),
        dict(A_ROW_DIV=a_row_div, GATE_UP=gate_up, MUL_WEIGHT=weights is not None, BLOCK_M=bm,
             BLOCK_N=config["BLOCK_N"], BLOCK_K=bk, SWIZZLE=config.get("GROUP_M", 8),
             DOT_PRECISION="ieee" if fp32 else "tf32", USE_FP8=fp8, GROUP_N=gn, GROUP_K=gk),
        dict(num_warps=config["num_warps"], num_stages=config["num_stages"]),
    )
