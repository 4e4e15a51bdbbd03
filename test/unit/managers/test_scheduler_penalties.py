"""Penalties through the scheduler: the worker's device rows follow joins, retractions (row freed,
rebuilt at the re-prefill), chunked prefill, finishes and aborts; outputs equal the per-step rebuild."""

from __future__ import annotations

import pytest
import torch

from scheduler_utils import InProcessScheduler
from sglang.srt.sampling.penalties import RebuiltPenaltyState

PENALTIES = [dict(), dict(repetition_penalty=1.8, frequency_penalty=0.6, presence_penalty=0.4),
             dict(frequency_penalty=1.2), dict(repetition_penalty=1.5)]


def _text(n, seed):
    return torch.randint(0, 1500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def _run(path, penalties, legacy=False, **kw):
    s = InProcessScheduler(path, **kw)
    if legacy:
        s.sched.worker.penalties = RebuiltPenaltyState(s.sched.worker.vocab_size, "cpu")
    s.retracted_with_row = []
    forget = s.sched.worker.forget_retracted

    def spy(rid):
        if s.sched.worker.penalties.row_of(rid) is not None:
            s.retracted_with_row.append(rid)
        forget(rid)
        assert s.sched.worker.penalties.row_of(rid) is None  # freed while it waits

    s.sched.worker.forget_retracted = spy
    rids = [s.submit(_text(40, 10 + i), None, max_new_tokens=24, ignore_eos=True, **penalties[i % len(penalties)])
            for i in range(4)]
    s.run_until_idle()
    s.assert_no_leak()
    return s, [s.outputs[r] for r in rids]


def test_penalized_outputs_equal_the_rebuild_through_retractions(path, monkeypatch):
    from sglang.srt.managers import schedule_policy

    monkeypatch.setattr(schedule_policy, "DECODE_RESERVE_CLIP", 1)  # admit optimistically: retractions
    tight = dict(max_total_tokens=150, chunked_prefill_size=32)
    s, got = _run(path, PENALTIES, **tight)
    assert s.retracted_with_row, "the budget should force the retraction of a request holding a row"
    assert s.sched.worker.penalties.rows_in_use == 0  # every row freed (finish and retraction)
    assert s.sched.worker.penalties.capacity > 0
    _, legacy = _run(path, PENALTIES, legacy=True, **tight)
    _, roomy = _run(path, PENALTIES)  # no retraction
    assert got == legacy == roomy
    _, plain = _run(path, [dict()])
    assert got[0] == plain[0]  # the request without a penalty is untouched by its neighbours'
    assert got[1] != plain[1] and got[2] != plain[2]  # the penalties do change outputs


def test_abort_and_finish_free_rows_for_the_next_requests(path):
    s = InProcessScheduler(path)
    state = s.sched.worker.penalties
    a = s.submit(_text(20, 1), None, max_new_tokens=40, ignore_eos=True, presence_penalty=1.0)
    b = s.submit(_text(20, 2), None, max_new_tokens=3, ignore_eos=True, repetition_penalty=1.3)
    for _ in range(2):
        s.step()
    assert state.rows_in_use == 2
    freed = {state.row_of(a), state.row_of(b)}
    s.sched.handle_abort(a, "client gone")
    s.run_until_idle()
    assert s.finished[a].type == "abort" and s.finished[b].type == "length"
    assert state.rows_in_use == 0
    c = s.submit(_text(20, 3), None, max_new_tokens=2, frequency_penalty=0.5)
    s.step()
    assert state.row_of(c) in freed and state.rows_in_use == 1
    assert state.capacity == 8  # reused, not grown
    s.run_until_idle()
    assert state.rows_in_use == 0
    s.assert_no_leak()
