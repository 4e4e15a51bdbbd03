"""The MoE router and the torch expert product (the CPU path of layers/moe) against plain dense math."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgl_kernel.moe import fused_experts_torch
from sglang.srt.layers.moe import FusedMoE, select_experts


def dense_reference(x, w13, w2, weights, ids):
    """Every expert on every token, masked: no grouping, no index bookkeeping."""
    out = torch.zeros_like(x)
    for e in range(w13.shape[0]):
        gate, up = F.linear(x, w13[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[e])
        scale = (weights * (ids == e)).sum(dim=-1, keepdim=True).to(x.dtype)
        out += y * scale
    return out


def _weights(e, h, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(e, 2 * n, h, generator=g) * 0.2, torch.randn(e, h, n, generator=g) * 0.2


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 8, 2), (17, 8, 2), (33, 16, 4), (5, 4, 4)])
def test_fused_experts_torch_matches_dense(tokens, experts, top_k):
    h, n = 24, 10
    w13, w2 = _weights(experts, h, n)
    x = torch.randn(tokens, h, generator=torch.Generator().manual_seed(1))
    weights, ids = select_experts(torch.randn(tokens, experts, generator=torch.Generator().manual_seed(2)), top_k, True)
    torch.testing.assert_close(fused_experts_torch(x, w13, w2, weights, ids), dense_reference(x, w13, w2, weights, ids))


def test_every_token_on_one_expert_and_empty_batch():
    w13, w2 = _weights(8, 16, 8)
    x = torch.randn(9, 16)
    ids = torch.tensor([[5, 3]] * 9, dtype=torch.int32)
    weights = torch.full((9, 2), 0.5)
    torch.testing.assert_close(fused_experts_torch(x, w13, w2, weights, ids), dense_reference(x, w13, w2, weights, ids))
    empty = fused_experts_torch(x[:0], w13, w2, weights[:0], ids[:0])
    assert empty.shape == (0, 16)


def test_router_softmax_topk_renormalized():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    w, ids = select_experts(logits, 2, renormalize=True)
    assert ids.tolist() == [[1, 2]] and ids.dtype == torch.int32
    p = torch.softmax(logits, -1)[0]
    torch.testing.assert_close(w, torch.stack([p[1], p[2]])[None] / (p[1] + p[2]))
    w_raw, _ = select_experts(logits, 2, renormalize=False)
    torch.testing.assert_close(w_raw, torch.stack([p[1], p[2]])[None])


def test_router_ties_go_to_the_lower_expert():
    logits = torch.tensor([[1.0, 3.0, 3.0, 1.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    _, ids = select_experts(logits, 2, True)
    assert ids.tolist() == [[1, 2], [0, 1]]
    _, ids3 = select_experts(logits.repeat(50, 1), 3, True)  # the same in any batch
    assert ids3.tolist() == [[1, 2, 4], [0, 1, 2]] * 50


def test_loader_takes_both_fused_layouts_and_slices_tp():
    from sglang.srt.distributed.parallel_state import TPInfo

    e, h, i = 4, 10, 6  # 2I != H and I != H: the two layouts differ in shape
    g = torch.Generator().manual_seed(3)
    gate_up_hf = torch.randn(e, 2 * i, h, generator=g)  # transformers' layout: [E, 2I, H]
    down_hf = torch.randn(e, h, i, generator=g)
    full = FusedMoE(e, h, i)
    full.gate_up_proj.weight_loader(full.gate_up_proj, gate_up_hf.transpose(1, 2).contiguous())  # released
    full.down_proj.weight_loader(full.down_proj, down_hf.transpose(1, 2).contiguous())
    assert torch.equal(full.gate_up_proj, gate_up_hf) and torch.equal(full.down_proj, down_hf)
    other = FusedMoE(e, h, i)
    other.gate_up_proj.weight_loader(other.gate_up_proj, gate_up_hf)
    other.down_proj.weight_loader(other.down_proj, down_hf)
    assert torch.equal(other.gate_up_proj, gate_up_hf) and torch.equal(other.down_proj, down_hf)
    for rank in range(2):
        part = FusedMoE(e, h, i, TPInfo(rank, 2))
        part.gate_up_proj.weight_loader(part.gate_up_proj, gate_up_hf.transpose(1, 2).contiguous())
        part.down_proj.weight_loader(part.down_proj, down_hf)
        s = slice(rank * 3, rank * 3 + 3)
        assert torch.equal(part.gate_up_proj, torch.cat([gate_up_hf[:, :i][:, s], gate_up_hf[:, i:][:, s]], dim=1))
        assert torch.equal(part.down_proj, down_hf[:, :, s])
    with pytest.raises(ValueError, match="neither the released layout"):
        full.down_proj.weight_loader(full.down_proj, torch.zeros(e, h, i + 1))


def test_tp_shards_sum_to_the_full_product():
    """Column-parallel gate_up, row-parallel down: the ranks' partial outputs add up to TP1's."""
    from sglang.srt.distributed.parallel_state import TPInfo

    e, h, i = 6, 20, 8
    w13, w2 = _weights(e, h, i, seed=4)
    x = torch.randn(11, h)
    weights, ids = select_experts(torch.randn(11, e), 2, True)
    full = fused_experts_torch(x, w13, w2, weights, ids)
    parts = []
    for rank in range(2):
        m = FusedMoE(e, h, i, TPInfo(rank, 2))
        m.gate_up_proj.weight_loader(m.gate_up_proj, w13)
        m.down_proj.weight_loader(m.down_proj, w2)
        parts.append(fused_experts_torch(x, m.gate_up_proj, m.down_proj, weights, ids))
    torch.testing.assert_close(parts[0] + parts[1], full)
