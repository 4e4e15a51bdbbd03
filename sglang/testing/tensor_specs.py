"""Every tensor of a preset's checkpoint, in file order: Hub names, shapes and init kinds (weight_gen.py
draws their values). The fused Qwen3-VL-MoE expert layout is the released one."""

from __future__ import annotations

from sglang.testing.presets import ModelPreset, get_preset
from sglang.testing.weight_gen import BIAS, EMBED, NORM, VOCAB, WEIGHT, TensorSpec


def _linear(prefix: str, out_f: int, in_f: int, bias: bool) -> list[TensorSpec]:
    specs = [TensorSpec(f"{prefix}.weight", (out_f, in_f), WEIGHT)]
    if bias:
        specs.append(TensorSpec(f"{prefix}.bias", (out_f,), BIAS))
    return specs


def _norm(prefix: str, dim: int, bias: bool) -> list[TensorSpec]:
    specs = [TensorSpec(f"{prefix}.weight", (dim,), NORM)]
    if bias:
        specs.append(TensorSpec(f"{prefix}.bias", (dim,), BIAS))
    return specs


def _qwen3_vision_specs(p: ModelPreset) -> list[TensorSpec]:
    v = p.vision
    h, m = v.hidden_size, v.spatial_merge_size
    merged = h * m * m
    pre = "model.visual"
    specs = [
        TensorSpec(
            f"{pre}.patch_embed.proj.weight",
            (h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size),
            WEIGHT,
        ),
        TensorSpec(f"{pre}.patch_embed.proj.bias", (h,), BIAS),
        TensorSpec(f"{pre}.pos_embed.weight", (v.num_position_embeddings, h), EMBED),
    ]
    for i in range(v.depth):
        b = f"{pre}.blocks.{i}"
        specs += _norm(f"{b}.norm1", h, True)
        specs += _norm(f"{b}.norm2", h, True)
        specs += _linear(f"{b}.attn.qkv", 3 * h, h, True)
        specs += _linear(f"{b}.attn.proj", h, h, True)
        specs += _linear(f"{b}.mlp.linear_fc1", v.intermediate_size, h, True)
        specs += _linear(f"{b}.mlp.linear_fc2", h, v.intermediate_size, True)
    specs += _norm(f"{pre}.merger.norm", h, True)  # pre-shuffle norm over the vision hidden size
    specs += _linear(f"{pre}.merger.linear_fc1", merged, merged, True)
    specs += _linear(f"{pre}.merger.linear_fc2", v.out_hidden_size, merged, True)
    for k in range(len(v.deepstack_visual_indexes)):
        d = f"{pre}.deepstack_merger_list.{k}"
        specs += _norm(f"{d}.norm", merged, True)  # post-shuffle norm over hidden * merge^2
        specs += _linear(f"{d}.linear_fc1", merged, merged, True)
        specs += _linear(f"{d}.linear_fc2", v.out_hidden_size, merged, True)
    return specs


def _qwen25_vision_specs(p: ModelPreset) -> list[TensorSpec]:
    v = p.vision
    h, m = v.hidden_size, v.spatial_merge_size
    merged = h * m * m
    pre = "visual"
    specs = [
        TensorSpec(
            f"{pre}.patch_embed.proj.weight",
            (h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size),
            WEIGHT,
        )
    ]
    for i in range(v.depth):
        b = f"{pre}.blocks.{i}"
        specs += _norm(f"{b}.norm1", h, False)  # RMSNorm
        specs += _norm(f"{b}.norm2", h, False)
        specs += _linear(f"{b}.attn.qkv", 3 * h, h, True)
        specs += _linear(f"{b}.attn.proj", h, h, True)
        specs += _linear(f"{b}.mlp.gate_proj", v.intermediate_size, h, True)
        specs += _linear(f"{b}.mlp.up_proj", v.intermediate_size, h, True)
        specs += _linear(f"{b}.mlp.down_proj", h, v.intermediate_size, True)
    specs += _norm(f"{pre}.merger.ln_q", h, False)
    specs += _linear(f"{pre}.merger.mlp.0", merged, merged, True)
    specs += _linear(f"{pre}.merger.mlp.2", v.out_hidden_size, merged, True)
    return specs


def _text_specs(p: ModelPreset) -> list[TensorSpec]:
    t = p.text
    qwen3 = p.is_qwen3
    pre = "model.language_model" if qwen3 else "model"
    h, hd = t.hidden_size, t.head_dim
    q_out, kv_out = t.num_attention_heads * hd, t.num_key_value_heads * hd
    qkv_bias = not qwen3
    specs = [TensorSpec(f"{pre}.embed_tokens.weight", (t.vocab_size, h), VOCAB)]
    for i in range(t.num_hidden_layers):
        b = f"{pre}.layers.{i}"
        specs += _linear(f"{b}.self_attn.q_proj", q_out, h, qkv_bias)
        specs += _linear(f"{b}.self_attn.k_proj", kv_out, h, qkv_bias)
        specs += _linear(f"{b}.self_attn.v_proj", kv_out, h, qkv_bias)
        specs += _linear(f"{b}.self_attn.o_proj", h, q_out, False)
        if qwen3:
            specs += _norm(f"{b}.self_attn.q_norm", hd, False)
            specs += _norm(f"{b}.self_attn.k_norm", hd, False)
        if t.moe is not None and t.moe.is_sparse_layer(i):
            # Qwen3-VL-MoE's released layout: fused experts, [E, in, out] (transformers transposes on load)
            e, inter = t.moe.num_experts, t.moe.moe_intermediate_size
            specs.append(TensorSpec(f"{b}.mlp.gate.weight", (e, h), WEIGHT))
            specs.append(TensorSpec(f"{b}.mlp.experts.gate_up_proj", (e, h, 2 * inter), WEIGHT))
            specs.append(TensorSpec(f"{b}.mlp.experts.down_proj", (e, inter, h), WEIGHT))
        else:
            specs += _linear(f"{b}.mlp.gate_proj", t.intermediate_size, h, False)
            specs += _linear(f"{b}.mlp.up_proj", t.intermediate_size, h, False)
            specs += _linear(f"{b}.mlp.down_proj", h, t.intermediate_size, False)
        specs += _norm(f"{b}.input_layernorm", h, False)
        specs += _norm(f"{b}.post_attention_layernorm", h, False)
    specs += _norm(f"{pre}.norm", h, False)
    if not p.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", (t.vocab_size, h), VOCAB))
    return specs


def tensor_specs(preset: str | ModelPreset) -> list[TensorSpec]:
    """All checkpoint tensors (Hub names, shapes, init kinds), in file order."""
    p = get_preset(preset)
    vision = _qwen3_vision_specs(p) if p.is_qwen3 else _qwen25_vision_specs(p)
    return vision + _text_specs(p)


def count_parameters(preset: str | ModelPreset, part: str = "all") -> int:
    """Parameter count (tied lm_head counted once). ``part``: "all", "vision" or "text"."""
    specs = tensor_specs(preset)
    if part == "vision":
        specs = [s for s in specs if "visual." in s.name]
    elif part == "text":
        specs = [s for s in specs if "visual." not in s.name]
    elif part != "all":
        raise ValueError(part)
    return sum(s.numel for s in specs)
