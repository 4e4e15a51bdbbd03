"""--kv-cache-dtype fp8_e4m3 / fp8_e5m2: the pool stores entries divided by their layer's scale and
saturated, attention folds the scales back in, the bytes per token halve, and a model with an FP8 KV
cache tracks the same model with a float one."""

from __future__ import annotations

import json

import pytest
import torch

from sglang.srt.layers.quantization.kv_cache import checkpoint_kv_scales, is_scale_tensor, param_file_kv_scales
from sglang.srt.mem_cache.kv_cache_dtype import resolve_kv_cache_dtype
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_the_pool_stores_scaled_saturated_entries(dtype):
    pool = MHATokenToKVPool(8, 2, 16, 2, dtype, kv_scales={1: [0.5, 4.0]})
    k = torch.randn(3, 2, 16) * 3
    k[0, 0, 0] = 1e6  # past any FP8 range: saturates, never NaN
    loc = torch.tensor([1, 2, 3])
    pool.set_kv_buffer(1, loc, k, k)
    ks, vs = pool.kv_scales(1)
    assert (ks, vs) == (0.5, 4.0) and pool.kv_scales(0) == (1.0, 1.0)
    kr = pool.get_key_buffer(1)[loc].float() * ks
    vr = pool.get_value_buffer(1)[loc].float() * vs
    assert torch.isfinite(kr).all() and kr[0, 0, 0] == torch.finfo(dtype).max * ks
    rel = 2 ** -3 if dtype == torch.float8_e4m3fn else 2 ** -2
    body = k.clone()
    body[0, 0, 0] = 0
    kr[0, 0, 0] = 0
    assert ((kr - body).abs() <= body.abs() * rel + 2 ** -6).all()
    assert ((vr - k).abs()[1:] <= k.abs()[1:] * rel + 2 ** -4).all()
    assert pool.bytes_per_token() * 2 == MHATokenToKVPool(8, 2, 16, 2, torch.bfloat16).bytes_per_token()


def test_kv_cache_dtype_flag_values():
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("fp8_e4m3", torch.bfloat16) == torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("bfloat16", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="use auto"):
        resolve_kv_cache_dtype("float16", torch.bfloat16)
    with pytest.raises(ValueError, match="choose auto, fp8_e4m3 or fp8_e5m2"):
        resolve_kv_cache_dtype("int8", torch.bfloat16)


def test_scales_come_from_the_checkpoint_or_the_param_file(tmp_path):
    names = ["model.language_model.layers.3.self_attn.k_scale", "model.layers.3.self_attn.v_scale",
             "model.layers.0.self_attn.k_proj.weight"]
    assert [is_scale_tensor(n) for n in names] == [True, True, False]
    got = checkpoint_kv_scales([(names[0], torch.tensor(0.25)), (names[1], torch.tensor(2.0))])
    assert got == {3: [0.25, 2.0]}
    f = tmp_path / "scales.json"
    f.write_text(json.dumps({"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 0.5, "1": 2.0},
                                                                                         "1": {"0": 3.0}}}}))
    assert param_file_kv_scales(str(f), 1, 2) == {0: [3.0, 3.0]}
    assert param_file_kv_scales(str(f), 0, 2) == {0: [0.5, 0.5], 1: [2.0, 2.0]}
    with pytest.raises(ValueError, match="out of range"):
        param_file_kv_scales(str(f), 0, 1)
    f.write_text("{}")
    with pytest.raises(ValueError, match="scaling_factor"):
        param_file_kv_scales(str(f), 0, 2)
