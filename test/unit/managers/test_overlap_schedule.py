"""The overlap scheduler against the step-by-step one (`--disable-overlap-schedule`), same workload, same
process: identical tokens and finish reasons for greedy, seeded sampling with penalties, stop strings and
stop ids, grammars, retraction under a tiny KV budget and staggered arrivals; an abort mid-step ends only
its request; nothing leaks. Also that it really overlaps: step N+1 is launched before step N is applied."""

from __future__ import annotations

import json
import re

import pytest
import torch

from scheduler_utils import InProcessScheduler

PLACEHOLDER = [151652, 151655, 151653]


def _text(n, seed):
    return torch.randint(0, 1500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(autouse=True)
def overlap_on_cpu(monkeypatch):
    monkeypatch.setenv("SGLANG_OVERLAP_SCHEDULE_ON_CPU", "1")  # a CPU device runs step by step by default


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


@pytest.fixture(scope="module")
def image_prompt():
    import numpy as np
    from PIL import Image

    from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

    proc = QwenVLProcessor(None, QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                                                      min_pixels=4 * 32 * 32, max_pixels=48 * 32 * 32))
    img = Image.fromarray(np.random.default_rng(3).integers(0, 256, (64, 96, 3), dtype=np.uint8))
    return lambda: proc.process(_text(5, 90) + PLACEHOLDER + _text(6, 91), [img])


def _both(path, workload, **kw):
    """Runs `workload(s) -> rids` under each mode; returns {overlap: (scheduler, outputs, finish reasons)}."""
    out = {}
    for overlap in (False, True):
        s = InProcessScheduler(path, disable_overlap_schedule=not overlap, **kw)
        assert s.sched.enable_overlap is overlap
        rids = workload(s)
        s.run_until_idle()
        s.assert_no_leak()
        out[overlap] = (s, [s.outputs[r] for r in rids], [_reason(s.finished[r]) for r in rids])
    return out


def _reason(f):
    return (f.type, f.matched, getattr(f, "message", None))


def _assert_same(out):
    assert out[True][1] == out[False][1]
    assert out[True][2] == out[False][2]


def test_greedy_text_and_image_with_staggered_finishes(path, image_prompt):
    def workload(s):
        # different lengths: requests end at different steps, so later steps carry rows that already ended
        rids = [s.submit(_text(12 + i, i), None, max_new_tokens=3 + 4 * i, ignore_eos=True) for i in range(4)]
        rids.append(s.submit(*image_prompt(), max_new_tokens=9, ignore_eos=True))
        for _ in range(4):
            s.step()
        # arrivals while decode steps are in flight
        rids += [s.submit(_text(9, 20 + i), None, max_new_tokens=5 + i, ignore_eos=True) for i in range(3)]
        return rids

    out = _both(path, workload)
    _assert_same(out)
    assert all(len(o) == n for o, n in zip(out[True][1], [3, 7, 11, 15, 9, 5, 6, 7]))


def test_seeded_sampling_with_penalties_and_min_tokens(path):
    def workload(s):
        return [s.submit(_text(10, 30 + i), None, max_new_tokens=12, temperature=0.9, top_p=0.9, top_k=50,
                         seed=100 + i, frequency_penalty=0.4 * (i % 2), repetition_penalty=1.0 + 0.2 * (i % 3),
                         min_new_tokens=4) for i in range(5)]

    _assert_same(_both(path, workload))


def test_stop_strings_and_stop_ids(path):
    ref = InProcessScheduler(path, disable_overlap_schedule=True)
    ids = _text(15, 40)
    r = ref.submit(ids, None, max_new_tokens=10, ignore_eos=True)
    ref.run_until_idle()
    tokens = ref.outputs[r]
    text = ref.sched.tokenizer.decode(tokens[:6])

    def workload(s):
        return [s.submit(ids, None, max_new_tokens=10, stop_token_ids=[tokens[3]], ignore_eos=True),
                s.submit(ids, None, max_new_tokens=10, stop=[text[-3:]], ignore_eos=True),
                s.submit(_text(11, 41), None, max_new_tokens=10, ignore_eos=True)]

    out = _both(path, workload)
    _assert_same(out)
    assert out[True][2][0][0] == "stop" and out[True][2][1][0] == "stop"
    assert len(out[True][1][0]) < 10 and len(out[True][1][1]) < 10  # both stopped early, a step before the rest


def test_grammar_constrained_outputs(path):
    schema = json.dumps({"type": "object", "properties": {"color": {"enum": ["red", "green"]}},
                         "required": ["color"], "additionalProperties": False})

    def workload(s):
        rids = [s.submit(_text(20, 50), None, max_new_tokens=40, json_schema=schema),
                s.submit(_text(20, 51), None, max_new_tokens=40, regex="(yes|no)!{2,4}"),
                s.submit(_text(20, 52), None, max_new_tokens=12, ignore_eos=True)]
        for _, fut in list(s.sched.grammar_queue.pending):
            fut.exception(60)
        return rids

    out = _both(path, workload)
    _assert_same(out)
    s = out[True][0]
    assert out[True][2][1][0] == "stop"
    assert re.fullmatch("(yes|no)!{2,4}", s.sched.tokenizer.decode(out[True][1][1], skip_special_tokens=True))


