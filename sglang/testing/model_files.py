"""The non-weight files of a generated model and the per-family dispatch: which module (hf_configs /
tensor_specs for the Qwen-VL families, qwen3_5_checkpoint for Qwen3.5) builds each config and lists each
tensor; and `write_config_only`, a model folder without weights (for `--load-format dummy`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sglang.testing import hf_configs, qwen3_5_checkpoint
from sglang.testing import tensor_specs as _vl_specs
from sglang.testing.presets import QWEN3_5, ModelPreset, get_preset, resolve_dtype
from sglang.testing.weight_gen import TensorSpec

QUANTIZE_CHOICES = ("fp8",)


def _files(preset: str | ModelPreset):
    return qwen3_5_checkpoint if get_preset(preset).family == QWEN3_5 else hf_configs


def tensor_specs(preset: str | ModelPreset) -> list[TensorSpec]:
    """All checkpoint tensors (Hub names, shapes, init kinds), in file order."""
    p = get_preset(preset)
    return qwen3_5_checkpoint.tensor_specs(p) if p.family == QWEN3_5 else _vl_specs.tensor_specs(p)


def count_parameters(preset: str | ModelPreset, part: str = "all") -> int:
    """Parameter count of the checkpoint (tied lm_head counted once). ``part``: "all", "vision" or "text"."""
    p = get_preset(preset)
    if p.family != QWEN3_5:
        return _vl_specs.count_parameters(p, part)
    if part not in ("all", "vision", "text"):
        raise ValueError(part)
    return sum(s.numel for s in tensor_specs(p) if part == "all" or ("visual." in s.name) == (part == "vision"))


def build_config_dict(preset: str | ModelPreset, dtype: str | None = None) -> dict:
    return _files(preset).build_config_dict(preset, dtype)


def build_generation_config(preset: str | ModelPreset) -> dict:
    return _files(preset).build_generation_config(preset)


def build_preprocessor_config(preset: str | ModelPreset) -> dict:
    return _files(preset).build_preprocessor_config(preset)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def write_config_only(preset: str | ModelPreset, out_dir: str | os.PathLike, dtype: str | None = None,
                      quantize: str | None = None) -> Path:
    """config.json, generation and preprocessor configs and the tokenizer files of ``preset``, and no weights:
    what a server needs with ``--load-format dummy`` (weights made on the device). In seconds for any
    preset; ``quantize="fp8"`` writes the -FP8 layout's quantization_config."""
    from sglang.testing.tokenizer_builder import write_tokenizer_files

    p = get_preset(preset)
    d = resolve_dtype(p, dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = build_config_dict(p, d)
    if quantize == "fp8":
        from sglang.testing.fp8_checkpoint import BLOCK, TINY_BLOCK, quantization_config_for

        specs = [(s.name, len(s.shape)) for s in tensor_specs(p)]
        config["quantization_config"] = quantization_config_for(specs, TINY_BLOCK if p.tiny else BLOCK)
    elif quantize is not None:
        raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES}, got {quantize!r}")
    for name, obj in [("config.json", config), ("generation_config.json", build_generation_config(p)),
                      ("preprocessor_config.json", build_preprocessor_config(p))]:
        _write_json(out / name, obj)
    write_tokenizer_files(out, p.family, model_max_length=p.text.max_position_embeddings)
    return out
