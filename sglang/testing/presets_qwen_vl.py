"""Qwen3-VL (dense and MoE) and Qwen2.5-VL presets: the tiny ones for CPU tests and shape-true replicas of
the public checkpoints (`presets.py` is the lookup over every family). Nothing here imports torch."""

from __future__ import annotations

from dataclasses import replace

from sglang.testing.preset_types import (
    CLIP_MEAN,
    CLIP_STD,
    InitScheme,
    MoEPreset,
    ModelPreset,
    QWEN2_5_VL,
    QWEN3_VL,
    TextPreset,
    VisionPreset,
)


def qwen3_vision(depth, hidden, inter, out_hidden, deepstack, num_pos=2304) -> VisionPreset:
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


QWEN3_PIXELS = dict(image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5), min_pixels=65536, max_pixels=16777216)
_QWEN25_PIXELS = dict(image_mean=CLIP_MEAN, image_std=CLIP_STD, min_pixels=3136, max_pixels=12845056)

# Tiny models: larger init so the 64-wide model has non-degenerate, prompt-dependent logits.
TINY_INIT = InitScheme(weight_std=0.3, embed_std=0.5, bias_std=0.05, norm_noise_std=0.1)

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
        init=TINY_INIT,
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
        init=TINY_INIT,
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
        init=TINY_INIT,
        tiny=True,
    )
)

_register(
    ModelPreset(
        name="qwen3-vl-2b",
        family=QWEN3_VL,
        vision=qwen3_vision(24, 1024, 4096, 2048, (5, 11, 17)),
        text=_qwen3_text(2048, 6144, 28, 16, 8),
        tie_word_embeddings=True,
        default_dtype="bfloat16",
        **QWEN3_PIXELS,
    )
)
_register(
    ModelPreset(
        name="qwen3-vl-4b",
        family=QWEN3_VL,
        vision=qwen3_vision(24, 1024, 4096, 2560, (5, 11, 17)),
        text=_qwen3_text(2560, 9728, 36, 32, 8),
        tie_word_embeddings=True,
        default_dtype="bfloat16",
        **QWEN3_PIXELS,
    )
)
_register(
    ModelPreset(
        name="qwen3-vl-8b",
        family=QWEN3_VL,
        vision=qwen3_vision(27, 1152, 4304, 4096, (8, 16, 24)),
        text=_qwen3_text(4096, 12288, 36, 32, 8),
        tie_word_embeddings=False,
        default_dtype="bfloat16",
        **QWEN3_PIXELS,
    )
)
# Qwen3-VL-MoE: 128 experts, 8 active, the Qwen3-VL-8B vision tower (out_hidden = text hidden)
_register(
    ModelPreset(
        name="qwen3-vl-30b-a3b",
        family=QWEN3_VL,
        vision=qwen3_vision(27, 1152, 4304, 2048, (8, 16, 24)),
        text=_qwen3_text(2048, 6144, 48, 32, 4, MoEPreset(128, 8, 768)),
        tie_word_embeddings=False,
        default_dtype="bfloat16",
        **QWEN3_PIXELS,
    )
)
_register(
    ModelPreset(
        name="qwen3-vl-235b-a22b",
        family=QWEN3_VL,
        vision=qwen3_vision(27, 1152, 4304, 4096, (8, 16, 24)),
        text=_qwen3_text(4096, 12288, 94, 64, 4, MoEPreset(128, 8, 1536)),
        tie_word_embeddings=False,
        default_dtype="bfloat16",
        **QWEN3_PIXELS,
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
