"""Penalties kept on the device (PenaltyState) against the per-step rebuild they replace: the adjusted
logits are bitwise equal at every step of a run with joins, retractions and re-prefills, middle prefill
chunks, finishing requests whose rows are reused, table growth, and rows without penalties."""

from __future__ import annotations

import random

import pytest
import torch

from sglang.srt.sampling.penalties import PenaltyState, RebuiltPenaltyState
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.testing.op_count import count_aten_ops

V = 97


class FakeReq:
    def __init__(self, rid, prompt, params):
        self.rid, self.origin_input_ids, self.sampling_params = rid, prompt, params
        self.output_ids: list[int] = []


def _params(kind: int) -> SamplingParams:
    return [
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.25),
        SamplingParams(),  # no penalty: unchanged logits, row 0
        SamplingParams(repetition_penalty=0.8),
        SamplingParams(frequency_penalty=-0.5),
        SamplingParams(presence_penalty=1.5, repetition_penalty=2.0),
    ][kind % 5]


def _logits(b: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(b, V, generator=g) * 3
    x[:, :5] = 0.0  # exact zeros take the "multiply" branch
    return x


@pytest.mark.parametrize("state_cls", [PenaltyState, RebuiltPenaltyState])
def test_penalties_follow_hf_and_openai_rules(state_cls):
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    req = FakeReq("r", [1], SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25))
    req.output_ids = [0, 0, 2]
    state = state_cls(4, "cpu")
    out = state.apply(logits, state.prepare([req]))[0]
    # token 0: seen, positive -> /2, then 2 occurrences * 0.5 and presence 0.25; token 1: prompt only
    assert torch.allclose(out, torch.tensor([2.0 / 2 - 1.0 - 0.25, -2.0 * 2, 1.0 / 2 - 0.5 - 0.25, 0.5]))


def test_device_state_equals_rebuild_every_step():
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    state, ref = PenaltyState(V, "cpu", initial_rows=2), RebuiltPenaltyState(V, "cpu")
    counter = iter(range(10_000))

    def new_req(kind):
        prompt = [rng.randrange(V) for _ in range(rng.randrange(1, 12))] + [V + 3]  # an id past the vocab
        return FakeReq(f"r{next(counter)}", prompt, _params(kind))

    running = [new_req(k) for k in range(6)]
    waiting: list[FakeReq] = []  # retracted: come back through a re-prefill
    chunked = new_req(0)  # a long prompt prefilled over three steps before decoding
    chunk_steps = 3
    reused = finished_rows = 0
    steps = 40
    for step in range(steps):
        batch = list(running)
        prefill_only: set[int] = set()  # samples discarded: middle chunk or re-prefill
        if chunk_steps:
            batch.append(chunked)
            chunk_steps -= 1
            if chunk_steps:
                prefill_only.add(id(chunked))
            else:
                running.append(chunked)
        if waiting and step % 4 == 0:  # re-prefill: outputs come back, the sampled token is dropped
            back = waiting.pop(0)
            batch.append(back)
            prefill_only.add(id(back))
            running.append(back)
        rng.shuffle(batch)
        logits = _logits(len(batch), g)
        want = ref.apply(logits, ref.prepare(batch))
        got = state.apply(logits, state.prepare(batch))
        assert torch.equal(got, want), f"step {step}"
        assert torch.equal(logits, logits.clone())  # not modified in place
        sampled = torch.where(torch.rand(len(batch), generator=g) < 0.5, want.argmax(-1),
                              torch.randint(0, V, (len(batch),), generator=g)).tolist()
        for r, tok in zip(batch, sampled):
            if id(r) not in prefill_only:
                r.output_ids.append(tok)
        # a penalized request finishes; the next request to join takes its row
        done = next((r for r in running if r.sampling_params.has_penalty and len(r.output_ids) >= 6), None)
        if done is not None and step % 3 == 0:
            row = state.row_of(done.rid)
            running.remove(done)
            state.release(done.rid)
            fresh = new_req(0)
            running.append(fresh)
            state.prepare([fresh])
            reused += state.row_of(fresh.rid) == row
            finished_rows += 1
        # retraction: the row is freed; the request keeps its outputs
        if step % 5 == 2 and len(running) > 3:
            victim = next(r for r in running if r.sampling_params.has_penalty and r is not chunked)
            running.remove(victim)
            state.release(victim.rid)
            waiting.append(victim)
    assert finished_rows >= 3 and reused == finished_rows
    assert state.capacity > 2  # grew past its first rows
    assert state.rows_in_use == sum(r.sampling_params.has_penalty for r in running)


def test_same_rid_with_a_new_request_object_is_rebuilt():
    state = PenaltyState(V, "cpu")
    a = FakeReq("x", [4, 5], _params(0))
    a.output_ids = [6, 6, 6]
    state.prepare([a])
    b = FakeReq("x", [8], _params(0))  # the rid reused without a release in between
    logits = torch.ones(1, V)
    got = state.apply(logits, state.prepare([b]))
    ref = RebuiltPenaltyState(V, "cpu")
    assert torch.equal(got, ref.apply(logits, ref.prepare([b])))


def test_batches_without_penalties_build_nothing():
    state = PenaltyState(V, "cpu")
    assert state.prepare([FakeReq("a", [1], SamplingParams())]) is None
    assert state.counts is None and state.rows_in_use == 0


def test_step_op_count_does_not_grow_with_outputs_or_prompts():
    """Per step: a fixed number of tensor ops, whatever the prompt and output lengths (the rebuild's
    host flattening and copies grew with both)."""
    def run(prompt_len, out_len):
        state = PenaltyState(V, "cpu")
        reqs = [FakeReq(f"q{i}", list(range(prompt_len)), _params(0)) for i in range(4)]
        for r in reqs:
            r.output_ids = [i % V for i in range(out_len)]
        state.prepare(reqs)  # the join: built once
        for r in reqs:
            r.output_ids.append(3)
        logits = torch.zeros(4, V)
        _, n, ops = count_aten_ops(lambda: state.apply(logits, state.prepare(reqs)))
        return n, ops, state

    short, _, _ = run(5, 2)
    long, ops, state = run(90, 300)
    assert short == long, (short, long)
    assert ops["index_put_"] == 1  # one scatter of the step's new ids
    assert float(state.counts[state.row_of("q0"), 3]) == 300 // V + (1 if 3 < 300 % V else 0) + 1
