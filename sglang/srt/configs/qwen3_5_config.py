"""Qwen3.5's hybrid text decoder, read from the `text_config` of its `config.json` (model_type `qwen3_5`,
and `qwen3_5_moe` for the sparse variant, whose decoder layers are the same apart from the MLP).

Three of every four layers (`full_attention_interval` 4 in the releases) are Gated DeltaNet linear
attention; the others are full attention with an output gate and rotary on only the first
`partial_rotary_factor` of each head. This module holds what the generic `TextConfig` does not: the
layer kinds, the DeltaNet geometry and the rotary width. It imports nothing of the config reader
(model_config.py calls it), so the two never form an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QWEN3_5_ARCH = "Qwen3_5ForConditionalGeneration"
QWEN3_5_MODEL_TYPE = "qwen3_5"
# the sparse variant (Qwen3.5-35B-A3B, Qwen3.6-35B-A3B): the same hybrid decoder with MoE MLPs
QWEN3_5_MOE_ARCH = "Qwen3_5MoeForConditionalGeneration"
QWEN3_5_MOE_MODEL_TYPE = "qwen3_5_moe"
HYBRID_MODEL_TYPES = (QWEN3_5_MODEL_TYPE, QWEN3_5_MOE_MODEL_TYPE)
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
# transformers' Qwen3_5TextConfig defaults, applied when a config leaves the field out
DEFAULT_FULL_ATTENTION_INTERVAL = 4
DEFAULT_PARTIAL_ROTARY_FACTOR = 0.25


@dataclass(frozen=True)
class HybridAttentionConfig:
    """Per-layer token mixers and the Gated DeltaNet shape (totals over all TP ranks)."""

    layer_types: tuple[str, ...]  # LINEAR_ATTENTION or FULL_ATTENTION, one per decoder layer
    linear_num_key_heads: int  # query/key heads of the DeltaNet
    linear_num_value_heads: int  # value heads; a multiple of the key heads (each key head serves a group)
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int  # causal depthwise conv over q, k and v channels
    rotary_dim: int  # rotated leading dims of each full-attention head (head_dim * partial_rotary_factor)
    ssm_state_dtype: str = "float32"  # `mamba_ssm_dtype`: what the recurrent state is kept in

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the conv: [q | k | v]."""
        return 2 * self.key_dim + self.value_dim


def layer_types_of(cfg: dict[str, Any]) -> tuple[str, ...]:
    """`layer_types` as written, else every `full_attention_interval`-th layer full attention (as
    transformers derives it)."""
    n = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if types is None:
        every = int(cfg.get("full_attention_interval") or DEFAULT_FULL_ATTENTION_INTERVAL)
        types = [FULL_ATTENTION if (i + 1) % every == 0 else LINEAR_ATTENTION for i in range(n)]
    types = tuple(types)
    if len(types) != n:
        raise ValueError(f"layer_types has {len(types)} entries for {n} layers")
    unknown = sorted(set(types) - {LINEAR_ATTENTION, FULL_ATTENTION})
    if unknown:
        raise ValueError(f"unsupported layer types {unknown}; known: {LINEAR_ATTENTION}, {FULL_ATTENTION}")
    return types


def parse_hybrid_attention(cfg: dict[str, Any], rope: dict[str, Any], head_dim: int) -> HybridAttentionConfig:
    """`cfg`: the text config dict; `rope`: its merged rope parameters (rope_parameters over the legacy
    rope_scaling). transformers reads partial_rotary_factor from rope_parameters, where it moves a
    top-level value; both spellings are accepted here, rope_parameters first."""
    factor = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", DEFAULT_PARTIAL_ROTARY_FACTOR))
    rotary_dim = int(head_dim * float(factor))
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"partial_rotary_factor {factor} of head_dim {head_dim} gives rotary dim {rotary_dim}")
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    if hv % hk:
        raise ValueError(f"linear_num_value_heads {hv} is not a multiple of linear_num_key_heads {hk}")
    return HybridAttentionConfig(
        layer_types=layer_types_of(cfg),
        linear_num_key_heads=hk,
        linear_num_value_heads=hv,
        linear_key_head_dim=cfg["linear_key_head_dim"],
        linear_value_head_dim=cfg["linear_value_head_dim"],
        linear_conv_kernel_dim=cfg.get("linear_conv_kernel_dim", 4),
        rotary_dim=rotary_dim,
        ssm_state_dtype=str(cfg.get("mamba_ssm_dtype") or "float32"),
    )
