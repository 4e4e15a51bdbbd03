"""Block-FP8 experts (the -FP8 Qwen3-VL-MoE releases): e4m3 weights with one float32 scale per block,
activations quantized per token and column group at run time, as the dense block-FP8 linears do
(sgl_kernel.quantization). One GEMM pair per expert that received tokens, through
`w8a8_block_fp8_matmul` (its Triton kernel for CUDA tensors, the float32 torch reference elsewhere).

Layouts: w13 [E, 2N, H] e4m3 with s13 [E, ceil(2N / b13[0]), ceil(H / b13[1])]; w2 [E, H, N] e4m3 with
s2 [E, ceil(H / b2[0]), ceil(N / b2[1])]. The gate_up activations are grouped by b13[1] columns, the
down activations by b2[1] (a TP shard of the intermediate dim may start inside a 128-column block, so
b2[1] can be a divisor of 128). Ids of -1: experts on other ranks, never computed."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_experts_fp8(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor, block13: tuple[int, int],
                      block2: tuple[int, int], linear=None) -> torch.Tensor:
    """sum_k w_k * down_e(silu(gate_e(x)) * up_e(x)) in x's dtype, each product a block-FP8 GEMM.
    `linear(x, w_q, w_s, block, out_dtype)` replaces the quantized GEMM (a test passes the weights alone)."""
    linear = linear or w8a8_linear
    t, k = topk_ids.shape
    out = torch.zeros_like(x)
    if t == 0:
        return out
    e = w13.shape[0]
    flat = topk_ids.reshape(-1).long()
    flat = torch.where(flat < 0, e, flat)  # other ranks' experts sort last and are never computed
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=e + 1)[:e].tolist()
    token_of = order // k
    weight_of = topk_weights.reshape(-1)[order].to(x.dtype)
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        rows = token_of[start : start + n]
        gate, up = linear(x[rows], w13[expert], s13[expert], block13, x.dtype).chunk(2, dim=-1)
        y = linear(F.silu(gate) * up, w2[expert], s2[expert], block2, x.dtype) * weight_of[start : start + n, None]
        out.index_add_(0, rows, y)
        start += n
    return out


def w8a8_linear(x: torch.Tensor, w_q: torch.Tensor, w_s: torch.Tensor, block: tuple[int, int],
                out_dtype: torch.dtype) -> torch.Tensor:
    """x (M, K) -> x W^T: x quantized per token and block[1] columns, then the block-FP8 GEMM."""
    from sgl_kernel.quantization import per_token_group_quant_fp8, w8a8_block_fp8_matmul

    q, s = per_token_group_quant_fp8(x.contiguous(), block[1])
    return w8a8_block_fp8_matmul(q, s, w_q, w_s, block, out_dtype=out_dtype)


def dequantized_linear(x: torch.Tensor, w_q: torch.Tensor, w_s: torch.Tensor, block: tuple[int, int],
                       out_dtype: torch.dtype) -> torch.Tensor:
    """The weights alone (activations unquantized): what the dequantized float model computes."""
    from sgl_kernel.quantization import dequantize_block_fp8

    return (x.float() @ dequantize_block_fp8(w_q, w_s, block).t()).to(out_dtype)
