"""Priority scheduling in the real scheduler (tiny model, one process): a higher-priority request that
finds no running slot preempts a lower one by the threshold; the preempted request resumes where it was
(greedy output unchanged) and nothing leaks. Below the threshold, or with preemption disabled, it waits."""

from __future__ import annotations

import itertools

import pytest

from scheduler_utils import InProcessScheduler
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams

_rids = itertools.count()
LOW, HIGH = list(range(10, 40)), list(range(50, 70))


@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def _submit(s: InProcessScheduler, ids: list[int], max_new: int, priority: int) -> str:
    rid = f"p{next(_rids)}"
    msg = TokenizedGenerateReqInput(rid, list(ids), SamplingParams(max_new_tokens=max_new, temperature=0.0,
                                                                  ignore_eos=True), priority=priority)
    s.sched.process_input_requests([msg])
    s.outputs[rid] = []
    return rid


def _run(model_path, high_priority: int, **kw):
    """LOW (priority 0, 24 tokens) runs alone in the one running slot; after 3 steps HIGH arrives. Returns
    (the order the two finished in, their outputs, preemptions)."""
    s = InProcessScheduler(model_path, max_running_requests=1, enable_priority_scheduling=True, **kw)
    low = _submit(s, LOW, 24, 0)
    for _ in range(3):
        s.step()
    high = _submit(s, HIGH, 4, high_priority)
    order = []
    for _ in range(200):
        if s.sched.is_idle():
            break
        s.step()
        order += [r for r in (low, high) if r in s.finished and r not in order]
    s.run_until_idle()
    s.assert_no_leak()
    return order, (s.outputs[low], s.outputs[high]), s.sched.num_preemptions, (low, high)


def test_a_request_higher_by_the_threshold_preempts_and_the_preempted_one_resumes(model_path):
    order, (low_out, high_out), preemptions, (low, high) = _run(model_path, high_priority=10)
    assert order == [high, low] and preemptions == 1
    alone = InProcessScheduler(model_path)
    ref = _submit(alone, LOW, 24, 0)
    alone.run_until_idle()
    assert low_out == alone.outputs[ref] and len(low_out) == 24 and len(high_out) == 4


@pytest.mark.parametrize("high_priority, kw", [(9, {}), (50, {"disable_priority_preemption": True}),
                                               (-10, {"schedule_low_priority_values_first": False})])
def test_without_enough_priority_or_with_preemption_off_it_waits(model_path, high_priority, kw):
    order, _, preemptions, (low, high) = _run(model_path, high_priority, **kw)
    assert order == [low, high] and preemptions == 0


def test_lower_values_first_turns_the_comparison_around(model_path):
    order, _, preemptions, (low, high) = _run(model_path, high_priority=-10, schedule_low_priority_values_first=True)
    assert order == [high, low] and preemptions == 1


def test_a_full_queue_answers_503_and_the_queued_requests_run(model_path):
    """--max-queued-requests 2: the third arrival before any step is a 503 with upstream's message; the
    two queued ones run to the end and nothing leaks."""
    s = InProcessScheduler(model_path, max_queued_requests=2)
    kept = [_submit(s, LOW, 3, 0), _submit(s, HIGH, 3, 0)]
    refused = _submit(s, LOW, 3, 0)
    s.sched.flush_outputs()
    s._drain()
    fr = s.finished[refused]
    assert (fr.type, fr.status_code, fr.message) == ("abort", 503, "The request queue is full.")
    s.run_until_idle()
    assert all(s.finished[r].type == "length" and len(s.outputs[r]) == 3 for r in kept)
    s.assert_no_leak()


@pytest.mark.parametrize("low_values_first", [False, True])
def test_with_priority_scheduling_a_higher_priority_arrival_displaces_the_lowest_queued(model_path, low_values_first):
    s = InProcessScheduler(model_path, max_queued_requests=2, enable_priority_scheduling=True,
                           schedule_low_priority_values_first=low_values_first)
    better, worse = (1, 9) if low_values_first else (9, 1)
    mid = 5
    a = _submit(s, LOW, 3, mid)
    b = _submit(s, HIGH, 3, worse)
    same = _submit(s, LOW, 3, worse)  # not better than the worst queued one: refused itself
    top = _submit(s, HIGH, 3, better)  # displaces b, the queued request that would run last
    s.sched.flush_outputs()
    s._drain()
    assert s.finished[same].status_code == 503 and s.finished[same].message == "The request queue is full."
    assert s.finished[b].status_code == 503 and s.finished[b].message == "The request is aborted by a higher priority request."
    s.run_until_idle()
    assert all(s.finished[r].type == "length" for r in (a, top))
    s.assert_no_leak()
