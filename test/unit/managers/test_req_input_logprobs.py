"""Prompt-logprob bookkeeping on a scheduler Req: which positions a chunk scores, and how much of the
prompt the prefix cache may serve while prompt logprobs are owed."""

from __future__ import annotations

import pytest

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.sampling.sampling_params import SamplingParams

PROMPT = list(range(100, 110))  # 10 tokens


def _req(start: int, return_logprob: bool = True) -> Req:
    return Req("r", PROMPT, SamplingParams(return_logprob=return_logprob, logprob_start_len=start))


def test_without_logprob_start_len_nothing_is_owed_and_the_cache_serves_all_but_the_last_token():
    for r in (_req(-1), _req(3, return_logprob=False)):
        assert not r.owes_input_logprobs() and r.input_token_logprobs == []
        assert r.prefix_key() == PROMPT[:-1]
        assert list(r.input_logprob_positions(0, 10)) == []


@pytest.mark.parametrize("start, key_len", [(0, 0), (1, 0), (4, 3), (9, 8), (50, 9)])
def test_the_prefix_cache_stops_before_the_first_scored_token(start, key_len):
    r = _req(start)
    assert r.prefix_key() == PROMPT[:key_len]
    r.output_ids.append(7)  # prefilled once: the prompt logprobs are done, the cache serves it all
    assert r.prefix_key() == (PROMPT + [7])[:-1]


def test_chunks_score_each_owed_position_exactly_once():
    r = _req(4)
    assert [t for _, t in r.input_token_logprobs] == PROMPT[4:] and r.input_top_logprobs == [None] * 6
    chunks = [(3, 6), (6, 8), (8, 10)]  # the cache served 3 tokens: [0, 3)
    scored = [q + 1 for a, b in chunks for q in r.input_logprob_positions(a, b)]
    assert scored == list(range(4, 10))  # the last prompt position scores the first output, not a prompt token


def test_start_zero_leaves_the_first_prompt_token_without_a_logprob():
    r = _req(0)
    assert r.input_token_logprobs[0] == (None, PROMPT[0])
    assert [q + 1 for q in r.input_logprob_positions(0, 10)] == list(range(1, 10))
