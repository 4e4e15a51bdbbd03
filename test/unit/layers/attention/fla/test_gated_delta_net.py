"""Our Gated DeltaNet layer against transformers' Qwen3_5GatedDeltaNet on the same weights (float32),
its per-request state handling (batches, chunked prefill, decode steps, in-place updates), its tensor
parallel split, and the gated norm's convention."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.configs.qwen3_5_config import HybridAttentionConfig
from sglang.srt.distributed.parallel_state import TPInfo
from sglang.srt.layers.attention.fla.gated_delta_net import GatedDeltaNet
from sglang.srt.layers.attention.fla.norm import GatedRMSNorm

hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig  # noqa: E402

HIDDEN = 32
CFG = HybridAttentionConfig(layer_types=("linear_attention",), linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, rotary_dim=8)


def _reference():
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(hidden_size=HIDDEN, num_hidden_layers=1, layer_types=["linear_attention"],
                               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                               linear_value_head_dim=8, linear_conv_kernel_dim=4, vocab_size=16)
    layer = hf.Qwen3_5GatedDeltaNet(config, 0).eval()
    with torch.no_grad():  # away from the init values, so a swapped tensor shows
        layer.dt_bias.normal_(1.0, 0.3)
        layer.norm.weight.normal_(1.0, 0.2)
        for lin in (layer.in_proj_qkv, layer.in_proj_z, layer.in_proj_a, layer.in_proj_b, layer.out_proj):
            lin.weight.mul_(3.0)
    return layer


def _ours(ref, tp: TPInfo = TPInfo()) -> GatedDeltaNet:
    layer = GatedDeltaNet(HIDDEN, CFG, 1e-6, tp)
    params = dict(layer.named_parameters())
    for name, tensor in ref.state_dict().items():  # checkpoint names = transformers' module names
        p = params[name]
        getattr(p, "weight_loader", lambda p, t, s=None: p.data.copy_(t))(p, tensor)
    return layer


@pytest.fixture(scope="module")
def pair():
    ref = _reference()
    return ref, _ours(ref)


def _x(t: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(t, HIDDEN, generator=torch.Generator().manual_seed(seed))


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("t", [1, 7, 150])
def test_prefill_matches_transformers(pair, t):
    ref, ours = pair
    x = _x(t)
    state = ours.state_shape(1, torch.float32).new_request()
    with torch.no_grad():
        want = ref(x[None])[0]
        got = ours(x, [t], [state.layer(0)])
    assert _rel(got, want) <= 1e-5


def test_chunks_and_decode_steps_equal_one_shot(pair):
    _, ours = pair
    x = _x(90, seed=2)
    shape = ours.state_shape(1, torch.float32)
    one, split = shape.new_request(), shape.new_request()
    with torch.no_grad():
        whole = ours(x, [90], [one.layer(0)])
        parts = [ours(x[:40], [40], [split.layer(0)]), ours(x[40:87], [47], [split.layer(0)])]
        parts += [ours(x[i:i + 1], [1], [split.layer(0)]) for i in range(87, 90)]  # recurrent step
    assert _rel(torch.cat(parts), whole) <= 1e-5
    # (not bitwise: the projections see other row counts, and BLAS rounds by the shape)
    assert torch.allclose(split.recurrent, one.recurrent, atol=1e-5)
    assert torch.allclose(split.conv, one.conv, atol=1e-5)


def test_batch_equals_each_request_alone(pair):
    _, ours = pair
    a, b, c = _x(9, 3), _x(1, 4), _x(20, 5)
    shape = ours.state_shape(1, torch.float32)
    batch = [shape.new_request() for _ in range(3)]
    alone = [shape.new_request() for _ in range(3)]
    with torch.no_grad():
        out = ours(torch.cat([a, b, c]), [9, 1, 20], [s.layer(0) for s in batch])
        want = torch.cat([ours(x, [len(x)], [s.layer(0)]) for x, s in zip((a, b, c), alone)])
    assert _rel(out, want) <= 1e-5
    for s, w in zip(batch, alone):
        assert torch.allclose(s.recurrent, w.recurrent, atol=1e-5)


def test_state_is_updated_in_place_in_pool_views(pair):
    """States may be views into a pool's storage: the layer writes into them, never rebinds."""
    _, ours = pair
    shape = ours.state_shape(1, torch.float32)
    pool_conv = torch.zeros(3, 1, shape.conv_dim, shape.conv_kernel - 1)
    pool_rec = torch.zeros(3, 1, shape.num_value_heads, shape.key_head_dim, shape.value_head_dim)
    from sglang.srt.mem_cache.gdn_state import GDNRequestState

    slot = GDNRequestState(pool_conv[1], pool_rec[1])
    assert shape.bytes_per_request() == (pool_conv[1].numel() + pool_rec[1].numel()) * 4
    with torch.no_grad():
        ours(_x(5), [5], [slot.layer(0)])
    assert pool_rec[1].abs().sum() > 0 and pool_conv[1].abs().sum() > 0
    assert pool_rec[0].abs().sum() == 0 and pool_rec[2].abs().sum() == 0


def test_tensor_parallel_shards_sum_to_the_whole(pair, monkeypatch):
    """Two ranks' layers (out_proj's all-reduce replaced by returning the partial sum) add up to one
    rank's output: each rank keeps matching q, k, v, conv, decay and gate slices of its heads."""
    import sglang.srt.layers.linear as linear

    ref, ours = pair
    monkeypatch.setattr(linear, "tensor_model_parallel_all_reduce", lambda y, tp: y)
    x = _x(12, 6)
    total = 0
    with torch.no_grad():
        for rank in range(2):
            layer = _ours(ref, TPInfo(rank=rank, size=2))
            assert layer.num_k_heads == 1 and layer.num_v_heads == 2
            state = layer.state_shape(1, torch.float32).new_request()
            total = total + layer(x, [12], [state.layer(0)])
        want = ours(x, [12], [ours.state_shape(1, torch.float32).new_request().layer(0)])
    assert _rel(total, want) <= 1e-5


def test_gated_norm_matches_transformers_and_is_not_zero_centred():
    torch.manual_seed(0)
    ref = hf.Qwen3_5RMSNormGated(8, eps=1e-6)
    with torch.no_grad():
        ref.weight.normal_(1.0, 0.3)
    ours = GatedRMSNorm(8, 1e-6)
    ours.weight.data.copy_(ref.weight)
    x, z = torch.randn(5, 8), torch.randn(5, 8)
    assert torch.allclose(ours(x, z), ref(x, z), atol=1e-6)
    # the same weight read as (1 + w) would be another function: the conventions are not interchangeable
    doubled = GatedRMSNorm(8, 1e-6)
    doubled.weight.data.copy_(1.0 + ref.weight)
    assert (doubled(x, z) - ours(x, z)).abs().max() > 0.1
