"""Block-FP8 experts (the -FP8 Qwen3-VL-MoE releases): e4m3 weights with one float32 scale per block,
activations quantized per token and column group at run time, as the dense block-FP8 linears do
(sgl_kernel.quantization). CUDA tensors take the fused grouped Triton kernel (`_moe_triton`, USE_FP8:
each K tile's dot scaled by its activation and weight scales, upstream's w8a8 block MoE); elsewhere the
torch reference: one GEMM pair per expert that received tokens through `w8a8_block_fp8_matmul`.

Layouts: w13 [E, 2N, H] e4m3 with s13 [E, ceil(2N / b13[0]), ceil(H / b13[1])]; w2 [E, H, N] e4m3 with
s2 [E, ceil(H / b2[0]), ceil(N / b2[1])]. The gate_up activations are grouped by b13[1] columns, the
down activations by b2[1] (a TP shard of the intermediate dim may start inside a 128-column block, so
b2[1] can be a divisor of 128). Ids of -1: experts on other ranks, never computed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_kernel import pick_backend
from sgl_kernel.moe.fused_moe import expert_groups

# compiled, tl.dot on e4m3 tiles needs K >= 32: a 16-column scale group (a TP shard's grid) cannot be one K tile
FUSED_MIN_GROUP = 32


def fused_experts_fp8(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor, block13: tuple[int, int],
                      block2: tuple[int, int], linear=None, backend: str = "auto",
                      has_remote: bool = False) -> torch.Tensor:
    """sum_k w_k * down_e(silu(gate_e(x)) * up_e(x)) in x's dtype, each product a block-FP8 GEMM.
    `linear(x, w_q, w_s, block, out_dtype)` replaces the quantized GEMM of the torch path (a test passes
    the weights alone); has_remote: ids may be -1 (expert parallelism)."""
    use = pick_backend(backend, x)
    if backend == "auto" and min(block13[1], block2[1]) < FUSED_MIN_GROUP:
        use = "torch"  # per expert: the block-FP8 GEMM (Triton on CUDA) takes 16-column groups
    if linear is None and use == "triton":
        return fused_experts_fp8_triton(x, w13, s13, w2, s2, topk_weights, topk_ids, block13, block2,
                                        has_remote=has_remote)
    return fused_experts_fp8_torch(x, w13, s13, w2, s2, topk_weights, topk_ids, block13, block2, linear)


def fused_experts_fp8_torch(x, w13, s13, w2, s2, topk_weights, topk_ids, block13, block2, linear=None) -> torch.Tensor:
    linear = linear or w8a8_linear
    out = torch.zeros_like(x)
    for expert, rows, weights in expert_groups(topk_ids, topk_weights, w13.shape[0], x.dtype):
        gate, up = linear(x[rows], w13[expert], s13[expert], block13, x.dtype).chunk(2, dim=-1)
        y = linear(F.silu(gate) * up, w2[expert], s2[expert], block2, x.dtype) * weights
        out.index_add_(0, rows, y)
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


def fused_experts_fp8_triton(x, w13, s13, w2, s2, topk_weights, topk_ids, block13, block2, config: dict | None = None,
                             has_remote: bool = True) -> torch.Tensor:
    """The grouped Triton kernel with e4m3 operands: x quantized per token and block13[1] columns, the
    gate_up GEMM, silu * up in x's dtype, that quantized per row and block2[1] columns, the down GEMM."""
    from sgl_kernel.moe._moe_triton import moe_block_config, plan_fused_moe
    from sgl_kernel.moe.fused_moe import moe_align_block_size
    from sgl_kernel.quantization import per_token_group_quant_fp8

    t, k = topk_ids.shape
    e, two_n, h = w13.shape
    n = two_n // 2
    out = torch.zeros_like(x)
    if t == 0:
        return out
    if config is None and x.is_cuda:
        from sgl_kernel.moe.configs import device_name, dtype_str, pick_config

        # named by the checkpoint's block (upstream's block_shape): block2[0] (H rows) and block13[1] (H columns)
        config = pick_config(t, k, e, n, dtype_str(x.dtype, fp8_w8a8=True), device_name(), (block2[0], block13[1]))
    config = config or moe_block_config(t, k, e, on_cuda=x.is_cuda)
    sorted_ids, expert_ids, num_post = moe_align_block_size(topk_ids, config["BLOCK_M"], e)
    xq, xs = per_token_group_quant_fp8(x.contiguous(), block13[1])
    inter = torch.empty((t * k, n), dtype=x.dtype, device=x.device)
    plan_fused_moe(xq, w13.contiguous(), inter, None, sorted_ids, expert_ids, num_post, t * k, k, True, config,
                   xs, s13.contiguous(), block13).launch()
    iq, is_ = per_token_group_quant_fp8(inter, block2[1])
    down = (torch.zeros if has_remote else torch.empty)((t * k, h), dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).contiguous()
    plan_fused_moe(iq, w2.contiguous(), down, weights, sorted_ids, expert_ids, num_post, t * k, 1, False, config,
                   is_, s2.contiguous(), block2).launch()
    return down.view(t, k, h).sum(dim=1, dtype=torch.float32).to(x.dtype)
