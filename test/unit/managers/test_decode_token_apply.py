"""Applying a decode step's tokens in bulk (plain rows by C-level maps, the rest one by one) leaves every
request, the outbox order and the running list exactly as the per-request loop it replaced: random batches
mixing EOS and stop ids (ignored or not), length and context limits, stop strings, a grammar, logprobs,
streaming at several intervals, aborts pending and requests that ended while the step was queued."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest

from sglang.srt.managers.io_struct import FinishReason
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.scheduler_output_processor_mixin import SchedulerOutputProcessorMixin
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_params import SamplingParams


class _Tokenizer:
    """Token t is the letter chr(97 + t % 26): stop strings like "fg" appear for the tokens 5, 6."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + t % 26) for t in ids)


class _Grammar:
    """Accepts anything; complete after token 8."""

    key = ("regex", ".*")

    def __init__(self):
        self.done = False

    def accept(self, tok):
        self.done = tok == 8
        return True

    def is_terminated(self):
        return self.done


class _Sched(SchedulerOutputProcessorMixin):
    def __init__(self, stream_interval: int):
        self.eos_ids = {2, 3}
        self.context_length = 30
        self.server_args = SimpleNamespace(stream_interval=stream_interval)
        self.stage_timer = SimpleNamespace(enabled=False)
        self._profiler = None
        self.tokenizer = _Tokenizer()
        self.outbox, self.running = [], []

    def finish(self, req, reason):  # the real one also releases KV and emits stage timings
        req.finished_reason = reason
        self.outbox.append(req)


def _old_apply(s: _Sched, reqs, next_ids, logprobs) -> None:
    """The per-request loop before the bulk path."""
    logprobs = logprobs or [None] * len(next_ids)
    for req, tok, lp in zip(reqs, next_ids, logprobs):
        if not req.finished():
            s._append_token(req, tok, lp)
    s.running = [r for r in s.running if not r.finished()]


def _random_req(rng: random.Random, i: int) -> Req:
    sp = SamplingParams(max_new_tokens=rng.randrange(1, 14), ignore_eos=rng.random() < 0.3,
                        stop_token_ids=rng.sample(range(10), rng.randrange(0, 3)),
                        stop=["fg"] if rng.random() < 0.15 else [],
                        return_logprob=rng.random() < 0.15)
    r = Req(f"r{i}", list(range(rng.randrange(1, 24))), sp, stream=rng.random() < 0.5)
    if rng.random() < 0.1:
        r.grammar = _Grammar()
    r.output_ids = [rng.randrange(10, 20)]  # the prefill's token
    return r


def _state(s: _Sched, reqs) -> tuple:
    return ([(r.rid, list(r.output_ids), r.finished_reason, list(r.output_token_logprobs)) for r in reqs],
            [r.rid for r in s.outbox], [r.rid for r in s.running])


@pytest.mark.parametrize("seed", range(12))
def test_bulk_application_equals_the_per_request_loop(seed):
    rng = random.Random(seed)
    s = _Sched(stream_interval=rng.choice([1, 2, 3]))
    s.running = [_random_req(rng, i) for i in range(rng.randrange(1, 40))]
    ref = copy.deepcopy(s)
    twin = {r.rid: r for r in ref.running}
    finished = 0
    for step in range(16):
        if not s.running:
            break
        assert [r.rid for r in ref.running] == [r.rid for r in s.running]
        batch = list(s.running)
        ref_batch = [twin[r.rid] for r in batch]
        # overlap: a request that ended while this step was queued rides along; an abort pending
        for r, t in zip(batch, ref_batch):
            u = rng.random()
            if u < 0.03:
                r.finished_reason = t.finished_reason = FinishReason("abort", message="gone")
            elif u < 0.06:
                r.to_abort = t.to_abort = FinishReason("abort", message="client")
        next_ids = [rng.randrange(0, 10) for _ in batch]
        lps = [(-0.5, [(-0.5, t)]) if r.sampling_params.return_logprob else None for r, t in zip(batch, next_ids)]
        logprobs = lps if any(lp is not None for lp in lps) else None
        s.outbox.clear()
        ref.outbox.clear()
        s.process_batch_result(ScheduleBatch(ForwardMode.DECODE, batch), (next_ids, {}, logprobs, []), 0.0)
        _old_apply(ref, ref_batch, next_ids, logprobs)
        assert _state(s, batch) == _state(ref, ref_batch), f"seed {seed} step {step}"
        finished += sum(r.finished_reason is not None for r in batch)
    assert finished > 0
