"""Mixture-of-experts layers: the router (`topk`) and the fused experts (`fused_moe`; block-FP8: `fp8_moe`)."""

from sglang.srt.layers.moe.fp8_moe import Fp8FusedMoE, Fp8MoEMethod, build_experts, expert_params_mapping
from sglang.srt.layers.moe.fused_moe import FusedMoE, fused_experts
from sglang.srt.layers.moe.topk import select_experts

__all__ = ["Fp8FusedMoE", "Fp8MoEMethod", "FusedMoE", "build_experts", "expert_params_mapping", "fused_experts", "select_experts"]
