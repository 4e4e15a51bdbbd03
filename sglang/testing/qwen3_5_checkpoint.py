"""What a Qwen3.5 preset is written as: config.json, generation_config.json, preprocessor_config.json and
every checkpoint tensor (Hub names and shapes, the `model.language_model.*` / `model.visual.*` layout of
the releases, plus their `mtp.*` multi-token-prediction block). make_model dispatches here for the
``qwen3_5`` family; the Qwen3-VL / Qwen2.5-VL files stay in hf_configs.py and tensor_specs.py.

A preset with ``text.moe`` set is Qwen3.5-MoE (model_type ``qwen3_5_moe``): every decoder layer's MLP is a
router (``mlp.gate``), routed experts and a shared expert with its sigmoid gate. The decoder layers' experts
are written fused as the releases store them (``mlp.experts.gate_up_proj`` [E, 2I, H], gate rows then up;
``mlp.experts.down_proj`` [E, H, I]: transformers' own parameter layout), the MTP layer's one tensor per
expert (``mtp.layers.0.mlp.experts.{e}.gate_proj.weight``, as the releases do).

Init kinds: the zero-centred RMSNorms (decoder, final, q/k and MTP norms: transformers scales by
``1 + weight``) are drawn as BIAS, small values around 0; the DeltaNet's gated norm scales by ``weight``
and is drawn as NORM (around 1); ``dt_bias`` as DECAY_BIAS (around -4: long-lived states); ``A_log``
as WEIGHT (the decay rate is
``exp(A_log)``, any real value is valid).
"""

from __future__ import annotations

from sglang.testing.presets import (
    QWEN3_5_ENDOFTEXT_ID,
    QWEN3_5_IM_END_ID,
    QWEN3_5_IMAGE_TOKEN_ID,
    QWEN3_5_VIDEO_TOKEN_ID,
    QWEN3_5_VISION_END_TOKEN_ID,
    QWEN3_5_VISION_START_TOKEN_ID,
    ModelPreset,
    get_preset,
    resolve_dtype,
)
from sglang.testing.weight_gen import BIAS, DECAY_BIAS, EMBED, NORM, VOCAB, WEIGHT, TensorSpec

ZERO_CENTRED_NORM = BIAS  # see the module docstring


def _linear(name: str, out_f: int, in_f: int, bias: bool = False) -> list[TensorSpec]:
    specs = [TensorSpec(f"{name}.weight", (out_f, in_f), WEIGHT)]
    return specs + ([TensorSpec(f"{name}.bias", (out_f,), BIAS)] if bias else [])


def _layernorm(name: str, dim: int) -> list[TensorSpec]:
    return [TensorSpec(f"{name}.weight", (dim,), NORM), TensorSpec(f"{name}.bias", (dim,), BIAS)]


def _vision_specs(p: ModelPreset) -> list[TensorSpec]:
    v = p.vision
    h, merged, pre = v.hidden_size, v.hidden_size * v.spatial_merge_size**2, "model.visual"
    specs = [
        TensorSpec(f"{pre}.patch_embed.proj.weight", (h, v.in_channels, v.temporal_patch_size, v.patch_size,
                                                      v.patch_size), WEIGHT),
        TensorSpec(f"{pre}.patch_embed.proj.bias", (h,), BIAS),
        TensorSpec(f"{pre}.pos_embed.weight", (v.num_position_embeddings, h), EMBED),
    ]
    for i in range(v.depth):
        b = f"{pre}.blocks.{i}"
        specs += _layernorm(f"{b}.norm1", h) + _layernorm(f"{b}.norm2", h)
        specs += _linear(f"{b}.attn.qkv", 3 * h, h, True) + _linear(f"{b}.attn.proj", h, h, True)
        specs += _linear(f"{b}.mlp.linear_fc1", v.intermediate_size, h, True)
        specs += _linear(f"{b}.mlp.linear_fc2", h, v.intermediate_size, True)
    specs += _layernorm(f"{pre}.merger.norm", h)  # pre-shuffle: over the vision hidden size
    specs += _linear(f"{pre}.merger.linear_fc1", merged, merged, True)
    specs += _linear(f"{pre}.merger.linear_fc2", v.out_hidden_size, merged, True)
    return specs


def _full_attention_specs(p: ModelPreset, b: str) -> list[TensorSpec]:
    """q_proj holds [query | gate] per head (2 * head_dim rows each): the output gate."""
    t = p.text
    h, hd = t.hidden_size, t.head_dim
    return (_linear(f"{b}.self_attn.q_proj", 2 * t.num_attention_heads * hd, h)
            + _linear(f"{b}.self_attn.k_proj", t.num_key_value_heads * hd, h)
            + _linear(f"{b}.self_attn.v_proj", t.num_key_value_heads * hd, h)
            + _linear(f"{b}.self_attn.o_proj", h, t.num_attention_heads * hd)
            + [TensorSpec(f"{b}.self_attn.q_norm.weight", (hd,), ZERO_CENTRED_NORM),
               TensorSpec(f"{b}.self_attn.k_norm.weight", (hd,), ZERO_CENTRED_NORM)])


