"""The Gated DeltaNet layer's kernel path (fla/pooled.py: sgl_kernel.gdn's Triton kernels, interpreted on CPU)
against its per-request torch path: a mixed EXTEND batch (a fresh prefill with snapshot captures, a chunked
continuation from a non-zero state with a capture at its end, a one-token extend), then a decode step; the
same outputs and the same pool afterwards (rows and snapshot slots), float32. The plan's cuts and the
backend switch are checked without kernels."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch

from sglang.srt.configs.qwen3_5_config import HybridAttentionConfig
from sglang.srt.layers.attention.fla import pooled
from sglang.srt.layers.attention.fla.gated_delta_net import GatedDeltaNet
from sglang.srt.mem_cache.state_pool import GDNStatePool

HIDDEN, LAYERS, LAYER = 32, 2, 1  # the layer under test is the pool's second: its views are strided
CFG = HybridAttentionConfig(layer_types=("linear_attention",), linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, rotary_dim=8)
ROWS, SNAPS = 4, 4
# EXTEND: (row, new tokens, captures (k, snapshot slot)); row 0 starts fresh, rows 1 and 2 carry a state
BATCH = [(2, 40, [(12, 4), (32, 5)]), (0, 20, [(20, 6)]), (3, 1, [])]


def _layer() -> GatedDeltaNet:
    torch.manual_seed(0)
    net = GatedDeltaNet(HIDDEN, CFG, chunk_size=16)  # 16-token chunks: 40 tokens cross two chunk edges
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "weight" in name else 0.5))
    return net


def _pool() -> GDNStatePool:
    shape = _layer().state_shape(LAYERS, torch.float32)
    pool = GDNStatePool(shape, ROWS, "cpu", SNAPS)
    g = torch.Generator().manual_seed(3)
    pool.conv.copy_(torch.randn(pool.conv.shape, generator=g))
    pool.recurrent.copy_(torch.randn(pool.recurrent.shape, generator=g) * 0.1)
    pool.conv[2].zero_()  # the fresh prefill
    pool.recurrent[2].zero_()
    return pool


def _torch_step(net, pool, x, batch):
    states = [pool.state(r).layer(LAYER) for r, _, _ in batch]
    caps = [[(k, pool.state(s).layer(LAYER)) for k, s in c] for _, _, c in batch]
    with torch.no_grad():
        return net(x, [n for _, n, _ in batch], states, caps)


def _kernel_step(net, pool, x, batch):
    plan = pooled.plan_kernel_batch(pool.conv, pool.recurrent, [r for r, _, _ in batch], [n for _, n, _ in batch],
                                    [c for _, _, c in batch])
    with torch.no_grad():
        return net(x, [n for _, n, _ in batch], plan.layer(LAYER)), plan


KERNEL_MODULES = ("sgl_kernel.gdn._conv_triton", "sgl_kernel.gdn._chunk_triton", "sgl_kernel.gdn._recurrent_triton")


@contextlib.contextmanager
def interpreted_gdn():
    """The three GDN kernel modules imported interpreted (sgl_kernel.testing.interpreted) for the block."""
    from sgl_kernel.testing import interpreted

    with contextlib.ExitStack() as stack:
        for name in KERNEL_MODULES:
            stack.enter_context(interpreted(name))
        yield


@pytest.fixture
def interpret():
    pytest.importorskip("triton")
    pytest.importorskip("sgl_kernel.gdn")
    with interpreted_gdn():
        yield


def _counting(monkeypatch):
    """Counts the calls of each sgl_kernel.gdn entry (the kernel path imports them from the package)."""
    import sgl_kernel.gdn as gdn

    calls = {}
    for name in ("causal_conv1d_fwd", "causal_conv1d_update", "chunk_gated_delta_rule_fwd",
                 "recurrent_gated_delta_rule_update"):
        def wrap(*a, _f=getattr(gdn, name), _n=name, **kw):
            assert kw.get("backend") == "triton"
            calls[_n] = calls.get(_n, 0) + 1
            return _f(*a, **kw)
        monkeypatch.setattr(gdn, name, wrap)
    return calls


def test_kernel_path_equals_torch_path_extend_with_captures_then_decode(interpret, monkeypatch):
    net = _layer()
    ref_pool, pool = _pool(), _pool()
    calls = _counting(monkeypatch)
    x = torch.randn(sum(n for _, n, _ in BATCH), HIDDEN, generator=torch.Generator().manual_seed(5))
    want = _torch_step(net, ref_pool, x, BATCH)
    got, plan = _kernel_step(net, pool, x, BATCH)
    # cuts: row 2 at 12, 32, 40; row 0 at 20 (its end); row 3 at 1: three rounds, one call of each op per round
    assert len(plan.rounds) == 3 and not plan.decode
    assert calls == {"causal_conv1d_fwd": 3, "chunk_gated_delta_rule_fwd": 3}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool.recurrent, ref_pool.recurrent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool.conv, ref_pool.conv, rtol=0, atol=0)  # conv states are copies of inputs
    assert pool.recurrent[4:7, LAYER].abs().sum(dim=(1, 2, 3)).min() > 0  # the three snapshots were written
    assert torch.equal(pool.recurrent[7], ref_pool.recurrent[7])  # an untouched snapshot slot stays

    calls.clear()
    decode = [(r, 1, []) for r, _, _ in BATCH]
    x = torch.randn(len(decode), HIDDEN, generator=torch.Generator().manual_seed(6))
    want = _torch_step(net, ref_pool, x, decode)
    got, plan = _kernel_step(net, pool, x, decode)
    assert plan.decode and calls == {"causal_conv1d_update": 1, "recurrent_gated_delta_rule_update": 1}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool.recurrent, ref_pool.recurrent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool.conv, ref_pool.conv, rtol=0, atol=0)


def test_one_round_without_captures_uses_the_rows_in_place(interpret, monkeypatch):
    net = _layer()
    ref_pool, pool = _pool(), _pool()
    batch = [(r, n, []) for r, n, _ in BATCH]
    calls = _counting(monkeypatch)
    x = torch.randn(sum(n for _, n, _ in batch), HIDDEN, generator=torch.Generator().manual_seed(7))
    want = _torch_step(net, ref_pool, x, batch)
    got, plan = _kernel_step(net, pool, x, batch)
    assert len(plan.rounds) == 1 and plan.rounds[0].tokens is None and calls["chunk_gated_delta_rule_fwd"] == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool.recurrent, ref_pool.recurrent, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- the plan, no kernels


def test_plan_cuts_requests_at_their_capture_points():
    conv, rec = torch.zeros(8, 1, 3, 2), torch.zeros(8, 1, 1, 2, 2)
    plan = pooled.plan_kernel_batch(conv, rec, [5, 1], [6, 4], [[(2, 6), (9, 7)], [(4, 3)]])
    # request 0: pieces [0, 2) [2, 6) (the capture at 9 is past its tokens: dropped, as the torch path does)
    first, second = plan.rounds
    assert first.tokens.tolist() == [0, 1, 6, 7, 8, 9] and first.cu_seqlens.tolist() == [0, 2, 6]
    assert first.slots.tolist() == [5, 1]
    assert first.capture_src.tolist() == [5, 1] and first.capture_dst.tolist() == [6, 3]
    assert second.tokens.tolist() == [2, 3, 4, 5] and second.cu_seqlens.tolist() == [0, 4]
    assert second.slots.tolist() == [5] and second.capture_src is None
    assert plan.slots.tolist() == [5, 1] and not plan.decode
    assert pooled.piece_bounds(5, []) == [0, 5] and pooled.piece_bounds(5, [(5, 1), (0, 2)]) == [0, 5]


def test_plan_reuses_the_batch_tensors_and_detects_decode():
    conv, rec = torch.zeros(8, 1, 3, 2), torch.zeros(8, 1, 1, 2, 2)
    slots, indptr = torch.tensor([3, 0]), torch.tensor([0, 1, 2])
    plan = pooled.plan_kernel_batch(conv, rec, [3, 0], [1, 1], None, slots, indptr)
    assert plan.decode and plan.slots is slots and plan.rounds[0].cu_seqlens is indptr
    captured = pooled.plan_kernel_batch(conv, rec, [3, 0], [1, 1], [[(1, 4)], []])
    assert not captured.decode and len(captured.rounds) == 1  # a capture: the varlen kernels, then the copy
    assert captured.rounds[0].tokens is None and captured.rounds[0].capture_dst.tolist() == [4]
    built = pooled.plan_kernel_batch(conv, rec, [3, 0], [2, 5], [])
    assert built.slots.tolist() == [3, 0] and built.rounds[0].cu_seqlens.tolist() == [0, 2, 7] and not built.decode


def test_backend_switch():
    cpu = torch.device("cpu")
    assert not pooled.uses_kernels("auto", cpu) and not pooled.uses_kernels("torch", cpu)
    assert pooled.uses_kernels("triton", cpu)
    with pytest.raises(ValueError, match="unknown Gated DeltaNet backend"):
        pooled.uses_kernels("cuda", cpu)


def test_triton_on_cpu_without_the_interpreter_is_refused(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("interpreter forced")
    net, pool = _layer(), _pool()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        _kernel_step(net, pool, torch.randn(3, HIDDEN), [(0, 3, [])])
