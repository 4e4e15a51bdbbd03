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
