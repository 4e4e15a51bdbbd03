"""The Gated DeltaNet reference ops: the chunked (prefill) and recurrent (decode) forms agree with each
other and with transformers' torch paths, the state carries across calls, and the causal conv with its
state equals a one-shot zero-padded conv."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.fla.ops import (
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
)

hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

HK, HV, DK, DV = 2, 4, 16, 8  # two value heads per key head, as the releases group them (16 : 32 / 48)


def _inputs(t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(t, HK, DK, generator=g) for _ in range(2))
    v = torch.randn(t, HV, DV, generator=g)
    decay = -F.softplus(torch.randn(t, HV, generator=g) * 2)  # log decay <= 0, some strong
    beta = torch.rand(t, HV, generator=g)
    state = torch.randn(HV, DK, DV, generator=g) * 0.5
    return q, k, v, decay, beta, state


def _close(a, b, tol=1e-5):
    assert torch.allclose(a, b, rtol=tol, atol=tol), (a - b).abs().max().item()


@pytest.mark.parametrize("t", [1, 5, 64, 150])
def test_chunked_equals_recurrent(t):
    q, k, v, g, beta, s0 = _inputs(t)
    o_r, s_r = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    o_c, s_c = chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=32)
    _close(o_c, o_r)
    _close(s_c, s_r)


@pytest.mark.parametrize("t", [3, 150])
def test_matches_transformers_torch_paths(t):
    q, k, v, g, beta, s0 = _inputs(t, seed=1)
    args = [x.unsqueeze(0) for x in (q, k, v)]
    ref_c, ref_sc = hf.torch_chunk_gated_delta_rule(*args, g=g[None], beta=beta[None], initial_state=s0[None],
                                                     output_final_state=True, use_qk_l2norm_in_kernel=True)
    ref_r, ref_sr = hf.torch_recurrent_gated_delta_rule(*args, g=g[None], beta=beta[None], initial_state=s0[None],
                                                         output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_c, s_c = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    o_r, s_r = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    _close(o_c, ref_c[0])
    _close(s_c, ref_sc[0])
    _close(o_r, ref_r[0])
    _close(s_r, ref_sr[0])


def test_state_carries_across_chunks_and_steps():
    q, k, v, g, beta, s0 = _inputs(100, seed=2)
    whole, s_whole = chunk_gated_delta_rule(q, k, v, g, beta, s0)
    first, s = chunk_gated_delta_rule(q[:70], k[:70], v[:70], g[:70], beta[:70], s0)
    parts = [first]
    second, s = chunk_gated_delta_rule(q[70:97], k[70:97], v[70:97], g[70:97], beta[70:97], s)
    parts.append(second)
    for i in range(97, 100):  # then decode steps
        o, s = recurrent_gated_delta_rule(q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1], s)
        parts.append(o)
    _close(torch.cat(parts), whole)
    _close(s, s_whole)


def test_inputs_are_not_modified():
    q, k, v, g, beta, s0 = _inputs(10)
    before = s0.clone()
    chunk_gated_delta_rule(q, k, v, g, beta, s0)
    recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    assert torch.equal(s0, before)


C, K = 12, 4


def _conv_inputs(t: int):
    g = torch.Generator().manual_seed(3)
    return torch.randn(t, C, generator=g), torch.randn(C, 1, K, generator=g)


@pytest.mark.parametrize("t", [1, 2, 9])
def test_conv_from_zero_state_matches_transformers(t):
    x, w = _conv_inputs(t)
    ours, state = causal_conv1d(x, w, torch.zeros(C, K - 1))
    ref = hf.causal_conv1d_fn(x.t()[None], w.squeeze(1), None, activation="silu")[0].t()
    _close(ours, ref)
    # the state is the last K-1 inputs, zeros first when fewer arrived
    want = torch.cat([torch.zeros(C, K - 1), x.t()], dim=1)[:, -(K - 1):]
    assert torch.equal(state, want)


def test_conv_split_and_decode_steps_equal_one_shot():
    x, w = _conv_inputs(11)
    whole, s_whole = causal_conv1d(x, w, torch.zeros(C, K - 1))
    a, s = causal_conv1d(x[:2], w, torch.zeros(C, K - 1))  # shorter than the kernel
    b, s = causal_conv1d(x[2:8], w, s)
    steps = []
    for i in range(8, 11):
        y, s = causal_conv1d_update(x[i:i + 1], w, s)
        steps.append(y)
    _close(torch.cat([a, b, *steps]), whole)
    assert torch.equal(s, s_whole)


def test_conv_update_equals_conv_for_one_token():
    x, w = _conv_inputs(1)
    s0 = torch.randn(C, K - 1)
    y1, s1 = causal_conv1d(x, w, s0)
    y2, s2 = causal_conv1d_update(x, w, s0)
    _close(y1, y2)
    assert torch.equal(s1, s2)
