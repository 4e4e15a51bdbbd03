"""MoE: the torch references (also the CPU path), and the Triton kernels against them on CPU under the
Triton interpreter (hypothesis over shapes: empty experts, one token, every token on one expert) and on
CUDA (marked `gpu`)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from sgl_kernel.moe import (
    fused_experts,
    fused_experts_torch,
    moe_align_block_size,
    moe_align_block_size_reference,
    topk_softmax,
    topk_softmax_torch,
)

KERNEL_MODULE = "sgl_kernel.moe._moe_triton"
SETTINGS = settings(max_examples=15, deadline=None, database=None)


def _dense(x, w13, w2, weights, ids):
    """Every expert on every token, masked: no grouping, no index bookkeeping."""
    out = torch.zeros_like(x)
    for e in range(w13.shape[0]):
        gate, up = F.linear(x, w13[e]).chunk(2, dim=-1)
        out += F.linear(F.silu(gate) * up, w2[e]) * (weights * (ids == e)).sum(-1, keepdim=True)
    return out


def _case(t, e, k, h, n, seed, route="random"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13, w2 = torch.randn(e, 2 * n, h, generator=g) * 0.2, torch.randn(e, h, n, generator=g) * 0.2
    logits = torch.randn(t, e, generator=g)
    if route == "one_expert":  # every token's first choice is the last expert
        logits[:, -1] += 100.0
    elif route == "few_experts":  # most experts get no token
        logits[:, : max(1, e - k - 1)] -= 100.0
    weights, ids = topk_softmax_torch(logits, k, True)
    return x, w13, w2, logits, weights, ids


def test_reference_router_and_experts_are_the_dense_math():
    x, w13, w2, logits, weights, ids = _case(19, 8, 2, 24, 10, 0)
    p = torch.softmax(logits, -1)
    top = torch.topk(p, 2, dim=-1)
    assert torch.equal(ids.long(), top.indices)
    torch.testing.assert_close(weights, top.values / top.values.sum(-1, keepdim=True))
    torch.testing.assert_close(fused_experts_torch(x, w13, w2, weights, ids), _dense(x, w13, w2, weights, ids))


def test_router_ties_go_to_the_lower_expert():
    logits = torch.tensor([[1.0, 3.0, 3.0, 1.0, 3.0], [0.0] * 5])
    assert topk_softmax_torch(logits, 3, True)[1].tolist() == [[1, 2, 4], [0, 1, 2]]


@given(t=st.integers(0, 50), e=st.integers(1, 20), k=st.integers(1, 4), block=st.sampled_from([1, 4, 16, 64]),
       seed=st.integers(0, 99))
@SETTINGS
def test_align_equals_the_loop_reference(t, e, k, block, seed):
    k = min(k, e)
    ids = torch.stack([torch.randperm(e, generator=torch.Generator().manual_seed(seed + i))[:k] for i in range(t)]) \
        if t else torch.empty(0, k, dtype=torch.long)
    sorted_ids, expert_ids, num_post = moe_align_block_size(ids.to(torch.int32), block, e)
    ref_sorted, ref_experts, ref_post = moe_align_block_size_reference(ids, block, e)
    n = int(num_post.item())
    assert n == ref_post and sorted_ids[:n].tolist() == ref_sorted
    assert expert_ids[: n // block].tolist() == ref_experts and (expert_ids[n // block:] == -1).all()
    assert (sorted_ids[n:] == t * k).all() and sorted_ids.numel() % block == 0


# ----------------------------------------------------------------------------- the kernels, interpreted
@given(t=st.integers(1, 40), e=st.integers(1, 130), k=st.integers(1, 8), seed=st.integers(0, 99),
       renorm=st.booleans())
@SETTINGS
def test_interpreted_topk_softmax_equals_the_reference(t, e, k, seed, renorm):
    pytest.importorskip("triton")
    from sgl_kernel.testing import interpreted

    k = min(k, e)
    logits = torch.randn(t, e, generator=torch.Generator().manual_seed(seed))
    logits[0, : min(e, 3)] = 0.5  # a tie
    with interpreted(KERNEL_MODULE) as mod:
        w, ids = mod.topk_softmax_triton(logits, k, renorm)
    rw, rids = topk_softmax_torch(logits, k, renorm)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, rtol=1e-6, atol=1e-7)


@given(t=st.integers(1, 24), e=st.integers(1, 12), k=st.integers(1, 4), h=st.integers(1, 70), n=st.integers(1, 40),
       route=st.sampled_from(["random", "one_expert", "few_experts"]), seed=st.integers(0, 99))
@SETTINGS
def test_interpreted_fused_experts_equal_the_reference(t, e, k, h, n, route, seed):
    pytest.importorskip("triton")
    from sgl_kernel.testing import interpreted

    k = min(k, e)
    x, w13, w2, _, weights, ids = _case(t, e, k, h, n, seed, route)
    with interpreted(KERNEL_MODULE):
        out = fused_experts(x, w13, w2, weights, ids, backend="triton")
    ref = fused_experts_torch(x, w13, w2, weights, ids)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * max(1.0, ref.abs().max().item()))


def _remote(ids, weights, e, keep):
    """Expert parallelism: this rank holds experts [0, keep); the others' ids -1, their weights 0."""
    mine = ids < keep
    return torch.where(mine, ids, -1).to(torch.int32), torch.where(mine, weights, 0.0), slice(0, keep)


