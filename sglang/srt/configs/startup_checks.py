"""What a model directory and its flags make impossible to serve, found from files alone before any process
is spawned: one line per problem, for the server-argument checks (server_args_checks.check_and_normalize),
whose refusals the CLI prints as one line without a traceback and `ServerArgs(...)` raises as a ValueError.

The same rules run again where the scheduler reads the config (ModelConfig) and the KV scales
(layers/quantization/kv_cache.py), so nothing depends on this check having run; it only moves the refusal
before the weights load, into the launching process. Checked here: the MoE routing of config.json
(ModelConfigError) and the `--quantization-param-path` file of an FP8 KV cache, for every TP rank
(KVScaleError). Scales stored in the checkpoint are tensors and are checked by the scheduler as it loads.
"""

from __future__ import annotations

import json
import os

from sglang.srt.configs.kv_scales import KVScaleError, param_file_scales
from sglang.srt.configs.model_config import ModelConfig, ModelConfigError

FP8_KV_CACHE_DTYPES = ("fp8_e4m3", "fp8_e5m2")


def startup_problems(model_path: str | None, kv_cache_dtype: str = "auto",
                     quantization_param_path: str | None = None, tp_size: int = 1) -> list[str]:
    """One line per problem; empty when nothing is wrong or nothing can be read yet. A `model_path` that is
    not a local directory with a config.json (a Hub id resolved later, the default model) is not read."""
    problems: list[str] = []
    raw = _local_config(model_path)
    if raw is not None:
        try:
            ModelConfig.from_dict(raw, str(model_path))
        except ModelConfigError as e:
            problems.append(str(e))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # not ours to judge here: the loader reports a config it cannot read, as before
    if kv_cache_dtype in FP8_KV_CACHE_DTYPES and quantization_param_path:
        text = (raw.get("text_config") or raw) if isinstance(raw, dict) else {}
        layers = text.get("num_hidden_layers") if isinstance(text, dict) else None
        layers = layers if isinstance(layers, int) and not isinstance(layers, bool) else None
        try:
            for rank in range(max(1, tp_size)):
                param_file_scales(quantization_param_path, rank, layers)
        except KVScaleError as e:
            problems.append(str(e))
    return problems


def _local_config(model_path: str | None) -> dict | None:
    if not model_path:
        return None
    path = os.path.join(str(model_path), "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None  # the loader names an unreadable config.json
    return raw if isinstance(raw, dict) else None


__all__ = ["FP8_KV_CACHE_DTYPES", "startup_problems"]
