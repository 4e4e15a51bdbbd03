"""PenaltyState.prepare's per-step path (a known row, exactly one token appended since its last step) counts
what the general path counts: ids past the vocabulary skipped, steps that append several tokens or none, a
shorter output (rebuilt), rows without a penalty beside them; the adjusted logits equal the per-step rebuild's
at every step."""

from __future__ import annotations

import random

import torch

from sglang.srt.sampling.penalties import PenaltyState, RebuiltPenaltyState
from sglang.srt.sampling.sampling_params import SamplingParams

V = 53


class _Req:
    def __init__(self, rid, prompt, params):
        self.rid, self.origin_input_ids, self.sampling_params = rid, prompt, params
        self.output_ids: list[int] = []


def test_one_token_steps_and_irregular_steps_match_the_rebuild():
    rng = random.Random(3)
    g = torch.Generator().manual_seed(3)
    params = [SamplingParams(repetition_penalty=1.4, frequency_penalty=0.3), SamplingParams(),
              SamplingParams(presence_penalty=0.7)]
    reqs = [_Req(f"q{i}", [rng.randrange(V + 5) for _ in range(6)], params[i % 3]) for i in range(7)]
    state, ref = PenaltyState(V, "cpu", initial_rows=2), RebuiltPenaltyState(V, "cpu")
    for step in range(30):
        for r in reqs:
            k = 1 if step % 7 else rng.choice([0, 2, 3])  # mostly one new token; sometimes none or several
            r.output_ids += [rng.randrange(V + 4) for _ in range(k)]  # ids past the vocabulary too
        if step == 17:
            reqs[0].output_ids = reqs[0].output_ids[:3]  # shorter than counted: its row is rebuilt
        logits = torch.randn(len(reqs), V, generator=g)
        assert torch.equal(state.apply(logits, state.prepare(reqs)), ref.apply(logits, ref.prepare(reqs))), step
    assert state.rows_in_use == sum(p.has_penalty for p in (r.sampling_params for r in reqs))
