"""Qwen2-family text decoder (the language model of Qwen2.5-VL), written for the runtime:
flattened tokens of a whole batch, positions passed in, attention through the batch's backend."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.configs.model_config import TextConfig
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.quantization import linear_method
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import MRotaryEmbedding, apply_rotary
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding


class Qwen2MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, tp: TPInfo = SINGLE_RANK, dtype=None,
                 quant=None, prefix: str = "mlp"):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=bias, tp=tp, dtype=dtype,
            quant=linear_method(quant, f"{prefix}.gate_up_proj", ("gate_proj", "up_proj")),
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias, tp=tp, dtype=dtype,
                                           quant=linear_method(quant, f"{prefix}.down_proj"))
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class Qwen2Attention(nn.Module):
    def __init__(self, config: TextConfig, layer_id: int, rotary: MRotaryEmbedding, tp: TPInfo = SINGLE_RANK, dtype=None,
                 quant=None, prefix: str = "self_attn"):
        super().__init__()
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            config.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=config.attention_bias,
            tp=tp,
            dtype=dtype,
            quant=linear_method(quant, f"{prefix}.qkv_proj", ("q_proj", "k_proj", "v_proj")),
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * config.head_dim, config.hidden_size, bias=False, tp=tp, dtype=dtype,
            quant=linear_method(quant, f"{prefix}.o_proj"),
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.attn = RadixAttention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor):
        return q, k

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], hidden_states: torch.Tensor, forward_batch) -> torch.Tensor:
        """rope: this step's (cos, sin), computed once for all layers."""
        t = hidden_states.shape[0]
        q, k, v = self.qkv_proj.split_qkv(self.qkv_proj(hidden_states))
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        q, k = self.qk_norm(q, k)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class Qwen2DecoderLayer(nn.Module):
    attention_cls = Qwen2Attention

    def __init__(self, config: TextConfig, layer_id: int, rotary: MRotaryEmbedding, tp: TPInfo = SINGLE_RANK, dtype=None,
                 quant=None, prefix: str = "model.layers.0"):
        super().__init__()
        self.self_attn = self.attention_cls(config, layer_id, rotary, tp, dtype, quant, f"{prefix}.self_attn")
        self.mlp = self.make_mlp(config, layer_id, tp, dtype, quant, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def make_mlp(self, config: TextConfig, layer_id: int, tp: TPInfo, dtype, quant, prefix: str) -> nn.Module:
        """The layer's feed-forward block (a MoE decoder overrides this for its sparse layers)."""
        return Qwen2MLP(config.hidden_size, config.intermediate_size, bias=False, tp=tp, dtype=dtype, quant=quant,
                        prefix=prefix)

    def forward(self, rope, hidden_states, residual, forward_batch):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(rope, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class Qwen2Model(nn.Module):
    layer_cls = Qwen2DecoderLayer

    def __init__(self, config: TextConfig, tp: TPInfo = SINGLE_RANK, dtype=None, quant=None):
        """`quant`: the text linears' quantization (layers/quantization), None for float weights."""
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp, dtype)
        # One rotary module shared by all layers (it holds only the inverse frequencies).
        rotary = MRotaryEmbedding(config.head_dim, config.rope_theta, config.mrope_section, config.mrope_interleaved)
        self.rotary_emb = rotary
        self.layers = nn.ModuleList(
            [self.layer_cls(config, i, rotary, tp, dtype, quant, f"model.layers.{i}") for i in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        forward_batch,
        input_embeds: torch.Tensor | None = None,
        deepstack_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        rope = self.rotary_emb.cos_sin(positions, hidden_states.dtype)
        residual = None
        num_deepstack = 0 if deepstack_embeds is None else deepstack_embeds.shape[-1] // self.config.hidden_size
        for i, layer in enumerate(self.layers):
            hidden_states, residual = layer(rope, hidden_states, residual, forward_batch)
            if i < num_deepstack:
                # Deepstack adds visual features to the layer's output stream; rows of text tokens are
                # zero, so adding them everywhere equals adding at image positions only.
                h = self.config.hidden_size
                hidden_states = hidden_states + residual
                residual = None
                hidden_states = hidden_states + deepstack_embeds[:, i * h : (i + 1) * h].to(hidden_states.dtype)
        if residual is None:
            return self.norm(hidden_states)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states
