"""Linear layers (layers/linear.py): at TP=1 each equals a plain nn.Linear on the full checkpoint tensor
(shapes, bias, fused q/k/v and gate/up loaded from separate or fused tensors, split_qkv); every
weight_loader refuses a tensor of the wrong shape; and at TP=2 the per-rank shards the loaders cut
(no process group needed to load) recombine into the full computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.distributed.parallel_state import TPInfo
from sglang.srt.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _load(layer, weight, bias=None, shard_id=None):
    layer.weight.weight_loader(layer.weight, weight, shard_id)
    if bias is not None:
        layer.bias.weight_loader(layer.bias, bias, shard_id)
    return layer


@pytest.mark.parametrize("cls", [ReplicatedLinear, ColumnParallelLinear, RowParallelLinear])
@pytest.mark.parametrize("bias", [True, False])
def test_tp1_equals_a_plain_linear(cls, bias):
    w, b, x = _rand(6, 4, seed=1), _rand(6, seed=2), _rand(3, 4, seed=3)
    layer = _load(cls(4, 6, bias=bias, dtype=torch.float32), w, b if bias else None)
    assert tuple(layer.weight.shape) == (6, 4) and (layer.bias is None) == (not bias)
    assert not layer.weight.requires_grad
    torch.testing.assert_close(layer(x), F.linear(x, w, b if bias else None))


def test_dtype_follows_the_argument_and_the_loader_casts():
    layer = _load(ColumnParallelLinear(4, 6, dtype=torch.bfloat16), _rand(6, 4), _rand(6))
    assert layer.weight.dtype == layer.bias.dtype == torch.bfloat16
    torch.testing.assert_close(layer.weight.float(), _rand(6, 4).bfloat16().float())


@pytest.mark.parametrize("cls, bad", [(ReplicatedLinear, (6, 5)), (ColumnParallelLinear, (6, 3)), (RowParallelLinear, (5, 4))])
def test_wrong_checkpoint_shape_is_refused(cls, bad):
    """A mismatch in the dimension a layer does not split (the split one is cut to the rank's share)."""
    layer = cls(4, 6, dtype=torch.float32)
    with pytest.raises(ValueError, match="shape"):
        layer.weight.weight_loader(layer.weight, _rand(*bad))


def test_merged_column_loads_each_output_or_the_fused_tensor():
    gate, up, x = _rand(5, 4, seed=1), _rand(7, 4, seed=2), _rand(2, 4, seed=3)
    by_part = MergedColumnParallelLinear(4, [5, 7], bias=False, dtype=torch.float32)
    _load(by_part, gate, shard_id=0)
    _load(by_part, up, shard_id=1)
    fused = _load(MergedColumnParallelLinear(4, [5, 7], bias=False, dtype=torch.float32), torch.cat([gate, up]))
    assert tuple(by_part.weight.shape) == (12, 4) and by_part.output_sizes == [5, 7]
    torch.testing.assert_close(by_part.weight, fused.weight, rtol=0, atol=0)
    torch.testing.assert_close(by_part(x), torch.cat([F.linear(x, gate), F.linear(x, up)], dim=-1))
    with pytest.raises(ValueError, match=r"MergedColumnParallelLinear\[1\]"):
        by_part.weight.weight_loader(by_part.weight, _rand(7, 5), 1)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (4, None)])
def test_qkv_tp1_loads_and_splits(heads, kv_heads):
    hd, hidden = 3, 8
    kvh = kv_heads or heads
    q, k, v = _rand(heads * hd, hidden, seed=1), _rand(kvh * hd, hidden, seed=2), _rand(kvh * hd, hidden, seed=3)
    qb, kb, vb = _rand(heads * hd, seed=4), _rand(kvh * hd, seed=5), _rand(kvh * hd, seed=6)
    layer = QKVParallelLinear(hidden, hd, heads, kv_heads, bias=True, dtype=torch.float32)
    for sid, w, b in (("q", q, qb), ("k", k, kb), ("v", v, vb)):
        _load(layer, w, b, sid)
    assert (layer.num_heads, layer.num_kv_heads, layer.kv_replicas) == (heads, kvh, 1)
    assert (layer.q_size, layer.kv_size) == (heads * hd, kvh * hd)
    assert tuple(layer.weight.shape) == ((heads + 2 * kvh) * hd, hidden)
    fused = _load(QKVParallelLinear(hidden, hd, heads, kv_heads, bias=True, dtype=torch.float32),
                  torch.cat([q, k, v]), torch.cat([qb, kb, vb]))
    torch.testing.assert_close(fused.weight, layer.weight, rtol=0, atol=0)
    torch.testing.assert_close(fused.bias, layer.bias, rtol=0, atol=0)
    x = _rand(5, hidden, seed=7)
    oq, ok, ov = layer.split_qkv(layer(x))
    torch.testing.assert_close(oq, F.linear(x, q, qb))
    torch.testing.assert_close(ok, F.linear(x, k, kb))
    torch.testing.assert_close(ov, F.linear(x, v, vb))