def _linear_attention_specs(p: ModelPreset, b: str) -> list[TensorSpec]:
    t, la = p.text, p.text.linear
    key_dim, value_dim = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
    conv_dim = 2 * key_dim + value_dim
    a = f"{b}.linear_attn"
    return (_linear(f"{a}.in_proj_qkv", conv_dim, t.hidden_size)
            + _linear(f"{a}.in_proj_z", value_dim, t.hidden_size)
            + _linear(f"{a}.in_proj_b", la.num_value_heads, t.hidden_size)
            + _linear(f"{a}.in_proj_a", la.num_value_heads, t.hidden_size)
            + [TensorSpec(f"{a}.conv1d.weight", (conv_dim, 1, la.conv_kernel), WEIGHT),
               TensorSpec(f"{a}.dt_bias", (la.num_value_heads,), DECAY_BIAS),
               TensorSpec(f"{a}.A_log", (la.num_value_heads,), WEIGHT),
               TensorSpec(f"{a}.norm.weight", (la.value_head_dim,), NORM)]
            + _linear(f"{a}.out_proj", t.hidden_size, value_dim))


def _gated_mlp(name: str, inter: int, h: int) -> list[TensorSpec]:
    return (_linear(f"{name}.gate_proj", inter, h) + _linear(f"{name}.up_proj", inter, h)
            + _linear(f"{name}.down_proj", h, inter))


def _sparse_mlp(p: ModelPreset, b: str, fused: bool) -> list[TensorSpec]:
    """Router, experts (fused, or one linear per expert), shared expert and its one-logit gate."""
    h, m = p.text.hidden_size, p.text.moe
    e, i = m.num_experts, m.moe_intermediate_size
    specs = _linear(f"{b}.mlp.gate", e, h)
    if fused:
        specs += [TensorSpec(f"{b}.mlp.experts.gate_up_proj", (e, 2 * i, h), WEIGHT),
                  TensorSpec(f"{b}.mlp.experts.down_proj", (e, h, i), WEIGHT)]
    else:
        specs += [s for x in range(e) for s in _gated_mlp(f"{b}.mlp.experts.{x}", i, h)]
    return (specs + _gated_mlp(f"{b}.mlp.shared_expert", m.shared_expert_intermediate_size, h)
            + _linear(f"{b}.mlp.shared_expert_gate", 1, h))


def _mlp_and_norms(p: ModelPreset, b: str, fused_experts: bool = True) -> list[TensorSpec]:
    t = p.text
    h = t.hidden_size
    mlp = _gated_mlp(f"{b}.mlp", t.intermediate_size, h) if t.moe is None else _sparse_mlp(p, b, fused_experts)
    return (mlp
            + [TensorSpec(f"{b}.input_layernorm.weight", (h,), ZERO_CENTRED_NORM),
               TensorSpec(f"{b}.post_attention_layernorm.weight", (h,), ZERO_CENTRED_NORM)])


def _text_specs(p: ModelPreset) -> list[TensorSpec]:
    t, pre = p.text, "model.language_model"
    h = t.hidden_size
    specs = [TensorSpec(f"{pre}.embed_tokens.weight", (t.vocab_size, h), VOCAB)]
    for i, kind in enumerate(t.linear.layer_types):
        b = f"{pre}.layers.{i}"
        mixer = _linear_attention_specs(p, b) if kind == "linear_attention" else _full_attention_specs(p, b)
        specs += mixer + _mlp_and_norms(p, b)
    specs.append(TensorSpec(f"{pre}.norm.weight", (h,), ZERO_CENTRED_NORM))
    if not p.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", (t.vocab_size, h), VOCAB))
    # MTP (the releases' speculative head): a fusion of the embedding and the last hidden state, then
    # full-attention layers; served without speculation, these are skipped when loading
    specs += [TensorSpec("mtp.fc.weight", (h, 2 * h), WEIGHT)]
    for n in ("mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden", "mtp.norm"):
        specs.append(TensorSpec(f"{n}.weight", (h,), ZERO_CENTRED_NORM))
    for i in range(t.linear.mtp_layers):
        specs += _full_attention_specs(p, f"mtp.layers.{i}") + _mlp_and_norms(p, f"mtp.layers.{i}", fused_experts=False)
    return specs


def tensor_specs(preset: str | ModelPreset) -> list[TensorSpec]:
    p = get_preset(preset)
    return _vision_specs(p) + _text_specs(p)


