"""Qwen3-VL-MoE (Qwen3-VL-30B-A3B, -235B-A22B): Qwen3-VL's vision tower and deepstack on a Qwen3 text
decoder whose MLPs are sparse: a softmax top-k router over fused experts (layers/moe). Layers listed
in mlp_only_layers, or off the decoder_sparse_step grid, keep a dense MLP."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig, MoEConfig, TextConfig
from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.linear import ReplicatedLinear
from sglang.srt.layers.moe import FusedMoE, select_experts
from sglang.srt.models.qwen3 import Qwen3DecoderLayer, Qwen3Model
from sglang.srt.models.qwen3_vl import Qwen3VLForConditionalGeneration


class Qwen3MoeSparseMoeBlock(nn.Module):
    """`gate`: the router, replicated on every rank (checkpoint `mlp.gate.weight` [E, H]); `experts`: fused."""

    def __init__(self, hidden_size: int, moe: MoEConfig, tp: TPInfo = SINGLE_RANK, dtype=None):
        super().__init__()
        self.top_k = moe.num_experts_per_tok
        self.renormalize = moe.norm_topk_prob
        self.gate = ReplicatedLinear(hidden_size, moe.num_experts, bias=False, dtype=dtype)
        self.experts = FusedMoE(moe.num_experts, hidden_size, moe.moe_intermediate_size, tp, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = select_experts(self.gate(x), self.top_k, self.renormalize)
        # transformers casts the routing weights to the activations' dtype before scaling
        return self.experts(x, weights.to(x.dtype), ids)


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def make_mlp(self, config: TextConfig, layer_id: int, tp: TPInfo, dtype, quant, prefix: str) -> nn.Module:
        if config.moe is not None and config.moe.is_sparse_layer(layer_id):
            if quant is not None:
                from sglang.srt.layers.quantization.base import QuantizationError

                raise QuantizationError("quantized MoE experts are not supported yet (issue 38): serve the bf16 "
                                        "checkpoint of this Qwen3-VL-MoE model without --quantization")
            return Qwen3MoeSparseMoeBlock(config.hidden_size, config.moe, tp, dtype)
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


EntryClass = Qwen3VLMoeForConditionalGeneration
