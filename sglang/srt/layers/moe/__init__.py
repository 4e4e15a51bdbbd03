"""Mixture-of-experts layers: the router (`topk`) and the fused experts (`fused_moe`)."""

from sglang.srt.layers.moe.fused_moe import FusedMoE, fused_experts
from sglang.srt.layers.moe.topk import select_experts

__all__ = ["FusedMoE", "fused_experts", "select_experts"]
