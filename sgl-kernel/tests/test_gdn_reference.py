"""The Gated DeltaNet torch references (`sgl_kernel.gdn.*_torch`, also the CPU path) against per-token oracles
(gdn_inputs.py), their state-pool semantics, and the argument checks of the public ops. No triton needed."""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_inputs import close, conv_case, conv_oracle, cu_of, delta_rule_case, delta_rule_oracle
from sgl_kernel.gdn import (
    causal_conv1d_fwd,
    causal_conv1d_fwd_torch,
    causal_conv1d_update,
    causal_conv1d_update_torch,
    chunk_gated_delta_rule_fwd,
    chunk_gated_delta_rule_torch,
    recurrent_gated_delta_rule_update,
    recurrent_gated_delta_rule_update_torch,
)

SETTINGS = settings(max_examples=20, deadline=None, database=None, derandomize=True)


@given(lens=st.lists(st.integers(0, 40), min_size=1, max_size=3), hk=st.integers(1, 2),
       group=st.sampled_from([1, 2, 3]),
       chunk=st.sampled_from([16, 32, 64]), decay=st.sampled_from([0.05, 1.0, 8.0]), seed=st.integers(0, 999))
@SETTINGS
def test_chunk_reference_equals_the_token_loop(lens, hk, group, chunk, decay, seed):
    q, k, v, g, beta, cu, pool, slots = delta_rule_case(lens, hk, group, 12, 8, seed, decay=decay)
    want_pool = pool.clone()
    want = delta_rule_oracle(q, k, v, g, beta, cu, want_pool, slots)
    untouched = [i for i in range(pool.shape[0]) if i not in slots.tolist()]
    before = pool[untouched].clone()
    got = chunk_gated_delta_rule_torch(q, k, v, g, beta, cu, pool, slots, chunk_size=chunk)
    close(got, want)
    close(pool, want_pool)
    assert torch.equal(pool[untouched], before)


def test_recurrent_reference_equals_the_token_loop_and_skips_padded_rows():
    q, k, v, g, beta, _, pool, _ = delta_rule_case([1] * 5, 2, 2, 16, 8, 3, num_slots=6)
    slots = torch.tensor([4, -1, 0, 2, -1], dtype=torch.int32)
    want_pool = pool.clone()
    live = slots >= 0
    want = delta_rule_oracle(q[live], k[live], v[live], g[live], beta[live], cu_of([1] * 3), want_pool, slots[live])
    got = recurrent_gated_delta_rule_update_torch(q, k, v, g, beta, pool, slots)
    close(got[live], want)
    assert torch.equal(got[~live], torch.zeros_like(got[~live]))
    close(pool, want_pool)


def test_prefill_then_decode_steps_equal_one_prefill():
    """The state written by a prefill is the one the decode step continues from (and vice versa)."""
    q, k, v, g, beta, _, pool, _ = delta_rule_case([37], 1, 2, 16, 16, 5, num_slots=2)
    slots = torch.tensor([1], dtype=torch.int32)
    one = pool.clone()
    want = chunk_gated_delta_rule_torch(q, k, v, g, beta, cu_of([37]), one, slots, chunk_size=16)
    got = torch.empty_like(want)
    got[:30] = chunk_gated_delta_rule_torch(q[:30], k[:30], v[:30], g[:30], beta[:30], cu_of([30]), pool, slots)
    for t in range(30, 37):
        got[t:t + 1] = recurrent_gated_delta_rule_update_torch(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                                               beta[t:t + 1], pool, slots)
    close(got, want)
    close(pool, one)


def test_scale_is_applied_to_q():
    q, k, v, g, beta, cu, pool, slots = delta_rule_case([9], 1, 1, 16, 8, 7)
    a = chunk_gated_delta_rule_torch(q, k, v, g, beta, cu, pool.clone(), slots)
    b = chunk_gated_delta_rule_torch(q, k, v, g, beta, cu, pool.clone(), slots, scale=2 * 16 ** -0.5)
    close(b, 2 * a)


@given(lens=st.lists(st.integers(0, 12), min_size=1, max_size=4), kw=st.integers(2, 5), bias=st.booleans(),
       act=st.sampled_from(["silu", None]), seed=st.integers(0, 999))
@SETTINGS
def test_conv_reference_equals_the_per_token_loop(lens, kw, bias, act, seed):
    x, w, b, cu, pool, slots = conv_case(lens, 6, kw, seed, bias=bias)
    slots[0] = -1 if seed % 3 == 0 else slots[0]  # no state: zeros in, nothing written
    want_pool = pool.clone()
    want = conv_oracle(x, w, b, cu, want_pool, slots, act)
    got = causal_conv1d_fwd_torch(x, w, b, pool, slots, cu, activation=act)
    close(got, want)
    close(pool, want_pool)


def test_conv_update_equals_a_one_token_prefill_and_skips_padded_rows():
    x, w, b, _, pool, _ = conv_case([1, 1, 1], 10, 4, 11, num_slots=5)
    slots = torch.tensor([3, -1, 0], dtype=torch.int32)
    want_pool = pool.clone()
    want = causal_conv1d_fwd_torch(x, w, b, want_pool, slots, cu_of([1, 1, 1]))
    got = causal_conv1d_update_torch(x, w, b, pool, slots)
    close(got[[0, 2]], want[[0, 2]])
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    close(pool, want_pool)


def test_auto_takes_the_torch_path_on_cpu_and_argument_checks_refuse():
    q, k, v, g, beta, cu, pool, slots = delta_rule_case([5, 3], 1, 2, 8, 8, 1)
    a, b = pool.clone(), pool.clone()
    torch.testing.assert_close(chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu, a, slots),
                               chunk_gated_delta_rule_torch(q, k, v, g, beta, cu, b, slots))
    q2, k2 = torch.cat([q, q], 1), torch.cat([k, k], 1)  # 2 key heads for 2 value heads: fine; for 3: not
    chunk_gated_delta_rule_fwd(q2, k2, v, g, beta, cu, pool.clone(), slots)
    v3, g3 = torch.cat([v, v[:, :1]], 1), torch.cat([g, g[:, :1]], 1)
    with pytest.raises(ValueError, match="multiple of key heads"):
        chunk_gated_delta_rule_fwd(q2, k2, v3, g3, g3, cu, pool, slots)
    with pytest.raises(ValueError, match="float32"):
        chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu, pool.double(), slots)
    with pytest.raises(ValueError, match="cu_seqlens"):
        chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu[:-1], pool, slots)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu, pool, slots, chunk_size=48)
    with pytest.raises(ValueError, match="state indices"):
        recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, slots)
    x, w, bias, cu, cpool, cslots = conv_case([2, 1], 4, 4, 0)
    with pytest.raises(ValueError, match="K-1"):
        causal_conv1d_fwd(x, w, bias, cpool[..., :2], cslots, cu)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d_update(x[:2], w, bias, cpool, cslots, activation="gelu")
    if os.environ.get("TRITON_INTERPRET") != "1":  # the Triton path on CPU tensors needs the interpreter
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            causal_conv1d_update(x[:2], w, bias, cpool, cslots, backend="triton")
