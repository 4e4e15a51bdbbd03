"""The pure-torch backend's prefill: query tiles give the same attention as one SDPA per request, and no
intermediate grows with (chunk x context): a long prompt's memory is bounded by the tile budget."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from sgl_kernel.attention import extend_attention_torch
from sglang.srt.layers.attention import torch_native_backend as tnb


class _Pool:
    def __init__(self, k, v):
        self.k, self.v = k, v

    def set_kv_buffer(self, layer_id, loc, k, v):
        self.k[loc], self.v[loc] = k, v

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


def _case(prefixes, news, hq=4, hk=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = [p + n for p, n in zip(prefixes, news)]
    slots_total = sum(seqs) + 5
    perm = torch.randperm(slots_total, generator=g)
    table = torch.zeros(len(seqs), max(seqs), dtype=torch.int64)
    at = 0
    for i, s in enumerate(seqs):
        table[i, :s] = perm[at: at + s]
        at += s
    k_buf, v_buf = torch.randn(slots_total, hk, d, generator=g), torch.randn(slots_total, hk, d, generator=g)
    q = torch.randn(sum(news), hq, d, generator=g)
    k_new, v_new = torch.randn(sum(news), hk, d, generator=g), torch.randn(sum(news), hk, d, generator=g)
    out_loc = torch.cat([table[i, p: p + n] for i, (p, n) in enumerate(zip(prefixes, news))])
    fb = SimpleNamespace(
        token_to_kv_pool=_Pool(k_buf, v_buf), out_cache_loc=out_loc,
        req_to_token_pool=SimpleNamespace(req_to_token=table),
        req_pool_indices_cpu=list(range(len(seqs))), extend_seq_lens_cpu=list(news), seq_lens_cpu=seqs,
        extend_start_locs=lambda: [sum(news[:i]) for i in range(len(news))],
    )
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=hq, tp_k_head_num=hk, scaling=d ** -0.5)
    return q, k_new, v_new, layer, fb


def _reference(q, layer, fb):
    seqs, news = fb.seq_lens_cpu, fb.extend_seq_lens_cpu
    qo = torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()])
    kv = torch.tensor([0, *torch.tensor(seqs).cumsum(0).tolist()])
    idx = torch.cat([fb.req_to_token_pool.req_to_token[i, :s] for i, s in enumerate(seqs)])
    pool = fb.token_to_kv_pool
    return extend_attention_torch(q, pool.k, pool.v, qo, kv, idx, max(news), layer.scaling)


@pytest.mark.parametrize("budget", [None, 4096, 1])
def test_tiled_prefill_equals_the_reference(monkeypatch, budget):
    if budget is not None:
        monkeypatch.setattr(tnb, "SCORE_TILE_BYTES", budget)
    q, k, v, layer, fb = _case([0, 37, 5, 64], [50, 9, 1, 33])
    got = tnb.TorchNativeAttnBackend().forward_extend(q, k, v, layer, fb)
    torch.testing.assert_close(got, _reference(q, layer, fb), rtol=1e-5, atol=1e-5)


def test_query_tile_keeps_scores_within_the_budget():
    assert tnb.query_tile(8192, 88_000, 16, budget=64 << 20) == 11  # 16 x 11 x 88k x 4 B <= 64 MiB
    assert tnb.query_tile(8192, 100, 4, budget=64 << 20) == 8192
    assert tnb.query_tile(10, 10**9, 64, budget=64 << 20) == 1


class _Largest(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def test_no_intermediate_grows_with_chunk_times_context(monkeypatch):
    monkeypatch.setattr(tnb, "SCORE_TILE_BYTES", 256 << 10)
    q, k, v, layer, fb = _case([3000], [1024], hq=4, hk=2, d=8)
    with _Largest() as mode:
        tnb.TorchNativeAttnBackend().forward_extend(q, k, v, layer, fb)
    whole = 4 * 1024 * 4024 * 4  # the (heads x chunk x context) float32 scores of one SDPA call: 63 MiB
    assert mode.largest <= 2 * (256 << 10) + q.numel() * 4 + 4024 * 2 * 8 * 4, (mode.largest, whole)