def test_retraction_under_a_tiny_kv_budget(path, monkeypatch):
    from sglang.srt.managers import schedule_policy

    monkeypatch.setattr(schedule_policy, "DECODE_RESERVE_CLIP", 1)  # admit optimistically: decoding runs short

    def workload(s):
        return [s.submit(_text(40, 60 + i), None, max_new_tokens=24, ignore_eos=True) for i in range(4)]

    out = _both(path, workload, max_total_tokens=150, chunked_prefill_size=32)
    _assert_same(out)
    assert out[True][0].sched.num_retractions > 0 and out[False][0].sched.num_retractions > 0


def test_abort_mid_step_ends_only_its_request(path):
    def workload(s):
        rids = [s.submit(_text(20, 70 + i), None, max_new_tokens=30, ignore_eos=True, stream=True) for i in range(3)]
        for _ in range(5):
            s.step()
        s.sched.handle_abort(rids[1], "client gone")
        return rids

    out = _both(path, workload)
    (_, seq, fin), (_, overlap_out, overlap_fin) = out[False], out[True]
    assert overlap_out[0] == seq[0] and overlap_out[2] == seq[2] and overlap_fin[0] == fin[0]
    assert overlap_fin[1][0] == fin[1][0] == "abort"
    # the token of the step in flight when the abort arrived is dropped: a prefix of the step-by-step output
    assert overlap_out[1] == seq[1][: len(overlap_out[1])] and len(overlap_out[1]) >= len(seq[1]) - 1


def test_a_cpu_device_runs_step_by_step_unless_asked(path, monkeypatch):
    monkeypatch.delenv("SGLANG_OVERLAP_SCHEDULE_ON_CPU")
    assert InProcessScheduler(path).sched.enable_overlap is False
    monkeypatch.setenv("SGLANG_OVERLAP_SCHEDULE_ON_CPU", "1")
    assert InProcessScheduler(path).sched.enable_overlap is True
    assert InProcessScheduler(path, disable_overlap_schedule=True).sched.enable_overlap is False


def test_decode_steps_really_overlap(path):
    s = InProcessScheduler(path)
    events = []
    thread, sched = s.sched._forward_thread, s.sched
    launch, apply = thread.launch, sched.process_batch_result

    def spy_launch(batch, *a):
        events.append(("launch", batch.seq, batch.mode.name))
        return launch(batch, *a)

    def spy_apply(batch, *a):
        events.append(("apply", batch.seq, batch.mode.name))
        return apply(batch, *a)

    thread.launch, sched.process_batch_result = spy_launch, spy_apply
    s.submit(_text(10, 80), None, max_new_tokens=6, ignore_eos=True)
    s.run_until_idle()
    s.assert_no_leak()
    decodes = [seq for kind, seq, mode in events if kind == "launch" and mode == "DECODE"]
    assert len(decodes) >= 5
    for seq in decodes[:-1]:  # each decode step is applied only after its successor was launched
        assert events.index(("launch", seq + 1, "DECODE")) < events.index(("apply", seq, "DECODE"))


def test_the_forward_thread_ends_with_its_scheduler(path):
    import gc
    import weakref

    s = InProcessScheduler(path)
    s.submit(_text(10, 81), None, max_new_tokens=3, ignore_eos=True)
    s.run_until_idle()
    thread = s.sched._forward_thread._thread
    worker = weakref.ref(s.sched.worker)
    assert thread.is_alive()
    del s
    gc.collect()
    assert worker() is None, "nothing keeps the model (and on a GPU its KV pool) alive"
    thread.join(30)
    assert not thread.is_alive()


def test_only_batches_whose_sampling_reads_request_state_wait_for_the_previous_step():
    from types import SimpleNamespace

    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.tp_worker_overlap_thread import samples_from_applied_state
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.sampling.sampling_params import SamplingParams

    def batch(**sp):
        plain = Req("a", [1, 2], SamplingParams(temperature=0.0))
        other = Req("b", [1, 2], SamplingParams(**sp))
        return ScheduleBatch(ForwardMode.DECODE, [plain, other])

    assert not samples_from_applied_state(batch(temperature=0.0))
    assert samples_from_applied_state(batch(temperature=0.7))  # a sampled row's noise depends on its step count
    assert samples_from_applied_state(batch(temperature=0.0, frequency_penalty=0.5))
    assert samples_from_applied_state(batch(temperature=0.0, min_new_tokens=2, max_new_tokens=4))
    b = batch(temperature=0.0)
    b.reqs[1].grammar = SimpleNamespace()  # any matcher
    assert samples_from_applied_state(b)
    b = batch(temperature=0.0)
    b.reqs[1].custom_logit_processor = "..."
    assert samples_from_applied_state(b)
