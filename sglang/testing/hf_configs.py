"""The Hugging Face files a preset is written as: config.json (text and vision sections, rope parameters),
generation_config.json and preprocessor_config.json, in the layout transformers 5 saves."""

from __future__ import annotations

from sglang.testing.presets import (
    BOS_TOKEN_ID,
    IM_END_TOKEN_ID,
    IMAGE_TOKEN_ID,
    PAD_TOKEN_ID,
    QWEN2_5_VL,
    QWEN3_VL,
    VIDEO_TOKEN_ID,
    VISION_END_TOKEN_ID,
    VISION_START_TOKEN_ID,
    ModelPreset,
    get_preset,
    resolve_dtype,
)

_PROCESSOR_CLASS = {QWEN3_VL: "Qwen3VLProcessor", QWEN2_5_VL: "Qwen2_5_VLProcessor"}


def _rope_parameters(preset: ModelPreset) -> dict:
    t = preset.text
    rp = {"mrope_section": list(t.mrope_section), "rope_theta": float(t.rope_theta), "rope_type": "default"}
    if preset.is_qwen3:
        rp["mrope_interleaved"] = bool(t.mrope_interleaved)
    return dict(sorted(rp.items()))


def build_text_config(preset: ModelPreset, dtype: str) -> dict:
    t = preset.text
    if sum(t.mrope_section) * 2 != t.head_dim:
        raise ValueError(f"{preset.name}: mrope_section {t.mrope_section} must sum to head_dim/2")
    cfg: dict = {
        "attention_dropout": 0.0,
        "dtype": dtype,
        "hidden_act": t.hidden_act,
        "hidden_size": t.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": t.intermediate_size,
        "max_position_embeddings": t.max_position_embeddings,
        "num_attention_heads": t.num_attention_heads,
        "num_hidden_layers": t.num_hidden_layers,
        "num_key_value_heads": t.num_key_value_heads,
        "pad_token_id": None,
        "rms_norm_eps": t.rms_norm_eps,
        "rope_parameters": _rope_parameters(preset),
        "use_cache": True,
        "vocab_size": t.vocab_size,
    }
    if preset.is_qwen3:
        cfg.update(
            model_type="qwen3_vl_text",
            attention_bias=False,
            head_dim=t.head_dim,
        )
    else:
        cfg.update(
            model_type="qwen2_5_vl_text",
            bos_token_id=BOS_TOKEN_ID,
            eos_token_id=IM_END_TOKEN_ID,
            layer_types=["full_attention"] * t.num_hidden_layers,
            max_window_layers=t.num_hidden_layers,
            sliding_window=None,
            use_sliding_window=False,
        )
    if t.moe is not None:
        m = t.moe
        cfg.update(
            model_type="qwen3_vl_moe_text",
            decoder_sparse_step=m.decoder_sparse_step,
            mlp_only_layers=list(m.mlp_only_layers),
            moe_intermediate_size=m.moe_intermediate_size,
            norm_topk_prob=m.norm_topk_prob,
            num_experts=m.num_experts,
            num_experts_per_tok=m.num_experts_per_tok,
        )
    return dict(sorted(cfg.items()))


def build_vision_config(preset: ModelPreset) -> dict:
    v = preset.vision
    cfg: dict = {
        "depth": v.depth,
        "hidden_act": v.hidden_act,
        "hidden_size": v.hidden_size,
        "in_channels": v.in_channels,
        "initializer_range": 0.02,
        "intermediate_size": v.intermediate_size,
        "num_heads": v.num_heads,
        "out_hidden_size": v.out_hidden_size,
        "patch_size": v.patch_size,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"},
        "spatial_merge_size": v.spatial_merge_size,
        "temporal_patch_size": v.temporal_patch_size,
    }
    if preset.is_qwen3:
        cfg.update(
            model_type="qwen3_vl_moe_vision" if preset.text.moe is not None else "qwen3_vl_vision",
            deepstack_visual_indexes=list(v.deepstack_visual_indexes),
            num_position_embeddings=v.num_position_embeddings,
        )
    else:
        cfg.update(
            model_type="qwen2_5_vl_vision",
            fullatt_block_indexes=list(v.fullatt_block_indexes),
            tokens_per_second=v.tokens_per_second,
            window_size=v.window_size,
        )
    return dict(sorted(cfg.items()))


def build_config_dict(preset: str | ModelPreset, dtype: str | None = None) -> dict:
    """The ``config.json`` dict, in the layout transformers 5.x writes."""
    p = get_preset(preset)
    d = resolve_dtype(p, dtype)
    cfg = {
        "architectures": [p.architecture],
        "dtype": d,
        "torch_dtype": d,  # older readers
        "image_token_id": IMAGE_TOKEN_ID,
        "model_type": p.model_type,
        "text_config": build_text_config(p, d),
        "tie_word_embeddings": bool(p.tie_word_embeddings),
        "video_token_id": VIDEO_TOKEN_ID,
        "vision_config": build_vision_config(p),
        "vision_end_token_id": VISION_END_TOKEN_ID,
        "vision_start_token_id": VISION_START_TOKEN_ID,
    }
    return dict(sorted(cfg.items()))


def build_generation_config(preset: str | ModelPreset) -> dict:
    get_preset(preset)
    return {
        "bos_token_id": BOS_TOKEN_ID,
        "do_sample": False,
        "eos_token_id": [IM_END_TOKEN_ID, BOS_TOKEN_ID],
        "pad_token_id": PAD_TOKEN_ID,
    }


def build_preprocessor_config(preset: str | ModelPreset) -> dict:
    p = get_preset(preset)
    v = p.vision
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": list(p.image_mean),
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": list(p.image_std),
        "max_pixels": p.max_pixels,  # same limits, in the older top-level spelling
        "merge_size": v.spatial_merge_size,
        "min_pixels": p.min_pixels,
        "patch_size": v.patch_size,
        "processor_class": _PROCESSOR_CLASS[p.family],
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": p.max_pixels, "shortest_edge": p.min_pixels},
        "temporal_patch_size": v.temporal_patch_size,
    }
