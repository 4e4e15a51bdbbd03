"""build_forward_batch's decode shortcuts (index ranges for one token per request, prefix sums in C) give the
ForwardBatch the general per-element construction gave: every index tensor, the positions with and without
M-RoPE deltas, and the extend path's sums."""

from __future__ import annotations

import random

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode, _cumsum0, build_forward_batch


def _reference_cumsum0(xs):
    out, acc = [0], 0
    for x in xs:
        acc += x
        out.append(acc)
    return out


def test_cumsum0_matches_the_running_sum():
    rng = random.Random(0)
    for n in (0, 1, 7, 300):
        xs = [rng.randrange(0, 5000) for _ in range(n)]
        assert _cumsum0(xs) == _reference_cumsum0(xs)


def test_decode_indices_and_positions_match_the_per_request_construction():
    rng = random.Random(1)
    for b, deltas in ((1, None), (5, None), (6, [0, 3, -2, 0, 7, 1])):
        seq_lens = [rng.randrange(1, 900) for _ in range(b)]
        ids = [rng.randrange(0, 1000) for _ in range(b)]
        pool = [rng.randrange(1, 64) for _ in range(b)]
        loc = torch.tensor([rng.randrange(0, 10_000) for _ in range(b)])
        fb = build_forward_batch(ForwardMode.DECODE, ids, None, pool, seq_lens, loc, "cpu", mrope_deltas=deltas)
        q = [1] * b
        assert fb.qo_indptr.tolist() == _reference_cumsum0(q)
        assert fb.last_indices.tolist() == [x - 1 for x in _reference_cumsum0(q)[1:]]
        assert fb.kv_indptr.tolist() == _reference_cumsum0(seq_lens)
        want = [s - 1 + d for s, d in zip(seq_lens, deltas or [0] * b)]
        assert fb.positions.tolist() == [want] * 3
        assert fb.input_ids.tolist() == ids and fb.req_pool_indices.tolist() == pool
        assert fb.seq_lens_cpu == seq_lens and fb.max_extend_len == 1 and fb.max_seq_len == max(seq_lens)


def test_extend_indices_are_the_prefix_sums_of_the_chunks():
    lens, prefix = [3, 1, 4], [0, 5, 2]
    seq = [p + n for p, n in zip(prefix, lens)]
    pos = torch.arange(sum(lens)).repeat(3, 1)
    fb = build_forward_batch(ForwardMode.EXTEND, list(range(sum(lens))), pos, [1, 2, 3], seq,
                             torch.arange(sum(lens)), "cpu", lens, prefix)
    assert fb.qo_indptr.tolist() == [0, 3, 4, 8] and fb.last_indices.tolist() == [2, 3, 7]
    assert fb.kv_indptr.tolist() == _reference_cumsum0(seq) and fb.max_extend_len == 4
