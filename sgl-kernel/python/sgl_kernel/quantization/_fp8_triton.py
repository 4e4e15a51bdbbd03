"""Triton kernels behind `sgl_kernel.quantization`: per-token-group FP8 quantization and the w8a8 block-FP8
GEMM. Imported lazily (triton is optional) and after the interpreter choice, see `sgl_kernel.testing`.

Reductions go through tl.reduce with triton.language.standard's combine functions (core builtins), not
tl.max (a @jit helper), so `sgl_kernel.testing.interpreted` can run this module on CPU."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan

_FP8_MAX = tl.constexpr(448.0)
_EPS = tl.constexpr(1e-10)


@triton.jit
def _round_to_e4m3(y):
    """y (within +-448) rounded to the nearest e4m3 value, ties to even, still in float32: the cast that
    follows is then exact. The hardware cast rounds the same way; the Triton interpreter's does not (it
    turns 124.3 into 64), and this keeps the interpreted kernel equal to the reference."""
    mag = tl.abs(y)
    e = ((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6) - 3  # the exponent of one e4m3 step at mag (subnormals below 2^-6)
    step = ((e + 127) << 23).to(tl.float32, bitcast=True)
    inv_step = ((127 - e) << 23).to(tl.float32, bitcast=True)
    r = ((mag * inv_step + 12582912.0) - 12582912.0) * step  # 1.5 * 2^23: round half to even
    # y's sign bit onto r, not where(y < 0, -r, r): compiled, -r of 0.0 came out +0.0 where the reference
    # has -0.0 (tiny negative inputs; bit-exact tests on an H200, 2026-11-26)
    sign = y.to(tl.int32, bitcast=True) & -2147483648
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _group_quant_kernel(x_ptr, q_ptr, s_ptr, n_rows, n_cols, stride_x, stride_q, stride_s,
                        GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    amax = tl.reduce(tl.abs(x), 1, tl.standard._elementwise_max)
    scale = tl.maximum(amax, _EPS) / _FP8_MAX
    # div_rn: the reference divides in IEEE float32; the default approximate division could land on the
    # other side of an e4m3 rounding boundary
    y = tl.math.div_rn(x, scale[:, None])
    y = _round_to_e4m3(tl.minimum(tl.maximum(y, -_FP8_MAX), _FP8_MAX))
    tl.store(q_ptr + rows64[:, None] * stride_q + cols[None, :], y.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + rows64 * stride_s + g, scale, mask=rows < n_rows)


def plan_group_quant(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group_size: int) -> LaunchPlan:
    m, k = x.shape
    block_m = 16
    return LaunchPlan(
        _group_quant_kernel, (triton.cdiv(m, block_m), triton.cdiv(k, group_size)),
        dict(x_ptr=x, q_ptr=q, s_ptr=s, n_rows=m, n_cols=k, stride_x=x.stride(0), stride_q=q.stride(0),
             stride_s=s.stride(0)),
        dict(GROUP=group_size, BLOCK_M=block_m), dict(num_warps=4),
    )


def per_token_group_quant_fp8_triton(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if group_size < 16 or group_size & (group_size - 1):
        raise ValueError(f"per_token_group_quant_fp8: the kernel takes a power-of-two group >= 16, got {group_size}")
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, triton.cdiv(k, group_size)), dtype=torch.float32, device=x.device)
    if m and k:
        plan_group_quant(x, q, s, group_size).launch()
    return q, s


@triton.jit
def _block_fp8_matmul_kernel(a_ptr, b_ptr, c_ptr, as_ptr, bs_ptr, M, N, K, stride_am, stride_bn, stride_cm,
                             stride_asm, stride_bsn, GROUP_N: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWIZZLE: tl.constexpr):
    """C (M, N) = A (M, K) . B (N, K)^T with A, B in e4m3. BLOCK_K is the scale group along K, so each
    step's partial product takes one activation scale per row and one weight scale per column."""
    pid = tl.program_id(0)
    grid_m = (M + BLOCK_M - 1) // BLOCK_M  # not tl.cdiv: a @jit helper (see the module docstring)
    grid_n = (N + BLOCK_N - 1) // BLOCK_N
    # groups of SWIZZLE row blocks walk the columns together, so B's tiles are reused from L2
    per_group = SWIZZLE * grid_n
    first_m = (pid // per_group) * SWIZZLE
    rows_in_group = tl.minimum(grid_m - first_m, SWIZZLE)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n.to(tl.int64)[None, :] * stride_bn + offs_k[:, None]
    as_ptrs = as_ptr + offs_m.to(tl.int64) * stride_asm
    bs_ptrs = bs_ptr + (offs_n // GROUP_N).to(tl.int64) * stride_bsn

    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for kb in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        k_ok = offs_k < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        a_s = tl.load(as_ptrs + kb, mask=m_ok, other=0.0)
        b_s = tl.load(bs_ptrs + kb, mask=n_ok, other=0.0)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def plan_block_fp8_matmul(a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor,
                          c: torch.Tensor, block: tuple[int, int], on_cuda: bool = True) -> LaunchPlan:
    """The launch for one block-FP8 product (shapes, strides and dtypes only). BLOCK_K is the scale block
    along K (128 in the releases); row tiles of 64 for decode-sized M, 128 beyond."""
    m, k = a_q.shape
    n = b_q.shape[0]
    group_n, group_k = block
    if not on_cuda:  # the interpreter: small tiles, the same math
        block_m, block_n, warps, stages = 16, min(group_n, 32), 4, 1
    else:
        block_m = 64 if m <= 64 else 128
        block_n, warps, stages = 128, 4 if m <= 64 else 8, 4 if m <= 64 else 3
    if group_n % block_n and block_n % group_n:
        raise ValueError(f"w8a8_block_fp8_matmul: a weight block of {group_n} rows does not tile {block_n}-wide column tiles")
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    return LaunchPlan(
        _block_fp8_matmul_kernel, grid,
        dict(a_ptr=a_q, b_ptr=b_q, c_ptr=c, as_ptr=a_s, bs_ptr=b_s, M=m, N=n, K=k, stride_am=a_q.stride(0),
             stride_bn=b_q.stride(0), stride_cm=c.stride(0), stride_asm=a_s.stride(0), stride_bsn=b_s.stride(0)),
        dict(GROUP_N=group_n, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=group_k, SWIZZLE=8),
        dict(num_warps=warps, num_stages=stages),
    )


def w8a8_block_fp8_matmul_triton(a_q: torch.Tensor, a_s: torch.Tensor, b_q: torch.Tensor, b_s: torch.Tensor,
                                 block: tuple[int, int], out_dtype: torch.dtype) -> torch.Tensor:
    if block[1] < 16 or block[1] & (block[1] - 1):
        raise ValueError(f"w8a8_block_fp8_matmul: the kernel takes a power-of-two K block >= 16, got {block[1]}")
    m, n = a_q.shape[0], b_q.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a_q.device)
    if m and n:
        if a_q.shape[1] == 0:
            return c.zero_()
        plan_block_fp8_matmul(a_q, a_s, b_q, b_s, c, block, on_cuda=a_q.is_cuda).launch()
    return c
