"""Qwen3-VL-MoE (Qwen3-VL-30B-A3B, -235B-A22B): Qwen3-VL's vision tower and deepstack on a Qwen3 text
decoder whose MLPs are sparse: a softmax top-k router over fused experts (layers/moe). Layers listed
in mlp_only_layers, or off the decoder_sparse_step grid, keep a dense MLP. A -FP8 checkpoint's experts
(one e4m3 linear per expert with 128x128 block scales) load into layers/moe/fp8_moe.py `Fp8FusedMoE`;
`--quantization fp8` loads the float experts as usual (either fused layout, FusedMoE's placement) and then
quantizes each rank's local experts (`Fp8MoEMethod`, on the grid a -FP8 checkpoint loads to). The router
`mlp.gate` is never quantized."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig, MoEConfig, TextConfig
from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.moe import FusedMoE, build_experts, expert_params_mapping, select_experts
from sglang.srt.models.qwen3 import Qwen3DecoderLayer, Qwen3Model
from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration


class Qwen3MoeSparseMoeBlock(nn.Module):
    """`gate`: the router, replicated on every rank (checkpoint `mlp.gate.weight` [E, H]); `experts`: fused.
    `quant`: the model's Fp8Config or None; `prefix`: this block's module name (`model.layers.N.mlp`), which
    modules_to_not_convert is matched against."""

    def __init__(self, hidden_size: int, moe: MoEConfig, tp: TPInfo = SINGLE_RANK, dtype=None, quant=None,
                 prefix: str = "mlp"):
        super().__init__()
        self.top_k = moe.num_experts_per_tok
        self.renormalize = moe.norm_topk_prob
        self.gate = ReplicatedLinear(hidden_size, moe.num_experts, bias=False, dtype=dtype)
        self.experts = build_experts(FusedMoE, moe.num_experts, hidden_size, moe.moe_intermediate_size, tp, dtype, quant,
                                     f"{prefix}.experts")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(self.gate(x), self.top_k, self.renormalize)
        # transformers casts the routing weights to the activations' dtype before scaling
        return self.experts(x, weights.to(x.dtype), ids)


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def make_mlp(self, config: TextConfig, layer_id: int, tp: TPInfo, dtype, quant, prefix: str) -> nn.Module:
        if config.moe is not None and config.moe.is_sparse_layer(layer_id):
            return Qwen3MoeSparseMoeBlock(config.hidden_size, config.moe, tp, dtype, quant, prefix)
        return super().make_mlp(config, layer_id, tp, dtype, quant, prefix)


class Qwen3MoeModel(Qwen3Model):
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3VLMoeForConditionalGeneration(Qwen3VLForConditionalGeneration):
    text_model_cls = Qwen3MoeModel

    def __init__(self, config: ModelConfig, tp: TPInfo = SINGLE_RANK, dtype: torch.dtype | None = None,
                 vit: ViTStrategy = ViTStrategy(), quant=None):
        if config.text.moe is None:
            raise ValueError("Qwen3VLMoeForConditionalGeneration: text_config has no num_experts")
        super().__init__(config, tp, dtype, vit, quant)
        if quant is not None and quant.serialized:
            # -FP8 releases store each expert's linears apart: mapped first, before the dense gate/up rule
            self.stacked_params_mapping = expert_params_mapping(config.text.moe.num_experts) + self.stacked_params_mapping


EntryClass = Qwen3VLMoeForConditionalGeneration