@pytest.mark.parametrize("t,e,k,keep,block", [(9, 8, 2, 4, 4), (1, 8, 2, 4, 16), (7, 6, 3, 2, 1)])
def test_align_sends_other_ranks_ids_past_the_last_block(t, e, k, keep, block):
    g = torch.Generator().manual_seed(t)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    local, _, _ = _remote(ids, torch.ones(t, k), e, keep)
    sorted_ids, expert_ids, num_post = moe_align_block_size(local, block, keep)
    ref_sorted, ref_experts, ref_post = moe_align_block_size_reference(local, block, keep)
    n = int(num_post.item())
    assert n == ref_post and sorted_ids[:n].tolist() == ref_sorted
    assert expert_ids[: n // block].tolist() == ref_experts and (expert_ids[n // block:] == -1).all()


@pytest.mark.parametrize("t,e,k,keep", [(11, 8, 2, 4), (5, 6, 3, 3), (3, 4, 2, 1)])
def test_interpreted_fused_experts_skip_other_ranks_experts(t, e, k, keep):
    """ids -1 (experts on other ranks): the kernel and the torch path both leave them out; the rank's
    output equals the dense math over its own experts."""
    pytest.importorskip("triton")
    from sgl_kernel.testing import interpreted

    x, w13, w2, _, weights, ids = _case(t, e, k, 40, 24, t)
    local, w_local, mine = _remote(ids, weights, e, keep)
    ref = _dense(x, w13[mine], w2[mine], w_local, local)
    torch.testing.assert_close(fused_experts_torch(x, w13[mine], w2[mine], w_local, local), ref)
    with interpreted(KERNEL_MODULE):
        out = fused_experts(x, w13[mine], w2[mine], w_local, local, backend="triton", has_remote=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _fp8_experts(e, h, n, block13, block2, seed):
    """Per-expert block-FP8 weights at the layer's scale granularity (rows of gate_up per block13[0])."""
    from sgl_kernel.quantization import quantize_weight_block_fp8

    g = torch.Generator().manual_seed(seed)
    q13, s13, q2, s2 = [], [], [], []
    for _ in range(e):
        q, s = quantize_weight_block_fp8(torch.randn(2 * n, h, generator=g) * 0.2, block13)
        q13.append(q), s13.append(s)
        q, s = quantize_weight_block_fp8(torch.randn(h, n, generator=g) * 0.2, block2)
        q2.append(q), s2.append(s)
    return [torch.stack(t) for t in (q13, s13, q2, s2)]


@pytest.mark.parametrize("t,e,k,h,n,block13,block2,keep", [
    (7, 8, 2, 64, 48, (16, 128), (128, 128), 8),  # qwen3-vl-moe-tiny's widths
    (5, 6, 3, 160, 64, (64, 128), (128, 32), 6),  # H past one 128 block; down on a 32-column grid (a TP shard)
    (9, 8, 2, 64, 48, (16, 128), (128, 16), 4),  # expert parallelism: ids of experts 4..7 are -1
])
def test_interpreted_fp8_fused_experts_equal_the_torch_path(t, e, k, h, n, block13, block2, keep):
    pytest.importorskip("triton")
    from sgl_kernel.moe import fused_experts_fp8
    from sgl_kernel.testing import interpreted

    x, _, _, _, weights, ids = _case(t, e, k, h, n, t)
    w13, s13, w2, s2 = _fp8_experts(e, h, n, block13, block2, t)
    ids, weights, mine = _remote(ids, weights, e, keep)
    args = (x, w13[mine], s13[mine], w2[mine], s2[mine], weights, ids, block13, block2)
    ref = fused_experts_fp8(*args, backend="torch")
    with interpreted(KERNEL_MODULE):
        out = fused_experts_fp8(*args, backend="triton", has_remote=keep < e)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def test_interpreted_one_token_and_no_token():
    pytest.importorskip("triton")
    from sgl_kernel.testing import interpreted

    x, w13, w2, logits, weights, ids = _case(1, 16, 4, 48, 32, 5)
    with interpreted(KERNEL_MODULE) as mod:
        w_k, ids_k = mod.topk_softmax_triton(logits, 4, True)
        out = fused_experts(x, w13, w2, w_k, ids_k, backend="triton")
        empty = fused_experts(x[:0], w13, w2, weights[:0], ids[:0], backend="triton")
    torch.testing.assert_close(out, fused_experts_torch(x, w13, w2, weights, ids), rtol=1e-5, atol=1e-5)
    assert empty.shape == (0, 48)


def test_auto_takes_the_torch_path_for_cpu_tensors_and_refuses_bad_shapes():
    x, w13, w2, logits, weights, ids = _case(3, 4, 2, 8, 6, 1)
    assert torch.equal(fused_experts(x, w13, w2, weights, ids), fused_experts_torch(x, w13, w2, weights, ids))
    assert torch.equal(topk_softmax(logits, 2, True)[1], ids)
    with pytest.raises(ValueError, match="do not fit"):
        fused_experts(x, w13, w2[:, :, :5], weights, ids)
    with pytest.raises(ValueError, match="top_k"):
        topk_softmax(logits, 5, True)


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 7, 64, 600])
@pytest.mark.parametrize("e,k,h,n", [(128, 8, 2048, 96), (128, 8, 2048, 768), (8, 2, 64, 48)])
def test_cuda_kernels_equal_the_reference(t, e, k, h, n):
    pytest.importorskip("triton")
    x, w13, w2, logits, _, _ = _case(t, e, k, h, n, t)
    x, w13, w2, logits = (v.cuda().to(torch.bfloat16) for v in (x, w13, w2, logits))
    w, ids = topk_softmax(logits, k, True)
    rw, rids = topk_softmax_torch(logits, k, True)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-6)
    out = fused_experts(x, w13, w2, w, ids)
    ref = fused_experts_torch(x.float(), w13.float(), w2.float(), w, ids)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 64, 600])
