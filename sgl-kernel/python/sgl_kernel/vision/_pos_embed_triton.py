"""Triton kernel behind `sgl_kernel.vision.gather_blend_rows`. Imported lazily: triton is optional.

`triton.jit` decides at import whether the kernel is compiled or interpreted (TRITON_INTERPRET=1), so
this module must be imported after that choice is made; see `sgl_kernel.testing.interpreted`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan


@triton.jit
def _gather_blend_kernel(
    table_ptr,
    idx_ptr,
    w_ptr,
    out_ptr,
    n_rows,
    dim,
    stride_table,
    stride_out,
    TAPS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < dim)[None, :]
    # NOTE: tl.full, not tl.zeros: tl.zeros is itself a @jit helper compiled when triton was imported,
    # which breaks this kernel under an interpreter switched on after that import (as in the tests).
    acc = tl.full((BLOCK_N, BLOCK_D), 0.0, tl.float32)
    # Taps are accumulated in order, in float32, like the reference's t0*w0 + t1*w1 + ...
    for k in tl.static_range(TAPS):
        i = tl.load(idx_ptr + rows * TAPS + k, mask=row_ok, other=0).to(tl.int64)
        wk = tl.load(w_ptr + rows * TAPS + k, mask=row_ok, other=0.0)
        v = tl.load(table_ptr + i[:, None] * stride_table + cols[None, :], mask=mask, other=0.0)
        acc += v.to(tl.float32) * wk[:, None]
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


def plan_gather_blend(table: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, out: torch.Tensor) -> LaunchPlan:
    """The launch for (N, K) taps into a (V, D) table (shapes, strides and dtypes only)."""
    n, taps = idx.shape
    dim = table.shape[1]
    # Column blocks that tile D exactly where possible (1152 = 9 x 128, 1024 = 4 x 256), so no lanes idle.
    block_d = next((b for b in (256, 128, 64) if dim % b == 0), min(triton.next_power_of_2(dim), 256))
    block_n = 16
    return LaunchPlan(
        _gather_blend_kernel, (triton.cdiv(n, block_n), triton.cdiv(dim, block_d)),
        dict(table_ptr=table, idx_ptr=idx, w_ptr=weights, out_ptr=out, n_rows=n, dim=dim,
             stride_table=table.stride(0), stride_out=out.stride(0)),
        dict(TAPS=taps, BLOCK_N=block_n, BLOCK_D=block_d),
    )


def gather_blend_rows_triton(
    table: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    n = idx.shape[0]
    dim = table.shape[1]
    out = torch.empty((n, dim), dtype=out_dtype, device=table.device)
    if n == 0 or dim == 0:
        return out
    plan_gather_blend(table, idx, weights, out).launch()
    return out
