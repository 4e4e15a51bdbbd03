"""Mixture-of-experts layers: the router (`topk`) and the fused experts (`fused_moe`)."""

from sglang.srt.layers.moe.fused_moe import FusedMoE, fused_experts, fused_experts_torch
from sglang.srt.layers.moe.topk import select_experts, select_experts_torch

__all__ = ["FusedMoE", "fused_experts", "fused_experts_torch", "select_experts", "select_experts_torch"]