@pytest.mark.parametrize("e,k,h,n,block2,keep", [(128, 8, 2048, 768, (128, 128), 128), (128, 8, 2048, 96, (128, 32), 64),
                                                 (8, 2, 64, 48, (128, 16), 4)])
def test_cuda_fp8_and_ep_kernels_equal_the_torch_path(t, e, k, h, n, block2, keep):
    """Block-FP8 experts (bf16 activations) through the fused kernel against the torch w8a8 path, with
    expert-parallel ids -1 when keep < e; the bf16 kernel with the same ids against its reference."""
    from math import gcd

    pytest.importorskip("triton")
    from sgl_kernel.moe import fused_experts_fp8

    block13 = (gcd(128, n), 128)
    x, w13f, w2f, _, weights, ids = _case(t, e, k, h, n, t)
    ids, weights, mine = _remote(ids, weights, e, keep)
    w13, s13, w2, s2 = (v[mine].cuda() for v in _fp8_experts(e, h, n, block13, block2, t))
    x, weights, ids = x.cuda().to(torch.bfloat16), weights.cuda(), ids.cuda()
    out = fused_experts_fp8(x, w13, s13, w2, s2, weights, ids, block13, block2, has_remote=keep < e)
    ref = fused_experts_fp8(x.float(), w13, s13, w2, s2, weights, ids, block13, block2, backend="torch")
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2 * ref.abs().max().item())
    wb13, wb2 = w13f[mine].cuda().to(torch.bfloat16), w2f[mine].cuda().to(torch.bfloat16)
    out = fused_experts(x, wb13, wb2, weights, ids, has_remote=keep < e)
    ref = fused_experts_torch(x.float(), wb13.float(), wb2.float(), weights, ids)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
