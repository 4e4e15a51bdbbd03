"""Qwen3-family text decoder: Qwen2's layout plus per-head RMSNorm on q and k, no qkv bias."""

from __future__ import annotations

import torch

from sglang.srt.configs.model_config import TextConfig
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.rotary_embedding import MRotaryEmbedding
from sglang.srt.models.qwen2 import Qwen2Attention, Qwen2DecoderLayer, Qwen2Model


class Qwen3Attention(Qwen2Attention):
    def __init__(self, config: TextConfig, layer_id: int, rotary: MRotaryEmbedding, tp: TPInfo = SINGLE_RANK, dtype=None,
                 quant=None, prefix: str = "self_attn"):
        super().__init__(config, layer_id, rotary, tp, dtype, quant, prefix)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, dtype)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor):
        return self.q_norm(q), self.k_norm(k)


class Qwen3DecoderLayer(Qwen2DecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(Qwen2Model):
    layer_cls = Qwen3DecoderLayer
