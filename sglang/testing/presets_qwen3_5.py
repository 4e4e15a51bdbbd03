"""Qwen3.5 presets (hybrid Gated DeltaNet / gated full-attention decoder on Qwen3-VL's vision tower without
deepstack; dense and MoE): kept in `QWEN3_5_PRESETS`, outside `PRESETS`, whose tests expect the Qwen3-VL /
Qwen2.5-VL token ids and transformers classes. Nothing here imports torch."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sglang.testing.preset_types import QWEN3_5, ModelPreset, SharedExpertMoEPreset, TextPreset
from sglang.testing.presets_qwen_vl import PRESETS, QWEN3_PIXELS, TINY_INIT, qwen3_vision

# Sources: Qwen/Qwen3.5-4B's config.json (transformers 5.7 print of it): token ids below, vocab 248320,
# eos 248044, layer_types linear x3 + full (full_attention_interval 4), head_dim 256 with
# partial_rotary_factor 0.25 and mrope_section [11, 11, 10] interleaved (sums to 64 / 2), rope_theta 1e7,
# linear_conv_kernel_dim 4, mamba_ssm_dtype float32, mtp_num_hidden_layers 1 (the `mtp.*` tensors), vision
# tower with deepstack_visual_indexes []. transformers 5.24's Qwen3_5Config defaults hold the same ids.
QWEN3_5_IMAGE_TOKEN_ID, QWEN3_5_VIDEO_TOKEN_ID = 248056, 248057
QWEN3_5_VISION_START_TOKEN_ID, QWEN3_5_VISION_END_TOKEN_ID = 248053, 248054
QWEN3_5_ENDOFTEXT_ID, QWEN3_5_IM_END_ID = 248044, 248046  # <|endoftext|> (config eos), <|im_end|> (chat end)
QWEN3_5_VOCAB_SIZE = 248320


@dataclass(frozen=True)
class LinearAttnPreset:
    """Gated DeltaNet geometry and the layer pattern of a hybrid decoder."""

    layer_types: tuple[str, ...]  # "linear_attention" / "full_attention", one per text layer
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4
    partial_rotary_factor: float = 0.25  # of the full-attention head_dim; mrope_section covers only this part
    mtp_layers: int = 1  # multi-token-prediction layers written as `mtp.*` (served models skip them)


@dataclass(frozen=True)
class HybridTextPreset(TextPreset):
    linear: LinearAttnPreset | None = None  # set for every Qwen3.5 preset (a default only for field order)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.linear.partial_rotary_factor)


QWEN3_5_PRESETS: dict[str, ModelPreset] = {
    "qwen3.5-tiny": ModelPreset(
        name="qwen3.5-tiny",
        family=QWEN3_5,
        vision=replace(PRESETS["qwen3-vl-tiny"].vision, depth=2, deepstack_visual_indexes=()),
        text=HybridTextPreset(
            hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2,
            head_dim=32,  # rotary dim 32 * 0.25 = 8: four frequencies, so t, h and w each drive one
            vocab_size=QWEN3_5_VOCAB_SIZE, rope_theta=10_000_000.0,
            mrope_section=(2, 1, 1),  # interleaved: frequencies t h w t
            mrope_interleaved=True, max_position_embeddings=4096,
            linear=LinearAttnPreset(("linear_attention",) * 3 + ("full_attention",), num_key_heads=2,
                                    num_value_heads=4, key_head_dim=16, value_head_dim=16),
        ),
        tie_word_embeddings=True, default_dtype="float32",
        image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5),
        min_pixels=4 * 32 * 32, max_pixels=512 * 512, init=TINY_INIT, tiny=True,
    ),
}


# Qwen3.5-MoE. Sources (searched public text; the Hub itself is out of reach here): config.json inventories
# of Qwen/Qwen3.5-35B-A3B and Qwen/Qwen3.6-35B-A3B (same architecture, same numbers) quoted by several
# independent loaders: architectures Qwen3_5MoeForConditionalGeneration, text model_type qwen3_5_moe_text,
# hidden 2048, 40 layers (linear x3 + full, full_attention_interval 4), 16 heads / 2 kv heads of head_dim
# 256, linear heads 16 key / 32 value of dim 128, num_experts 256, num_experts_per_tok 8,
# moe_intermediate_size 512, shared_expert_intermediate_size 512, no intermediate_size, no norm_topk_prob,
# mlp_only_layers [] (every layer sparse), mrope_section [11, 11, 10], rope_theta 1e7, vocab 248320,
# max_position_embeddings 262144, tie_word_embeddings false, mtp_num_hidden_layers 1; vision depth 27,
# hidden 1152, intermediate 4304, 16 heads, out_hidden 2048, 2304 positions, deepstack []. Expert tensors:
# fused `mlp.experts.gate_up_proj` [256, 1024, 2048] / `down_proj` [256, 2048, 512] in the decoder layers,
# one tensor per expert in the MTP layer. Pixel bounds: Qwen3-VL's (not confirmed for Qwen3.5).
_QWEN3_5_MOE_LAYERS = ("linear_attention",) * 3 + ("full_attention",)
QWEN3_5_PRESETS["qwen3.5-moe-tiny"] = replace(
    QWEN3_5_PRESETS["qwen3.5-tiny"], name="qwen3.5-moe-tiny",
    # every layer sparse (no dense intermediate); 2*48 != 64 and 48 != 64: no expert shape fits two layouts
    text=replace(QWEN3_5_PRESETS["qwen3.5-tiny"].text, intermediate_size=0,
                 moe=SharedExpertMoEPreset(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                                           shared_expert_intermediate_size=80)),
)
QWEN3_5_PRESETS["qwen3.5-35b-a3b"] = ModelPreset(
    name="qwen3.5-35b-a3b", family=QWEN3_5, vision=qwen3_vision(27, 1152, 4304, 2048, ()),
    text=HybridTextPreset(
        hidden_size=2048, intermediate_size=0, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
        head_dim=256, vocab_size=QWEN3_5_VOCAB_SIZE, rope_theta=10_000_000.0, mrope_section=(11, 11, 10),
        mrope_interleaved=True, max_position_embeddings=262144,
        moe=SharedExpertMoEPreset(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                                  shared_expert_intermediate_size=512),
        linear=LinearAttnPreset(_QWEN3_5_MOE_LAYERS * 10, num_key_heads=16, num_value_heads=32, key_head_dim=128,
                                value_head_dim=128),
    ),
    tie_word_embeddings=False, default_dtype="bfloat16", **QWEN3_PIXELS,
)

# Qwen3.5-4B (dense). Sources (searched public text): the Megatron model arguments of Qwen/Qwen3.5-4B in THUDM
# slime's scripts/models/qwen3.5-4B.sh (also copied in forks): 32 layers, hidden 2560, FFN 9216, 16 heads /
# 4 query groups of kv-channels 256, rotary-percent 0.25, rotary base 1e7, vocab 248320, gated attention
# output, zero-centred RMSNorm ("layernorm-1p"), tied embeddings (the 27B script unties them, this one does
# not). The DeltaNet geometry (16 key / 32 value heads of 128, conv kernel 4, full attention every 4th layer)
# and the vision tower (Qwen3-VL-8B's: 27 x 1152, out_hidden = the text hidden size) are the family's, as
# issue 49 states them and the 35B-A3B config shows; mrope_section [11, 11, 10] covers the 64 rotary dims.
QWEN3_5_PRESETS["qwen3.5-4b"] = ModelPreset(
    name="qwen3.5-4b", family=QWEN3_5, vision=qwen3_vision(27, 1152, 4304, 2560, ()),
    text=HybridTextPreset(
        hidden_size=2560, intermediate_size=9216, num_hidden_layers=32, num_attention_heads=16,
        num_key_value_heads=4, head_dim=256, vocab_size=QWEN3_5_VOCAB_SIZE, rope_theta=10_000_000.0,
        mrope_section=(11, 11, 10), mrope_interleaved=True, max_position_embeddings=262144,
        linear=LinearAttnPreset(_QWEN3_5_MOE_LAYERS * 8, num_key_heads=16, num_value_heads=32, key_head_dim=128,
                                value_head_dim=128),
    ),
    tie_word_embeddings=True, default_dtype="bfloat16", **QWEN3_PIXELS,
)
