"""What the tests of sglang.testing.make_model share: the transformers classes per model type, and the
key renaming and transposition transformers applies on load (the fixtures `tiny_dirs` and `quiet_transformers`: test/conftest.py)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
)

from sglang.testing.hf_configs import build_config_dict
from sglang.testing.presets import get_preset

# keyed by model_type: qwen3_vl_moe is a model type of the qwen3_vl family
MODEL_CLASS = {"qwen3_vl": Qwen3VLForConditionalGeneration, "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
               "qwen3_vl_moe": Qwen3VLMoeForConditionalGeneration}
CONFIG_CLASS = {"qwen3_vl": Qwen3VLConfig, "qwen2_5_vl": Qwen2_5_VLConfig, "qwen3_vl_moe": Qwen3VLMoeConfig}


def file_hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def as_loaded(name: str, value):
    """transformers 5 transposes Qwen3-VL-MoE's fused experts on load ([E, in, out] -> [E, out, in])."""
    if ".mlp.experts." in name:
        return value.transpose(1, 2) if hasattr(value, "transpose") else (value[0], value[2], value[1])
    return value


def hub_to_transformers(name: str, family: str) -> str:
    """transformers 5.x key renaming: Qwen2.5-VL Hub keys `visual.*` / `model.*` are loaded
    as `model.visual.*` / `model.language_model.*`; Qwen3-VL Hub keys are used as is."""
    if family == "qwen2_5_vl":
        name = re.sub(r"^visual\.", "model.visual.", name)
        name = re.sub(r"^model\.(?!visual\.|language_model\.)", "model.language_model.", name)
    return name


def meta_model(preset_name: str):
    p = get_preset(preset_name)
    config = CONFIG_CLASS[p.model_type](**build_config_dict(p))
    with torch.device("meta"):
        model = MODEL_CLASS[p.model_type](config)
    return p, config, model
