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

The presets themselves are defined per family (``presets_qwen_vl.py``, ``presets_qwen3_5.py``); this module
is the lookup over all of them (``get_preset``, ``list_presets``, ``with_text_layers``, ...).

Tiny presets (``qwen3-vl-tiny``, ``qwen2.5-vl-tiny``) are for fast CPU tests; the others are
shape-true replicas of the public checkpoints (random values, real shapes and configs).
Nothing here imports torch or transformers.
"""

from __future__ import annotations

from dataclasses import replace

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
from sglang.testing.presets_qwen_vl import LARGE_PRESETS, PRESETS, TINY_PRESETS  # noqa: F401
from sglang.testing.presets_qwen3_5 import (  # noqa: F401
    QWEN3_5_ENDOFTEXT_ID,
    QWEN3_5_IM_END_ID,
    QWEN3_5_IMAGE_TOKEN_ID,
    QWEN3_5_PRESETS,
    QWEN3_5_VIDEO_TOKEN_ID,
    QWEN3_5_VISION_END_TOKEN_ID,
    QWEN3_5_VISION_START_TOKEN_ID,
    QWEN3_5_VOCAB_SIZE,
    HybridTextPreset,
    LinearAttnPreset,
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