def build_text_config(p: ModelPreset, dtype: str) -> dict:
    t, la = p.text, p.text.linear
    if sum(t.mrope_section) * 2 != t.rotary_dim:
        raise ValueError(f"{p.name}: mrope_section {t.mrope_section} must sum to rotary dim / 2 = {t.rotary_dim // 2}")
    rope = {"mrope_interleaved": bool(t.mrope_interleaved), "mrope_section": list(t.mrope_section),
            "partial_rotary_factor": la.partial_rotary_factor, "rope_theta": float(t.rope_theta),
            "rope_type": "default"}
    every = la.layer_types.index("full_attention") + 1 if "full_attention" in la.layer_types else len(la.layer_types)
    cfg = {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": None,
        "dtype": dtype, "eos_token_id": QWEN3_5_ENDOFTEXT_ID, "full_attention_interval": every,
        "head_dim": t.head_dim, "hidden_act": t.hidden_act, "hidden_size": t.hidden_size, "initializer_range": 0.02,
        "intermediate_size": t.intermediate_size, "layer_types": list(la.layer_types),
        "linear_conv_kernel_dim": la.conv_kernel, "linear_key_head_dim": la.key_head_dim,
        "linear_num_key_heads": la.num_key_heads, "linear_num_value_heads": la.num_value_heads,
        "linear_value_head_dim": la.value_head_dim, "mamba_ssm_dtype": "float32",
        "max_position_embeddings": t.max_position_embeddings, "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": la.mtp_layers, "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": t.num_attention_heads, "num_hidden_layers": t.num_hidden_layers,
        "num_key_value_heads": t.num_key_value_heads, "pad_token_id": None,
        "partial_rotary_factor": la.partial_rotary_factor, "rms_norm_eps": t.rms_norm_eps, "rope_parameters": rope,
        "tie_word_embeddings": bool(p.tie_word_embeddings), "use_cache": True, "vocab_size": t.vocab_size,
    }
    if t.moe is not None:  # Qwen3.5-MoE's text config has no dense intermediate_size
        del cfg["intermediate_size"]
        cfg.update(model_type="qwen3_5_moe_text", num_experts=t.moe.num_experts,
                   num_experts_per_tok=t.moe.num_experts_per_tok, moe_intermediate_size=t.moe.moe_intermediate_size,
                   shared_expert_intermediate_size=t.moe.shared_expert_intermediate_size,
                   output_router_logits=False, router_aux_loss_coef=0.001)
    return dict(sorted(cfg.items()))


def build_vision_config(p: ModelPreset) -> dict:
    v = p.vision
    cfg = {
        "deepstack_visual_indexes": [], "depth": v.depth, "hidden_act": v.hidden_act, "hidden_size": v.hidden_size,
        "in_channels": v.in_channels, "initializer_range": 0.02, "intermediate_size": v.intermediate_size,
        "model_type": f"{p.model_type}_vision",  # qwen3_5_vision / qwen3_5_moe_vision
        "num_heads": v.num_heads, "num_position_embeddings": v.num_position_embeddings,
        "out_hidden_size": v.out_hidden_size, "patch_size": v.patch_size, "spatial_merge_size": v.spatial_merge_size,
        "temporal_patch_size": v.temporal_patch_size,
    }
    return dict(sorted(cfg.items()))


def build_config_dict(preset: str | ModelPreset, dtype: str | None = None) -> dict:
    p = get_preset(preset)
    d = resolve_dtype(p, dtype)
    cfg = {
        "architectures": [p.architecture], "dtype": d, "torch_dtype": d, "image_token_id": QWEN3_5_IMAGE_TOKEN_ID,
        "model_type": p.model_type, "text_config": build_text_config(p, d),
        "tie_word_embeddings": bool(p.tie_word_embeddings), "video_token_id": QWEN3_5_VIDEO_TOKEN_ID,
        "vision_config": build_vision_config(p), "vision_end_token_id": QWEN3_5_VISION_END_TOKEN_ID,
        "vision_start_token_id": QWEN3_5_VISION_START_TOKEN_ID,
    }
    return dict(sorted(cfg.items()))


def build_generation_config(preset: str | ModelPreset) -> dict:
    """Chat end first, then <|endoftext|> (as the Qwen3-VL generation configs order them)."""
    get_preset(preset)
    return {"bos_token_id": QWEN3_5_ENDOFTEXT_ID, "do_sample": False,
            "eos_token_id": [QWEN3_5_IM_END_ID, QWEN3_5_ENDOFTEXT_ID], "pad_token_id": QWEN3_5_ENDOFTEXT_ID}


def build_preprocessor_config(preset: str | ModelPreset) -> dict:
    p = get_preset(preset)
    v = p.vision
    return {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": list(p.image_mean), "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": list(p.image_std), "max_pixels": p.max_pixels, "merge_size": v.spatial_merge_size,
        "min_pixels": p.min_pixels, "patch_size": v.patch_size, "processor_class": "Qwen3VLProcessor",
        "resample": 3, "rescale_factor": 1 / 255, "size": {"longest_edge": p.max_pixels, "shortest_edge": p.min_pixels},
        "temporal_patch_size": v.temporal_patch_size,
    }
