"""Mixture-of-experts kernels: the softmax top-k router, `moe_align_block_size` (each expert's token rows
sorted together and padded to the GEMM's row tile) and the fused grouped expert GEMM (gate_up with
SiLU * mul, then down scaled by the routing weights, then the sum over each token's k experts).

Every op has a torch reference (`*_torch`), which is also the CPU path; `backend="auto"` takes Triton
for CUDA tensors. Block-FP8 experts: `fused_experts_fp8` (a GEMM pair per expert, sgl_kernel.moe.fp8).
Tuned tile configs per device: sgl_kernel.moe.configs."""

from sgl_kernel.moe.fp8 import fused_experts_fp8
from sgl_kernel.moe.fused_moe import (
    fused_experts,
    fused_experts_torch,
    moe_align_block_size,
    moe_align_block_size_reference,
    topk_softmax,
    topk_softmax_torch,
)

__all__ = [
    "fused_experts",
    "fused_experts_fp8",
    "fused_experts_torch",
    "moe_align_block_size",
    "moe_align_block_size_reference",
    "topk_softmax",
    "topk_softmax_torch",
]
