"""Quantized GEMMs: block FP8 (e4m3 weights with one scale per 128x128 block, activations quantized per
token and 128-column group), the format of Qwen's -FP8 checkpoints."""

from sgl_kernel.quantization.fp8 import (
    FP8_E4M3_MAX,
    dequantize_block_fp8,
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_torch,
    quantize_weight_block_fp8,
    w8a8_block_fp8_matmul,
    w8a8_block_fp8_matmul_torch,
)

__all__ = [
    "FP8_E4M3_MAX",
    "dequantize_block_fp8",
    "per_token_group_quant_fp8",
    "per_token_group_quant_fp8_torch",
    "quantize_weight_block_fp8",
    "w8a8_block_fp8_matmul",
    "w8a8_block_fp8_matmul_torch",
]
