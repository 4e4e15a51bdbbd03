"""Architecture name -> model class, imported lazily so only the scheduler side loads nn code."""

from __future__ import annotations

import importlib

_MODELS = {
    "Qwen3VLForConditionalGeneration": "sglang.srt.models.qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "sglang.srt.models.qwen3_vl_moe",
    "Qwen2_5_VLForConditionalGeneration": "sglang.srt.models.qwen2_5_vl",
    # standalone forward only: the scheduler does not yet give it per-request recurrent states
    "Qwen3_5ForConditionalGeneration": "sglang.srt.models.qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "sglang.srt.models.qwen3_5_moe",  # as Qwen3.5 (same state interface)
}


def get_model_class(architecture: str):
    module = _MODELS.get(architecture)
    if module is None:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(_MODELS)}")
    return importlib.import_module(module).EntryClass


def supported_architectures() -> list[str]:
    return sorted(_MODELS)
