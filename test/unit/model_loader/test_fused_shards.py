"""What the whole-or-nothing loader rests on: the NaN test for e4m3 bytes, a shard delivered twice
counting once (last wins), the shards each fused layer declares (this rank's experts only under EP), and
FP8 scale grids checked against the full checkpoint matrix at TP > 1, not the rank's slice."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.distributed.parallel_state import TPInfo
from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.moe.fp8_moe import Fp8FusedMoE
from sglang.srt.layers.quantization import Fp8Config, QuantizationError
from sglang.srt.model_loader.loader import MissingWeightsError, get_model, load_weights
from sglang.srt.model_loader.weight_utils import LazyWeight, NonFiniteWeightError, has_non_finite, iterate_weights

K0 = "model.language_model.layers.0.self_attn.k_proj.weight"
Q0 = "model.language_model.layers.0.self_attn.q_proj.weight"


def test_e4m3_nan_is_exactly_the_bytes_0x7f_and_0xff():
    every = torch.arange(256, dtype=torch.uint8)
    flagged = [b for b in range(256) if has_non_finite(every[b : b + 1].view(torch.float8_e4m3fn))]
    assert flagged == [0x7F, 0xFF]
    assert not has_non_finite(every[every != 0x7F][every[every != 0x7F] != 0xFF].view(torch.float8_e4m3fn))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_float_nan_and_inf_are_refused_naming_the_tensor(dtype, bad):
    t = torch.ones(4, 6, dtype=dtype)
    assert not has_non_finite(t) and not has_non_finite(torch.full((3,), 7, dtype=torch.int64))
    t[2, 5] = bad
    lazy = LazyWeight.of(t, "model.x.weight")
    assert lazy.narrow(0, 0, 2).load().shape == (2, 6)  # a rank reading clean rows only is not refused
    with pytest.raises(NonFiniteWeightError, match=r"'model\.x\.weight'.*non-finite"):
        lazy.narrow(0, 2, 2).load()


def _weights(path, replace: dict[str, list]):
    """The checkpoint's (name, tensor) pairs, read eagerly, with entries of `replace` substituted."""
    out = []
    for name, t in iterate_weights(path):
        out += [(n, x) for n, x in replace[name]] if name in replace else [(name, t)]
    return out


def test_a_shard_delivered_twice_counts_once_and_the_last_wins(tiny_model_dir):
    path = tiny_model_dir("qwen3-vl-tiny")
    model = get_model(str(path))
    ckpt = dict(iterate_weights(path))
    # q twice and no k: q's second copy must not stand in for k
    with pytest.raises(MissingWeightsError, match=r"self_attn\.qkv_proj\.weight shard 'k' \(model\.layers\.0\.self_attn"
                                                  r"\.k_proj\.weight\)"):
        load_weights(model, _weights(path, {K0: [(Q0, ckpt[Q0])]}))
    # k twice: the second copy is what the model holds
    k2 = torch.randn_like(ckpt[K0])
    load_weights(model, _weights(path, {K0: [(K0, ckpt[K0]), (K0, k2)]}))
    attn = model.model.layers[0].self_attn.qkv_proj
    assert torch.equal(attn.split_qkv(attn.weight.data.t())[1].t(), k2)


def test_an_eager_tensor_is_checked_as_a_lazy_one(tiny_model_dir):
    path = tiny_model_dir("qwen3-vl-tiny")
    model = get_model(str(path))
    bad = dict(iterate_weights(path))[K0].clone()
    bad[3, 3] = float("nan")
    with pytest.raises(NonFiniteWeightError, match=K0.replace(".", r"\.")):
        load_weights(model, _weights(path, {K0: [(K0, bad)]}))


def test_fused_layers_declare_their_shards_and_experts_only_their_own():
    qkv = QKVParallelLinear(64, 16, 4, 2, bias=True)
    assert qkv.weight.required_shards == qkv.bias.required_shards == ("q", "k", "v")
    assert MergedColumnParallelLinear(64, [32, 32, 32]).weight.required_shards == (0, 1, 2)
    assert not hasattr(RowParallelLinear(64, 64).weight, "required_shards")
    fp8 = Fp8Config().method_for("x")
    layer = QKVParallelLinear(256, 64, 4, 2, bias=False, tp=TPInfo(1, 2), quant=fp8)
    assert layer.weight.dtype == torch.float8_e4m3fn  # the parameter create_weights made carries them too
    assert layer.weight.required_shards == layer.weight_scale_inv.required_shards == ("q", "k", "v")
    moe = Fp8FusedMoE(8, 64, 48, tp=TPInfo(1, 2, ep_size=2))  # rank 1 holds experts 4..7
    assert moe.gate_up_proj.required_shards == moe.gate_up_proj_scale_inv.required_shards == tuple(
        (e, p) for e in range(4, 8) for p in (0, 1))
    assert moe.down_proj.required_shards == moe.down_proj_scale_inv.required_shards == tuple(
        (e, None) for e in range(4, 8))


def test_scale_grids_are_the_full_checkpoint_matrix_at_tp2():
    """q is 4 x 64 = 256 rows, k 2 x 64 = 128, 320 columns: grids 2 x 3 and 1 x 3, whatever a rank holds."""
    fp8 = Fp8Config().method_for("x")
    layer = QKVParallelLinear(320, 64, 4, 2, bias=False, tp=TPInfo(1, 2), quant=fp8)
    load = layer.weight_scale_inv.weight_loader
    load(layer.weight_scale_inv, LazyWeight.of(torch.ones(2, 3), "q.weight_scale_inv"), "q")
    load(layer.weight_scale_inv, LazyWeight.of(torch.ones(1, 3), "k.weight_scale_inv"), "k")
    with pytest.raises(QuantizationError, match=r"k\.weight_scale_inv: FP8 block scale shape \(2, 3\) != \(1, 3\)"):
        load(layer.weight_scale_inv, LazyWeight.of(torch.ones(2, 3), "k.weight_scale_inv"), "k")
    row = RowParallelLinear(320, 200, bias=False, tp=TPInfo(1, 2), quant=fp8)  # 160 local columns of 320
    row.weight_scale_inv.weight_loader(row.weight_scale_inv, torch.ones(2, 3))
    with pytest.raises(QuantizationError, match=r"\(2, 2\) != \(2, 3\)"):
        row.weight_scale_inv.weight_loader(row.weight_scale_inv, torch.ones(2, 2))
