"""The decode step's Python does not grow with the batch where its requests are plain (greedy or sampled, no
penalty, grammar, stop string, logprob or streaming): the Python bytecodes executed (counted exactly by
benchmark/performance/step_counter.py) are the same at 2 and at 12 requests for the prefill check with
nothing waiting, forming the forward inputs, the worker's sampling setup, and applying the step's tokens.
Tokens are unchanged by construction: each piece's own test compares it with the per-request code it replaced."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from scheduler_utils import InProcessScheduler

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def step_counter():
    spec = importlib.util.spec_from_file_location("step_counter", REPO / "benchmark/performance/step_counter.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def _decoding(path, batch: int, with_stop: int = 0, **sp):
    """A scheduler whose `batch` requests have prefilled and decoded one step (every per-request cache made);
    the first `with_stop` of them have a stop string."""
    s = InProcessScheduler(path, disable_overlap_schedule=True)
    for i in range(batch):
        stop = ["never-produced"] if i < with_stop else []
        s.submit(list(range(5 + i, 21 + i)), None, max_new_tokens=20, ignore_eos=True, stop=stop, **sp)
    while s.sched.waiting or s.sched.chunked_req is not None:
        s.step()
    s.step()
    assert len(s.sched.running) == batch
    return s.sched


def _bytecodes(step_counter, fn) -> tuple[int, object]:
    c = step_counter.BytecodeCounter()
    c.start()
    try:
        out = fn()
    finally:
        c.stop()
    return c.count, out


def _pieces(step_counter, sched) -> dict:
    """Bytecodes of each host piece of one decode step, run in the step's order."""
    counts = {}
    counts["prefill check"], none = _bytecodes(step_counter, sched.get_new_batch_prefill)
    assert none is None
    batch = sched.update_running_batch()
    counts["forward inputs"], fb = _bytecodes(step_counter, lambda: batch.to_forward_batch("cpu"))
    worker = sched.worker
    runner = worker.model_runner
    out = runner.forward(fb)  # the model itself runs outside the count
    forward, runner.forward = runner.forward, lambda _: out
    try:
        counts["sampling"], result = _bytecodes(step_counter,
                                                lambda: worker.forward_batch_generation(batch, False, fb))
    finally:
        runner.forward = forward
    # the same token on every row (not a stop id: ignore_eos), so that rows with checks take the same path
    result = ([7] * len(batch.reqs), *result[1:])
    counts["apply tokens"], _ = _bytecodes(step_counter, lambda: sched.process_batch_result(batch, result, 0.0))
    return counts


@pytest.mark.parametrize("sp", [dict(temperature=0.0), dict(temperature=0.8, top_p=0.9, seed=3)],
                         ids=["greedy", "sampled"])
def test_host_python_of_a_plain_decode_step_does_not_grow_with_the_batch(step_counter, path, sp):
    small, large = (_pieces(step_counter, _decoding(path, b, **sp)) for b in (2, 12))
    assert small == large, (small, large)
    assert all(v > 0 for v in small.values())


def test_the_python_per_request_left_is_the_rows_that_need_checks(step_counter, path):
    """A row with a stop string goes through the full per-request check: applying the tokens costs more
    per such row, and the plain rows beside them still cost nothing each."""
    def apply_cost(batch, with_stop):
        return _pieces(step_counter, _decoding(path, batch, with_stop))["apply tokens"]

    assert apply_cost(2, 1) == apply_cost(12, 1) < apply_cost(12, 2)