def test_column_and_merged_shards_recombine_at_tp2():
    w, b, x = _rand(8, 4, seed=1), _rand(8, seed=2), _rand(3, 4, seed=3)
    outs = []
    for rank in range(2):
        layer = _load(ColumnParallelLinear(4, 8, tp=TPInfo(rank, 2), dtype=torch.float32), w, b)
        assert tuple(layer.weight.shape) == (4, 4)
        outs.append(layer(x))  # gather_output=False: no collective
    torch.testing.assert_close(torch.cat(outs, dim=-1), F.linear(x, w, b))

    gate, up = _rand(4, 4, seed=4), _rand(6, 4, seed=5)
    for rank in range(2):
        layer = _load(MergedColumnParallelLinear(4, [4, 6], bias=False, tp=TPInfo(rank, 2), dtype=torch.float32),
                      torch.cat([gate, up]))
        # each rank holds [its slice of gate | its slice of up]
        want = torch.cat([gate[rank * 2:(rank + 1) * 2], up[rank * 3:(rank + 1) * 3]])
        torch.testing.assert_close(layer.weight, want, rtol=0, atol=0)


def test_row_shards_sum_to_the_full_product_at_tp2():
    w, b, x = _rand(6, 8, seed=1), _rand(6, seed=2), _rand(3, 8, seed=3)
    partial = []
    for rank in range(2):
        layer = _load(RowParallelLinear(8, 6, reduce_results=False, tp=TPInfo(rank, 2), dtype=torch.float32), w, b)
        assert tuple(layer.weight.shape) == (6, 4) and tuple(layer.bias.shape) == (6,)
        partial.append(layer(x[:, rank * 4:(rank + 1) * 4]))  # the bias enters on rank 0 only
    torch.testing.assert_close(partial[0] + partial[1], F.linear(x, w, b))


@pytest.mark.parametrize("kv_heads, replicas", [(4, 1), (2, 1), (1, 2)])
def test_qkv_shards_by_head_and_replicates_scarce_kv_heads_at_tp2(kv_heads, replicas):
    heads, hd, hidden = 4, 2, 6
    q, k, v = _rand(heads * hd, hidden, seed=1), _rand(kv_heads * hd, hidden, seed=2), _rand(kv_heads * hd, hidden, seed=3)
    for rank in range(2):
        layer = _load(QKVParallelLinear(hidden, hd, heads, kv_heads, bias=False, tp=TPInfo(rank, 2), dtype=torch.float32),
                      torch.cat([q, k, v]))
        assert layer.num_heads == 2 and layer.kv_replicas == replicas
        lq, lk, lv = layer.weight.split([layer.q_size, layer.kv_size, layer.kv_size])
        kv_rank, n = rank // replicas, layer.kv_size
        torch.testing.assert_close(lq, q[rank * 2 * hd:(rank + 1) * 2 * hd], rtol=0, atol=0)
        torch.testing.assert_close(lk, k[kv_rank * n:(kv_rank + 1) * n], rtol=0, atol=0)
        torch.testing.assert_close(lv, v[kv_rank * n:(kv_rank + 1) * n], rtol=0, atol=0)


@pytest.mark.parametrize("make, bad, shard", [
    (lambda tp: ColumnParallelLinear(4, 8, tp=tp, dtype=torch.float32), (10, 4), None),
    (lambda tp: RowParallelLinear(8, 6, tp=tp, dtype=torch.float32), (6, 10), None),
    (lambda tp: MergedColumnParallelLinear(4, [4, 6], bias=False, tp=tp, dtype=torch.float32), (6, 4), 0),
    (lambda tp: MergedColumnParallelLinear(4, [4, 6], bias=False, tp=tp, dtype=torch.float32), (12, 4), None),
    (lambda tp: QKVParallelLinear(8, 2, 4, 2, bias=False, tp=tp, dtype=torch.float32), (10, 8), "q"),
    (lambda tp: QKVParallelLinear(8, 2, 4, 2, bias=False, tp=tp, dtype=torch.float32), (20, 8), None),
])
def test_oversized_checkpoint_tensor_is_refused_not_truncated(make, bad, shard):
    """Along the split dimension a rank takes only its slice: a tensor larger than the full size would
    otherwise be cut silently."""
    layer = make(TPInfo(0, 2))
    with pytest.raises(ValueError, match="expected"):
        layer.weight.weight_loader(layer.weight, _rand(*bad), shard)
