"""Model presets for the deterministic random-weight model generator.

Two families are covered, with the Hugging Face layout that transformers 5.x writes:

* ``qwen3_vl``  (``Qwen3VLForConditionalGeneration``; with ``TextPreset.moe`` set,
  ``Qwen3VLMoeForConditionalGeneration``, model_type ``qwen3_vl_moe``, experts in the released fused layout)
* ``qwen2_5_vl`` (``Qwen2_5_VLForConditionalGeneration``)
* ``qwen3_5`` (``Qwen3_5ForConditionalGeneration``: hybrid Gated DeltaNet / gated full attention text
  decoder, Qwen3-VL's vision tower without deepstack; with ``TextPreset.moe`` set,
  ``Qwen3_5MoeForConditionalGeneration``, model_type ``qwen3_5_moe``, with a shared expert); its presets
  live in ``QWEN3_5_PRESETS``, outside ``PRESETS``, whose tests expect the Qwen3-VL / Qwen2.5-VL token
  ids and transformers classes

Tiny presets (``qwen3-vl-tiny``, ``qwen2.5-vl-tiny``) are for fast CPU tests; the others are
shape-true replicas of the public checkpoints (random values, real shapes and configs).
Nothing here imports torch or transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sglang.testing.preset_types import (  # noqa: F401  (this module's names too)
    BOS_TOKEN_ID,
    CLIP_MEAN,
    CLIP_STD,
    DTYPES,
    IMAGE_TOKEN_ID,
    IM_END_TOKEN_ID,
    InitScheme,
    MoEPreset,
    ModelPreset,
    PAD_TOKEN_ID,
    QWEN2_5_VL,
    QWEN3_5,
    QWEN3_5_MOE,
    QWEN3_VL,
    QWEN3_VL_MOE,
    SharedExpertMoEPreset,
    TextPreset,
    VIDEO_TOKEN_ID,
    VISION_END_TOKEN_ID,
    VISION_START_TOKEN_ID,
    VisionPreset,
)


def _qwen3_vision(depth, hidden, inter, out_hidden, deepstack, num_pos=2304) -> VisionPreset:
    return VisionPreset(
        depth=depth,
        hidden_size=hidden,
        intermediate_size=inter,
        num_heads=16,
        out_hidden_size=out_hidden,
        hidden_act="gelu_pytorch_tanh",
        patch_size=16,
        num_position_embeddings=num_pos,
        deepstack_visual_indexes=tuple(deepstack),
    )


def _qwen3_text(hidden, inter, layers, heads, kv_heads, moe: MoEPreset | None = None) -> TextPreset:
    return TextPreset(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=128,
        vocab_size=151936,
        rope_theta=5_000_000.0,
        mrope_section=(24, 20, 20),
        mrope_interleaved=True,
        max_position_embeddings=262144,
        moe=moe,
    )


def _qwen25_vision(out_hidden) -> VisionPreset:
    return VisionPreset(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        out_hidden_size=out_hidden,
        hidden_act="silu",
        patch_size=14,
        window_size=112,
        fullatt_block_indexes=(7, 15, 23, 31),
        tokens_per_second=2,
    )


def _qwen25_text(hidden, inter, layers, heads, kv_heads, vocab) -> TextPreset:
    return TextPreset(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        vocab_size=vocab,
        rope_theta=1_000_000.0,
        mrope_section=(16, 24, 24),
        mrope_interleaved=False,
        max_position_embeddings=128000,
    )


_QWEN3_PIXELS = dict(image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5), min_pixels=65536, max_pixels=16777216)
_QWEN25_PIXELS = dict(image_mean=CLIP_MEAN, image_std=CLIP_STD, min_pixels=3136, max_pixels=12845056)

# Tiny models: larger init so the 64-wide model has non-degenerate, prompt-dependent logits.
_TINY_INIT = InitScheme(weight_std=0.3, embed_std=0.5, bias_std=0.05, norm_noise_std=0.1)

PRESETS: dict[str, ModelPreset] = {}


def _register(p: ModelPreset) -> ModelPreset:
    PRESETS[p.name] = p
    return p


_register(
    ModelPreset(
        name="qwen3-vl-tiny",
        family=QWEN3_VL,
        vision=VisionPreset(
            depth=3,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            hidden_act="gelu_pytorch_tanh",
            patch_size=16,
            num_position_embeddings=64,  # 8x8 learned grid
            deepstack_visual_indexes=(0, 1),
        ),
        text=TextPreset(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=151936,
            rope_theta=5_000_000.0,
            mrope_section=(4, 2, 2),
            mrope_interleaved=True,
            max_position_embeddings=4096,
        ),
        tie_word_embeddings=True,
        default_dtype="float32",
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
        min_pixels=4 * 32 * 32,  # a 64x64 image fits
        max_pixels=512 * 512,
        init=_TINY_INIT,
        tiny=True,
    )
)

_register(
    ModelPreset(
        name="qwen3-vl-moe-tiny",
        family=QWEN3_VL,
        vision=PRESETS["qwen3-vl-tiny"].vision,
        text=replace(
            PRESETS["qwen3-vl-tiny"].text,
            num_hidden_layers=4,
            # 2*48 != 64 and 48 != 64: the released and transformers' expert layouts differ in shape
            moe=MoEPreset(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48, mlp_only_layers=(2,)),
        ),
        tie_word_embeddings=True,
        default_dtype="float32",
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
        min_pixels=4 * 32 * 32,
        max_pixels=512 * 512,
        init=_TINY_INIT,
        tiny=True,
    )
)

_register(
    ModelPreset(
        name="qwen2.5-vl-tiny",
        family=QWEN2_5_VL,
        vision=VisionPreset(
            depth=4,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            hidden_act="silu",
            patch_size=14,
            window_size=112,
            fullatt_block_indexes=(1, 3),
            tokens_per_second=2,
        ),
        text=TextPreset(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=151936,
            rope_theta=1_000_000.0,
            mrope_section=(2, 3, 3),
            mrope_interleaved=False,
            max_position_embeddings=4096,
        ),
        tie_word_embeddings=True,
        default_dtype="float32",
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
        min_pixels=4 * 28 * 28,  # 3136: a 64x64 image fits
        max_pixels=512 * 512,
        init=_TINY_INIT,
        tiny=True,
    )
)

_register(
    ModelPreset(
        name="qwen3-vl-2b",
        family=QWEN3_VL,
        vision=_qwen3_vision(24, 1024, 4096, 2048, (5, 11, 17)),
        text=_qwen3_text(2048, 6144, 28, 16, 8),
        tie_word_embeddings=True,
        default_dtype="bfloat16",
        **_QWEN3_PIXELS,
    )
)
_register(
    ModelPreset(
        name="qwen3-vl-4b",
        family=QWEN3_VL,
        vision=_qwen3_vision(24, 1024, 4096, 2560, (5, 11, 17)),
        text=_qwen3_text(2560, 9728, 36, 32, 8),
        tie_word_embeddings=True,
        default_dtype="bfloat16",
        **_QWEN3_PIXELS,
    )
)
_register(
    ModelPreset(
        name="qwen3-vl-8b",
        family=QWEN3_VL,
        vision=_qwen3_vision(27, 1152, 4304, 4096, (8, 16, 24)),
        text=_qwen3_text(4096, 12288, 36, 32, 8),
        tie_word_embeddings=False,
        default_dtype="bfloat16",
        **_QWEN3_PIXELS,
    )
)
# Qwen3-VL-MoE: 128 experts, 8 active, the Qwen3-VL-8B vision tower (out_hidden = text hidden)
_register(
    ModelPreset(
        name="qwen3-vl-30b-a3b",
        family=QWEN3_VL,
        vision=_qwen3_vision(27, 1152, 4304, 2048, (8, 16, 24)),
        text=_qwen3_text(2048, 6144, 48, 32, 4, MoEPreset(128, 8, 768)),
        tie_word_embeddings=False,
        default_dtype="bfloat16",
        **_QWEN3_PIXELS,
    )
)
_register(
    ModelPreset(
        name="qwen3-vl-235b-a22b",
        family=QWEN3_VL,
        vision=_qwen3_vision(27, 1152, 4304, 4096, (8, 16, 24)),
        text=_qwen3_text(4096, 12288, 94, 64, 4, MoEPreset(128, 8, 1536)),
        tie_word_embeddings=False,
        default_dtype="bfloat16",
        **_QWEN3_PIXELS,
    )
)
_register(
    ModelPreset(
        name="qwen2.5-vl-3b",
        family=QWEN2_5_VL,
        vision=_qwen25_vision(2048),
        text=_qwen25_text(2048, 11008, 36, 16, 2, 151936),
        tie_word_embeddings=True,
        default_dtype="bfloat16",
        **_QWEN25_PIXELS,
    )
)
_register(
    ModelPreset(
        name="qwen2.5-vl-7b",
        family=QWEN2_5_VL,
        vision=_qwen25_vision(3584),
        text=_qwen25_text(3584, 18944, 28, 28, 4, 152064),
        tie_word_embeddings=False,
        default_dtype="bfloat16",
        **_QWEN25_PIXELS,
    )
)

TINY_PRESETS = tuple(n for n, p in PRESETS.items() if p.tiny)
LARGE_PRESETS = tuple(n for n, p in PRESETS.items() if not p.tiny)

# ----------------------------------------------------------------------------- Qwen3.5
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
        min_pixels=4 * 32 * 32, max_pixels=512 * 512, init=_TINY_INIT, tiny=True,
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
    name="qwen3.5-35b-a3b", family=QWEN3_5, vision=_qwen3_vision(27, 1152, 4304, 2048, ()),
    text=HybridTextPreset(
        hidden_size=2048, intermediate_size=0, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
        head_dim=256, vocab_size=QWEN3_5_VOCAB_SIZE, rope_theta=10_000_000.0, mrope_section=(11, 11, 10),
        mrope_interleaved=True, max_position_embeddings=262144,
        moe=SharedExpertMoEPreset(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                                  shared_expert_intermediate_size=512),
        linear=LinearAttnPreset(_QWEN3_5_MOE_LAYERS * 10, num_key_heads=16, num_value_heads=32, key_head_dim=128,
                                value_head_dim=128),
    ),
    tie_word_embeddings=False, default_dtype="bfloat16", **_QWEN3_PIXELS,
)

# Qwen3.5-4B (dense). Sources (searched public text): the Megatron model arguments of Qwen/Qwen3.5-4B in THUDM
# slime's scripts/models/qwen3.5-4B.sh (also copied in forks): 32 layers, hidden 2560, FFN 9216, 16 heads /
# 4 query groups of kv-channels 256, rotary-percent 0.25, rotary base 1e7, vocab 248320, gated attention
# output, zero-centred RMSNorm ("layernorm-1p"), tied embeddings (the 27B script unties them, this one does
# not). The DeltaNet geometry (16 key / 32 value heads of 128, conv kernel 4, full attention every 4th layer)
# and the vision tower (Qwen3-VL-8B's: 27 x 1152, out_hidden = the text hidden size) are the family's, as
# issue 49 states them and the 35B-A3B config shows; mrope_section [11, 11, 10] covers the 64 rotary dims.
QWEN3_5_PRESETS["qwen3.5-4b"] = ModelPreset(
    name="qwen3.5-4b", family=QWEN3_5, vision=_qwen3_vision(27, 1152, 4304, 2560, ()),
    text=HybridTextPreset(
        hidden_size=2560, intermediate_size=9216, num_hidden_layers=32, num_attention_heads=16,
        num_key_value_heads=4, head_dim=256, vocab_size=QWEN3_5_VOCAB_SIZE, rope_theta=10_000_000.0,
        mrope_section=(11, 11, 10), mrope_interleaved=True, max_position_embeddings=262144,
        linear=LinearAttnPreset(_QWEN3_5_MOE_LAYERS * 8, num_key_heads=16, num_value_heads=32, key_head_dim=128,
                                value_head_dim=128),
    ),
    tie_word_embeddings=True, default_dtype="bfloat16", **_QWEN3_PIXELS,
)


def list_presets() -> list[str]:
    return list(PRESETS) + list(QWEN3_5_PRESETS)


def get_preset(name: str | ModelPreset) -> ModelPreset:
    if isinstance(name, ModelPreset):
        return name
    try:
        return PRESETS[name] if name in PRESETS else QWEN3_5_PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(list_presets())}") from None


def with_text_layers(preset: str | ModelPreset, num_layers: int) -> ModelPreset:
    """The preset with only `num_layers` text decoder layers, every width and the vision tower unchanged:
    a real checkpoint's per-layer costs in a fraction of the bytes (a GPU job generates it in seconds).
    Qwen3-VL keeps at least one layer per deepstack level, which feeds the first text layers."""
    p = get_preset(preset)
    floor = max(1, len(p.vision.deepstack_visual_indexes))
    if not floor <= num_layers <= p.text.num_hidden_layers:
        raise ValueError(f"{p.name} takes {floor}..{p.text.num_hidden_layers} text layers, got {num_layers}")
    if num_layers == p.text.num_hidden_layers:
        return p
    text = replace(p.text, num_hidden_layers=num_layers)
    if isinstance(text, HybridTextPreset):  # the layer pattern is cut with the layers
        text = replace(text, linear=replace(text.linear, layer_types=text.linear.layer_types[:num_layers]))
    return replace(p, name=f"{p.name}-{num_layers}l", text=text)


def resolve_dtype(preset: ModelPreset, dtype: str | None) -> str:
    d = preset.default_dtype if dtype is None else str(dtype).removeprefix("torch.")
    aliases = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    d = aliases.get(d, d)
    if d not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {DTYPES}")
    return d


def with_overrides(preset: str | ModelPreset, **changes) -> ModelPreset:
    """A copy of ``preset`` with top-level fields replaced (e.g. a different init scheme)."""
    return replace(get_preset(preset), **changes)
