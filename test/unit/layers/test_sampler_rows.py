"""SamplingBatchInfo from per-request rows (`sampling_row`, kept on the request by the worker) equals the
per-request construction it replaced, field for field, and draws the unseeded rows' seeds from the host RNG
in the same order (the server's draws after it are unchanged too); a row's flags are the worker's former
per-request tests (penalty, min_new_tokens ban, logit_bias, logprobs)."""

from __future__ import annotations

import random

import pytest
import torch

from sglang.srt.layers.sampler import SamplingBatchInfo, row_columns, sampling_row
from sglang.srt.sampling.sampling_params import SamplingParams

V = 1000


def _reference(params, seeds, vocab_size, steps, rng):
    """from_params before the rows (commit c960a84)."""
    temps = [0.0 if p.is_greedy else float(p.temperature) for p in params]
    top_ks = [vocab_size if p.top_k < 1 else min(p.top_k, vocab_size) for p in params]
    floats = torch.tensor([temps, [float(p.top_p) for p in params], [float(p.min_p) for p in params]],
                          dtype=torch.float32)
    row_seeds = [s if s is not None else rng.getrandbits(63) for s in seeds]
    sort_ks = [k for k, p, t in zip(top_ks, params, temps) if t > 0.0 and (k < vocab_size or p.top_p < 1.0)]
    ints = torch.tensor([top_ks, row_seeds, list(steps)], dtype=torch.int64)
    return dict(temperatures=floats[0].unsqueeze(1), top_ps=floats[1], min_ps=floats[2], top_ks=ints[0],
                seeds=ints[1], steps=ints[2], all_greedy=all(t == 0.0 for t in temps),
                need_filter=any(k < vocab_size or p.top_p < 1.0 or p.min_p > 0.0 for k, p in zip(top_ks, params)),
                need_sort=any(sort_ks), max_top_k=max(sort_ks) if sort_ks else None)


def _random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(temperature=rng.choice([0.0, 0.0, 0.7, 1.0, 1.3]), top_k=rng.choice([-1, -1, 1, 5, V, 5000]),
                          top_p=rng.choice([1.0, 1.0, 0.9, 0.5]), min_p=rng.choice([0.0, 0.0, 0.05]),
                          seed=rng.choice([None, None, rng.randrange(1 << 40)]),
                          frequency_penalty=rng.choice([0.0, 0.0, 0.5]))


def _same(info: SamplingBatchInfo, ref: dict) -> None:
    for name, want in ref.items():
        got = getattr(info, name)
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and torch.equal(got, want), name
        else:
            assert got == want, name


@pytest.mark.parametrize("seed", range(20))
def test_rows_give_the_batch_info_and_draws_of_the_per_request_construction(seed):
    rng = random.Random(seed)
    b = rng.randrange(0, 24)
    params = [_random_params(rng) for _ in range(b)]
    steps = [rng.randrange(0, 300) for _ in range(b)]
    new_rng, old_rng = random.Random(seed), random.Random(seed)
    ref = _reference(params, [p.seed for p in params], V, steps, old_rng)
    rows = [sampling_row(p, V) for p in params]
    _same(SamplingBatchInfo.from_columns(row_columns(rows), "cpu", steps, new_rng), ref)
    assert new_rng.getrandbits(63) == old_rng.getrandbits(63)  # the same number of draws, in order
    # from_params with seeds given apart from the params (tests and benches pass them so)
    seeds = [rng.choice([None, 7]) for _ in range(b)]
    new_rng, old_rng = random.Random(seed), random.Random(seed)
    _same(SamplingBatchInfo.from_params(params, seeds, V, "cpu", steps, new_rng),
          _reference(params, seeds, V, steps, old_rng))
    assert new_rng.getrandbits(63) == old_rng.getrandbits(63)


def test_a_row_holds_what_the_worker_needs_from_the_params_alone():
    row = sampling_row(SamplingParams(temperature=0.5, top_k=40, seed=9, presence_penalty=0.2), V)
    assert row == (0.5, 1.0, 0.0, 40, 9, True, 40, True, False, False, False)
    assert sampling_row(SamplingParams(temperature=0.0, top_p=0.5), V) == (0.0, 0.5, 0.0, V, None, True, 0, False,
                                                                          False, False, False)
    flags = sampling_row(SamplingParams(min_new_tokens=2, max_new_tokens=4, logit_bias={3: 1.0}, top_logprobs_num=2),
                         V)[7:]
    assert flags == (False, True, True, True)
    assert sampling_row(SamplingParams(logit_bias={}, return_logprob=True), V)[7:] == (False, False, False, True)
    assert row_columns([]) == ((),) * len(row)
