"""--kv-cache-dtype: the KV pool's storage dtype. An FP8 cache stores K / k_scale and V / v_scale (saturated
to the format's range); attention folds the scales in (q * k_scale, the output * v_scale), so the kernels
and the torch path read the cache alike. Where the scales come from: layers/quantization/kv_cache.py."""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = {"auto": None, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def resolve_kv_cache_dtype(flag: str, model_dtype: torch.dtype) -> torch.dtype:
    if flag not in KV_CACHE_DTYPES and flag not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"--kv-cache-dtype {flag!r}: choose auto, fp8_e4m3 or fp8_e5m2")
    if flag in ("auto", str(model_dtype).removeprefix("torch.")):
        return model_dtype
    if flag in KV_CACHE_DTYPES:
        return KV_CACHE_DTYPES[flag]
    raise ValueError(f"--kv-cache-dtype {flag}: a float cache is the model dtype ({model_dtype}); use auto")
