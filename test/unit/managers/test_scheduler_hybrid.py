"""Qwen3.5 (hybrid Gated DeltaNet) through the scheduler: greedy tokens equal to transformers' (float32,
the same random weights) under continuous batching, chunked prefill cutting an image and the DeltaNet's
own 64-token chunks, pages, a one-row request table (rows, and so state rows, reused), retraction,
priority preemption, aborts and the overlap scheduler; nothing leaks (request rows carry the states)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch

from scheduler_utils import InProcessScheduler
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from qwen3_5_driver import (  # noqa: E402  (the Qwen3.5 test inputs, shared with the model tests)
    PLACEHOLDER, noise_image as _image, ref_kwargs, text_ids as _text, tiny_processor,
)

transformers = pytest.importorskip("transformers")

NEW = 5
_rids = itertools.count()


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    path = str(tiny_model_dir("qwen3.5-tiny"))
    transformers.logging.set_verbosity_error()
    ref = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return path, ref, tiny_processor()


def _prompts(proc):
    return [
        (_text(90, 0), None),  # crosses the DeltaNet's 64-token chunk
        proc.process(_text(5, 1) + PLACEHOLDER + _text(7, 2), [_image(1)]),
        proc.process(PLACEHOLDER + _text(3, 3) + PLACEHOLDER + _text(6, 4), [_image(2, 64, 64), _image(3, 40, 130)]),
        (_text(12, 5), None),
    ]


def _greedy_reference(ref, ids: list[int], mm, n: int) -> list[int]:
    """transformers, one full forward per token (no cache: nothing of its own state handling involved)."""
    seq, out = list(ids), []
    for _ in range(n):
        with torch.no_grad():
            logits = ref(**ref_kwargs(seq, mm)).logits[0, -1]
        out.append(int(logits.argmax()))
        seq.append(out[-1])
    return out


@pytest.fixture(scope="module")
def reference(setup):
    _, ref, proc = setup
    return [_greedy_reference(ref, ids, mm, NEW) for ids, mm in _prompts(proc)]


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(chunked_prefill_size=7), dict(chunked_prefill_size=70), dict(page_size=4, chunked_prefill_size=16),
     dict(max_running_requests=1), dict(max_running_requests=2)],
    ids=["default", "chunk7", "chunk70", "page4", "one_row", "max_running2"],
)
def test_greedy_tokens_equal_transformers(setup, reference, kw):
    path, _, proc = setup
    s = InProcessScheduler(path, **kw)
    rids = [s.submit(ids, mm, max_new_tokens=NEW, ignore_eos=True) for ids, mm in _prompts(proc)]
    s.run_until_idle()
    assert [s.outputs[r] for r in rids] == reference
    s.assert_no_leak()


def test_overlap_scheduler_keeps_the_tokens(setup, reference, monkeypatch):
    """Spare rows of finished requests ride along in the next step; their state rows are not reused
    before that step ran."""
    monkeypatch.setenv("SGLANG_OVERLAP_SCHEDULE_ON_CPU", "1")
    path, _, proc = setup
    s = InProcessScheduler(path, disable_overlap_schedule=False, max_running_requests=2)
    assert s.sched.enable_overlap
    rids = [s.submit(ids, mm, max_new_tokens=NEW, ignore_eos=True) for ids, mm in _prompts(proc)]
    s.run_until_idle()
    s.sched.resolve_in_flight()
    assert [s.outputs[r] for r in rids] == reference
    s.assert_no_leak()


def test_retraction_restarts_the_state(setup, monkeypatch):
    from sglang.srt.managers import schedule_policy

    monkeypatch.setattr(schedule_policy, "DECODE_RESERVE_CLIP", 1)  # admit optimistically: decoding runs out
    path, ref, _ = setup
    prompts = [_text(40, 10 + i) for i in range(4)]
    want = [_greedy_reference(ref, ids, None, 16) for ids in prompts]
    s = InProcessScheduler(path, max_total_tokens=130, chunked_prefill_size=32)
    rids = [s.submit(ids, None, max_new_tokens=16, ignore_eos=True) for ids in prompts]
    s.run_until_idle()
    assert s.sched.num_retractions > 0, "the budget should force at least one retraction"
    assert [s.outputs[r] for r in rids] == want
    s.assert_no_leak()


def _submit_priority(s, ids, max_new, priority):
    rid = f"h{next(_rids)}"
    msg = TokenizedGenerateReqInput(rid, list(ids), SamplingParams(max_new_tokens=max_new, temperature=0.0,
                                                                  ignore_eos=True), priority=priority)
    s.sched.process_input_requests([msg])
    s.outputs[rid] = []
    return rid


def test_priority_preemption_resumes_with_the_right_state(setup):
    path, ref, _ = setup
    low_ids, high_ids = _text(30, 40), _text(20, 41)
    s = InProcessScheduler(path, max_running_requests=1, enable_priority_scheduling=True)
    low = _submit_priority(s, low_ids, 12, 0)
    for _ in range(3):
        s.step()
    high = _submit_priority(s, high_ids, 4, 10)
    s.run_until_idle()
    assert s.sched.num_preemptions == 1
    assert s.outputs[low] == _greedy_reference(ref, low_ids, None, 12)
    assert s.outputs[high] == _greedy_reference(ref, high_ids, None, 4)
    s.assert_no_leak()


def test_abort_mid_decode_then_the_row_serves_a_new_request(setup, reference):
    path, _, proc = setup
    s = InProcessScheduler(path, max_running_requests=1)
    gone = s.submit(_text(30, 50), None, max_new_tokens=40, ignore_eos=True)
    for _ in range(4):
        s.step()
    s.sched.handle_abort(gone, "client gone")
    s.run_until_idle()
    assert s.finished[gone].type == "abort"
    ids, mm = _prompts(proc)[1]
    rid = s.submit(ids, mm, max_new_tokens=NEW, ignore_eos=True)  # the aborted request's row, its state reset
    s.run_until_idle()
    assert s.outputs[rid] == reference[1]
    s.assert_no_leak()


def test_state_pool_is_sized_beside_the_kv_pool(setup):
    path, _, _ = setup
    s = InProcessScheduler(path, max_running_requests=3)
    runner = s.sched.worker.model_runner
    pool, shape = runner.state_pool, runner.state_shape
    assert runner.kv_layers == (3,) and len(runner.token_to_kv_pool.k_buffer) == 1
    rows = runner.req_to_token_pool.size
    assert pool.rows == rows and pool.snapshot_slots == rows  # default: as many snapshots as rows
    assert pool.conv.shape[0] == pool.recurrent.shape[0] == 2 * rows
    assert shape.num_layers == 3 and pool.total_bytes() == 2 * rows * shape.bytes_per_request()
    assert pool.recurrent.dtype == torch.float32
    sized = InProcessScheduler(path, max_running_requests=3, max_mamba_cache_size=5)
    assert sized.sched.worker.model_runner.state_pool.conv.shape[0] == rows + 5


# ----------------------------------------------------------------------------- prefix cache (state snapshots)
def _assert_snapshots_accounted(s: InProcessScheduler) -> None:
    """Every snapshot slot is free or held by exactly one tree node (none left with a finished request)."""
    pool, tree = s.sched.worker.model_runner.state_pool, s.sched.tree
    assert pool.available_snapshots() + tree.snapshot_count() == pool.snapshot_slots


def test_same_images_new_question_resume_after_the_images(setup):
    path, ref, proc = setup
    s = InProcessScheduler(path, mamba_track_interval=0)  # only item ends and request ends
    head = _text(6, 60) + PLACEHOLDER
    images = [_image(61), _image(62, 64, 64)]
    first = proc.process(head + _text(4, 63) + PLACEHOLDER + _text(5, 64), images)
    second = proc.process(head + _text(4, 63) + PLACEHOLDER + _text(9, 65), images)  # new question
    r1 = s.submit(*first, max_new_tokens=NEW, ignore_eos=True)
    s.run_until_idle()
    r2 = s.submit(*second, max_new_tokens=NEW, ignore_eos=True)
    s.run_until_idle()
    last_image_end = second[1].mm_items[-1].offsets[-1][1]
    assert s.meta[r1]["cached_tokens"] == 0
    assert s.meta[r2]["cached_tokens"] == last_image_end  # the deepest snapshot: after the second image
    assert s.outputs[r2] == _greedy_reference(ref, *second, NEW)
    s.assert_no_leak()
    _assert_snapshots_accounted(s)


def test_multi_turn_chat_resumes_at_the_end_of_the_previous_turn(setup):
    path, ref, proc = setup
    s = InProcessScheduler(path)
    turn1 = proc.process(_text(7, 70) + PLACEHOLDER + _text(8, 71), [_image(72)])
    r1 = s.submit(*turn1, max_new_tokens=NEW, ignore_eos=True)
    s.run_until_idle()
    history = turn1[0] + s.outputs[r1]
    s.submit(_text(30, 74), None, max_new_tokens=3)  # another conversation takes the request row meanwhile
    s.run_until_idle()
    turn2 = proc.process(_text(7, 70) + PLACEHOLDER + _text(8, 71) + s.outputs[r1] + _text(6, 73), [_image(72)])
    assert turn2[0][:len(history)] == history
    r2 = s.submit(*turn2, max_new_tokens=NEW, ignore_eos=True)
    s.run_until_idle()
    # the first turn's state was kept at its end: everything it computed (its last output token was
    # sampled, never fed) is served from the cache
    assert s.meta[r2]["cached_tokens"] == len(history) - 1
    assert s.outputs[r2] == _greedy_reference(ref, *turn2, NEW)
    paths = s.sched.get_info()["paths"]["hybrid_prefix"]  # what /get_server_info reports
    assert paths["restored"] == 1 and paths["kept_at_release"] == 3  # turn 1, the other conversation, turn 2
    assert paths["captured"] >= 1 and paths["in_tree"] + paths["free"] == paths["snapshot_slots"]
    s.assert_no_leak()
    _assert_snapshots_accounted(s)


@pytest.mark.parametrize("interval,chunk", [(32, None), (32, 20), (0, None)])
def test_long_shared_prefix_resumes_at_the_last_interval_snapshot(setup, interval, chunk):
    path, ref, _ = setup
    kw = {"chunked_prefill_size": chunk} if chunk else {}
    s = InProcessScheduler(path, mamba_track_interval=interval, **kw)
    shared = _text(100, 80)
    a, b = shared + _text(5, 81), shared + _text(7, 82)
    ra = s.submit(a, None, max_new_tokens=NEW, ignore_eos=True)
    s.run_until_idle()
    rb = s.submit(b, None, max_new_tokens=NEW, ignore_eos=True)
    s.run_until_idle()
    assert s.meta[rb]["cached_tokens"] == (96 if interval else 0)  # 100 shared: snapshots at 32, 64, 96
    assert s.outputs[rb] == _greedy_reference(ref, b, None, NEW)
    again = s.submit(a, None, max_new_tokens=NEW, ignore_eos=True)  # the same prompt: resumes at its end
    s.run_until_idle()
    assert s.meta[again]["cached_tokens"] == len(a) - 1
    assert s.outputs[again] == s.outputs[ra]
    s.assert_no_leak()
    _assert_snapshots_accounted(s)


def test_snapshots_are_bounded_and_evicted_with_their_nodes(setup):
    path, ref, _ = setup
    s = InProcessScheduler(path, max_mamba_cache_size=3, mamba_track_interval=16)
    prompts = [_text(40, 90 + i) for i in range(5)]  # 2 interval snapshots + 1 end snapshot each
    rids = [s.submit(ids, None, max_new_tokens=3, ignore_eos=True) for ids in prompts]
    s.run_until_idle()
    pool = s.sched.worker.model_runner.state_pool
    assert s.sched.tree.snapshot_count() <= 3
    _assert_snapshots_accounted(s)
    assert [s.outputs[r] for r in rids] == [_greedy_reference(ref, ids, None, 3) for ids in prompts]
    s.sched.tree.reset()  # what /flush_cache does when idle: every snapshot back to the pool
    assert pool.available_snapshots() == pool.snapshot_slots and s.sched.tree.snapshot_count() == 0
    s.assert_no_leak()


def test_disabled_radix_cache_keeps_no_snapshots(setup):
    path, _, proc = setup
    s = InProcessScheduler(path, disable_radix_cache=True, mamba_track_interval=8)
    ids, mm = _prompts(proc)[1]
    for _ in range(2):
        rid = s.submit(ids, mm, max_new_tokens=NEW, ignore_eos=True)
        s.run_until_idle()
        assert s.meta[rid]["cached_tokens"] == 0
    pool = s.sched.worker.model_runner.state_pool
    assert pool.available_snapshots() == pool.snapshot_slots
    assert s.sched.get_info()["paths"]["hybrid_prefix"]["captured"] == 0
    s.assert_no_leak()


# ----------------------------------------------------------------------------- the seed series on Qwen3.5
@pytest.mark.parametrize("env", [
    {"SGLANG_VIT_CHUNK_PER_IMAGE": "0"}, {"SGLANG_VIT_PATCH_EMBED_LINEAR": "0"}, {"SGLANG_VIT_FAST_POS_EMBED": "0"},
    {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_VIT_CUDA_GRAPH_BUCKETS": "64,256"},
], ids=["chunk_per_image_off", "patch_embed_conv", "pos_embed_baseline", "vit_graph_padded"])
def test_vision_switches_keep_the_tokens(setup, reference, env, monkeypatch):
    """Each vision-tower switch flipped from its default (the default itself runs in every test above):
    the Qwen3.5 tower without deepstack takes every path, chunked so that prefill chunks cut images."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path, _, proc = setup
    s = InProcessScheduler(path, chunked_prefill_size=7)
    rids = [s.submit(ids, mm, max_new_tokens=NEW, ignore_eos=True) for ids, mm in _prompts(proc)]
    s.run_until_idle()
    assert [s.outputs[r] for r in rids] == reference
    graph = s.sched.get_info()["paths"]["vit_graph"]
    assert (graph is not None and graph["replays"] > 0) == ("SGLANG_VIT_ENABLE_CUDA_GRAPH" in env)
    s.assert_no_leak()
