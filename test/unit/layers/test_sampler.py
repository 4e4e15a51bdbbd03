"""Batched device sampler: filters, greedy rows, seeded determinism independent of the batch, and
draws that follow the filtered distribution."""

from __future__ import annotations

import random
import re

import pytest
import torch

from sglang.srt.layers.sampler import Sampler, SamplingBatchInfo, hash_uniform
from sglang.srt.sampling.sampling_params import SamplingParams

V = 50


def info_for(params, seeds, steps, rng=None):
    return SamplingBatchInfo.from_params(params, seeds, V, "cpu", steps, rng)


def test_hash_uniform_is_a_function_of_seed_step_token_and_in_range():
    seeds = torch.tensor([1, 1, 2, -5, 2**62])
    steps = torch.tensor([0, 1, 0, 3, 7])
    u = hash_uniform(seeds, steps, 1000)
    assert u.shape == (5, 1000) and float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(hash_uniform(seeds[[3, 0]], steps[[3, 0]], 1000), u[[3, 0]])
    # roughly uniform: mean 0.5, each decile near 10%
    big = hash_uniform(torch.arange(64), torch.zeros(64, dtype=torch.int64), 4096).flatten()
    assert abs(float(big.mean()) - 0.5) < 0.01
    counts = torch.histc(big, bins=10, min=0, max=1) / big.numel()
    assert float((counts - 0.1).abs().max()) < 0.01


def test_greedy_rows_take_the_argmax_even_beside_sampled_rows():
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.5), SamplingParams(top_k=1)]
    out = Sampler(0)(logits, info_for(params, [None, 3, None], [0, 0, 0]))
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_seeded_row_does_not_depend_on_its_neighbours():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, V, generator=g)
    p = SamplingParams(temperature=1.0, top_p=0.95)
    alone = Sampler(0)(logits[2:3], info_for([p], [1234], [9]))
    batched = Sampler(99)(logits, info_for([p] * 4, [None, 7, 1234, None], [0, 1, 9, 3], random.Random(5)))
    assert int(alone[0]) == int(batched[2])


@pytest.mark.parametrize("kw,allowed", [({"top_k": 3}, 3), ({"top_p": 0.5}, None), ({"min_p": 0.2}, None)])
def test_filters_never_draw_outside_the_kept_set(kw, allowed):
    logits = torch.linspace(4, -4, V).unsqueeze(0)  # token 0 most likely, strictly decreasing
    probs = torch.softmax(logits, -1)[0]
    if allowed is None:
        if "top_p" in kw:
            allowed = int(((probs.cumsum(0) - probs) < kw["top_p"]).sum())
        else:
            allowed = int((probs >= probs[0] * kw["min_p"]).sum())
    p = SamplingParams(temperature=1.0, **kw)
    draws = {int(Sampler(0)(logits, info_for([p], [s], [0]))[0]) for s in range(300)}
    assert draws <= set(range(allowed)) and len(draws) > 1


def test_draws_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * (V - 4)]))
    p = SamplingParams(temperature=1.0)
    n = 4000
    info = info_for([p] * n, list(range(n)), [0] * n)
    out = Sampler(0)(logits.expand(n, V).contiguous(), info)
    freq = torch.bincount(out, minlength=V)[:4].float() / n
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03), freq


def test_unseeded_rows_follow_the_sampler_seed():
    logits = torch.zeros(8, V)
    p = [SamplingParams(temperature=1.0)] * 8
    a = Sampler(0)(logits, info_for(p, [None] * 8, [0] * 8, random.Random(11)))
    b = Sampler(0)(logits, info_for(p, [None] * 8, [0] * 8, random.Random(11)))
    c = Sampler(0)(logits, info_for(p, [None] * 8, [0] * 8, random.Random(12)))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_min_new_tokens_bans_stop_tokens_only_below_the_minimum():
    from sglang.srt.layers.sampler import adjust_logits, banned_tokens

    params = [SamplingParams(min_new_tokens=3, stop_token_ids=[7]), SamplingParams(min_new_tokens=1)]
    banned = banned_tokens(params, [[1, 2], [5]], eos_ids=[9], device="cpu")
    info = info_for([SamplingParams(temperature=0.0)] * 2, [None, None], [0, 0])
    info.banned = banned
    logits = adjust_logits(torch.zeros(2, V), info)
    assert logits[0, 9] == float("-inf") and logits[0, 7] == float("-inf")
    assert torch.isfinite(logits[1]).all()  # already at its minimum


def test_logit_bias_adds_per_row_and_can_force_or_forbid_a_token():
    from sglang.srt.layers.sampler import adjust_logits, logit_bias_entries

    params = [SamplingParams(temperature=0.0, logit_bias={3: 100.0}), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, logit_bias={0: -100.0, 5: 1.5})]
    for p in params:
        p.verify()
    info = info_for(params, [None] * 3, [0] * 3)
    info.logit_bias = logit_bias_entries(params, "cpu")
    logits = torch.zeros(3, V)
    logits[:, 0] = 5.0  # every row's favourite without a bias
    adjusted = adjust_logits(logits, info)
    assert adjusted[0, 3] == 100.0 and adjusted[1].equal(logits[1]) and adjusted[2, 0] == -95.0 and adjusted[2, 5] == 1.5
    assert logits[0, 3] == 0.0  # the model's logits are not modified in place
    assert Sampler(0)(adjusted, info).tolist() == [3, 0, 5]
    assert logit_bias_entries([SamplingParams()], "cpu") is None


@pytest.mark.parametrize("bias, word", [({"x": 1.0}, "token ids"), ({"-3": 1.0}, "non-negative"),
                                        ({"1": 101.0}, "[-100, 100]"), ({"1": "a"}, "numbers"), ([1], "object")])
def test_logit_bias_is_validated(bias, word):
    from sglang.srt.sampling.sampling_params import SamplingParamsError

    with pytest.raises(SamplingParamsError, match=re.escape(word)):
        SamplingParams(logit_bias=bias).verify()
    p = SamplingParams(logit_bias={"12": 2})
    p.verify()
    assert p.logit_bias == {12: 2.0}
