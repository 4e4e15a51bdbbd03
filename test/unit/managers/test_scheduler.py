"""The scheduler end to end in one process: continuous batching, chunked prefill, prefix cache with
image pad values, retraction, aborts and stop conditions, checked against the static-batch runner
(itself checked against transformers) and for KV leaks."""

from __future__ import annotations

import pytest
import torch

from scheduler_utils import InProcessScheduler
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

PLACEHOLDER = [151652, 151655, 151653]


def _noise(w, h, seed):
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    proc = QwenVLProcessor(None, QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                                                      min_pixels=4 * 32 * 32, max_pixels=48 * 32 * 32))
    runner = ModelRunner(ModelRunnerConfig(model_path=path, dtype="float32", max_total_tokens=4096))
    return path, proc, StaticBatchRunner(runner)


def _text(n, seed):
    return torch.randint(0, 1500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prompts(proc):
    return [
        (_text(12, 0), None),
        proc.process(_text(5, 1) + PLACEHOLDER + _text(7, 2), [_noise(96, 64, 1)]),
        proc.process(PLACEHOLDER + _text(3, 3) + PLACEHOLDER + _text(6, 4), [_noise(64, 64, 2), _noise(40, 130, 3)]),
        proc.process(_text(9, 5) + PLACEHOLDER, [_noise(64, 96, 4)]),
    ]


def _reference(sb, prompts, n):
    out = []
    for ids, mm in prompts:
        seq = StaticSeq(ids, mm)
        out.append(sb.generate_greedy([seq], n)[0])
        sb.release([seq])
    return out


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(chunked_prefill_size=7), dict(disable_radix_cache=True), dict(page_size=4, chunked_prefill_size=16),
     dict(max_running_requests=2)],
    ids=["default", "chunk7", "no_radix", "page4", "max_running2"],
)
def test_greedy_outputs_equal_static_batch(model, kw):
    path, proc, sb = model
    prompts = _prompts(proc)
    ref = _reference(sb, prompts, 6)
    s = InProcessScheduler(path, **kw)
    rids = [s.submit(ids, mm, max_new_tokens=6, ignore_eos=True) for ids, mm in prompts]
    s.run_until_idle()
    assert [s.outputs[r] for r in rids] == ref
    assert all(s.finished[r].type == "length" for r in rids)
    s.assert_no_leak()


def test_retraction_under_tiny_kv_budget_keeps_outputs(model, monkeypatch):
    from sglang.srt.managers import schedule_policy

    # admit optimistically (as a decode-length estimate can be), so decoding runs out of KV
    monkeypatch.setattr(schedule_policy, "DECODE_RESERVE_CLIP", 1)
    path, proc, sb = model
    prompts = [(_text(40, 10 + i), None) for i in range(4)]
    ref = _reference(sb, prompts, 24)
    s = InProcessScheduler(path, max_total_tokens=150, chunked_prefill_size=32)
    rids = [s.submit(ids, None, max_new_tokens=24, ignore_eos=True) for ids, _ in prompts]
    s.run_until_idle()
    assert s.sched.num_retractions > 0, "the budget should force at least one retraction"
    assert [s.outputs[r] for r in rids] == ref
    s.assert_no_leak()


def test_prefix_cache_hits_same_image_only(model):
    path, proc, _ = model
    s = InProcessScheduler(path)
    text_before = _text(10, 20)
    a = proc.process(text_before + PLACEHOLDER + _text(4, 21), [_noise(96, 64, 7)])
    b = proc.process(text_before + PLACEHOLDER + _text(4, 21), [_noise(96, 64, 8)])
    r1 = s.submit(*a, max_new_tokens=2)
    s.run_until_idle()
    r2 = s.submit(*a, max_new_tokens=2)
    s.run_until_idle()
    r3 = s.submit(*b, max_new_tokens=2)
    s.run_until_idle()
    assert s.meta[r1]["cached_tokens"] == 0
    assert s.meta[r2]["cached_tokens"] == len(a[0]) - 1  # everything but the last prompt token
    assert s.meta[r3]["cached_tokens"] == len(text_before) + 1  # up to <|vision_start|>, then the image differs
    s.assert_no_leak()


def test_abort_while_decoding_and_waiting_frees_everything(model):
    path, proc, _ = model
    s = InProcessScheduler(path, max_running_requests=1)
    r1 = s.submit(_text(20, 30), None, max_new_tokens=50, ignore_eos=True, stream=True)
    r2 = s.submit(_text(20, 31), None, max_new_tokens=50, ignore_eos=True)
    for _ in range(3):
        s.step()
    assert s.outputs[r1], "streamed tokens arrive before the end"
    s.sched.handle_abort(r1, "client gone")
    s.sched.handle_abort(r2, "client gone")
    s.run_until_idle()
    assert s.finished[r1].type == "abort" and s.finished[r2].type == "abort"
    s.assert_no_leak()


def test_stop_conditions(model):
    path, proc, sb = model
    ids = _text(15, 40)
    (ref,) = _reference(sb, [(ids, None)], 8)
    s = InProcessScheduler(path)
    r1 = s.submit(ids, None, max_new_tokens=8, stop_token_ids=[ref[3]], ignore_eos=True)
    text = s.sched.tokenizer.decode(ref[:5])
    r2 = s.submit(ids, None, max_new_tokens=8, stop=[text[-3:]], ignore_eos=True)
    s.run_until_idle()
    assert s.outputs[r1] == ref[: ref.index(ref[3]) + 1] and s.finished[r1].matched == ref[3]
    assert s.finished[r2].type == "stop" and s.finished[r2].matched == text[-3:]
    assert len(s.outputs[r2]) <= 5


def test_stop_regex_ends_at_the_first_step_whose_output_end_matches(model):
    """The oracle replays the greedy reference token by token: the request must stop at the first
    length whose decoded output (its last WINDOW_TOKENS tokens) contains a match."""
    import regex

    from sglang.srt.sampling.stop_regex import WINDOW_TOKENS

    path, proc, sb = model
    ids = _text(15, 41)
    (ref,) = _reference(sb, [(ids, None)], 8)
    s = InProcessScheduler(path)
    tok = s.sched.tokenizer
    full = tok.decode(ref)
    pattern = regex.escape(full[len(full) // 2]) + ".?"  # a character from the middle, then any one
    expected = next(k for k in range(1, len(ref) + 1)
                    if regex.search(pattern, tok.decode(ref[:k][-WINDOW_TOKENS:])))
    trimmed = s.submit(ids, None, max_new_tokens=8, stop_regex=[pattern], ignore_eos=True)
    kept = s.submit(ids, None, max_new_tokens=8, stop_regex=[pattern], ignore_eos=True, no_stop_trim=True)
    s.run_until_idle()
    for rid in (trimmed, kept):
        assert s.outputs[rid] == ref[:expected]
        assert s.finished[rid].type == "stop" and s.finished[rid].matched == pattern
    text = tok.decode(ref[:expected])
    match = regex.search(pattern, text)
    fr = s.finished[trimmed]
    assert fr.stop_text == match.group(0) and fr.stop_chars_after == len(text) - match.end()
    assert text[: fr.stop_cut(text)] == text[: match.start()]
    assert s.finished[kept].stop_text is None and s.finished[kept].stop_cut(text) is None


def test_a_backtracking_stop_regex_ends_its_own_request_with_a_400_and_the_other_finishes(model, monkeypatch):
    """(a|aa)+b over a run of a's doubles its search time every ~1.5 tokens (274 s by the 38th token):
    the search is cut at its budget and only that request ends. The budget applies to the ordinary
    request's searches too, so it leaves a loaded machine room (500 ms, reached by the hostile search
    near its 24th token, against microseconds for the ordinary pattern)."""
    monkeypatch.setenv("SGLANG_STOP_REGEX_TIMEOUT_MS", "500")
    path, _, _ = model
    s = InProcessScheduler(path)
    a = s.sched.tokenizer.encode("a", add_special_tokens=False)
    assert len(a) == 1
    hostile = s.submit(_text(15, 42), None, max_new_tokens=60, ignore_eos=True, stop_regex=["(a|aa)+b"],
                       logit_bias={a[0]: 100.0})
    ordinary = s.submit(_text(15, 43), None, max_new_tokens=8, ignore_eos=True, stop_regex=[r"\d+ apples"])
    s.run_until_idle()
    fr = s.finished[hostile]
    assert fr.type == "abort" and fr.status_code == 400 and "SGLANG_STOP_REGEX_TIMEOUT_MS" in fr.message
    assert 0 < len(s.outputs[hostile]) < 60 and set(s.outputs[hostile]) == {a[0]}
    assert s.finished[ordinary].type == "length" and len(s.outputs[ordinary]) == 8
    s.assert_no_leak()


def test_requests_breaking_the_schedulers_invariants_are_rejected_with_400(model):
    """Parameters and image counts are validated by the RequestBuilder (test_request_builder.py); the
    scheduler still refuses what would break its own structures, whoever sent it."""
    path, proc, _ = model
    s = InProcessScheduler(path, context_length=64, max_total_tokens=40)
    r1 = s.submit(_text(80, 50), None, max_new_tokens=4)
    r2 = s.submit([], None, max_new_tokens=4)
    r3 = s.submit(_text(30, 51), None, max_new_tokens=20)
    s.run_until_idle()
    for rid, word in [(r1, "context length"), (r2, "empty"), (r3, "KV cache holds 40")]:
        assert s.finished[rid].type == "abort" and s.finished[rid].status_code == 400
        assert word in s.finished[rid].message
    s.assert_no_leak()


def test_paged_allocation_keeps_requests_on_whole_pages(model):
    path, proc, sb = model
    prompts = _prompts(proc)
    ref = _reference(sb, prompts, 5)
    s = InProcessScheduler(path, page_size=8, chunked_prefill_size=13)
    rids = [s.submit(ids, mm, max_new_tokens=5, ignore_eos=True) for ids, mm in prompts]
    seen_pages = {}
    while not s.sched.is_idle():
        s.step()
        for r in s.sched.running:
            pages = (r.kv_indices // 8).tolist()
            positions = list(range(r.kv_len))
            # token i of a request lives in page slot i % 8 of its (i // 8)-th page
            assert [int(k) % 8 for k in r.kv_indices] == [p % 8 for p in positions]
            assert len(set(pages)) == -(-r.kv_len // 8)
            seen_pages[r.rid] = pages
    s._drain()
    assert [s.outputs[r] for r in rids] == ref
    assert seen_pages
    s.assert_no_leak()


def test_one_failing_request_ends_alone_and_the_loop_goes_on(model):
    """An exception inside one request's processing (here: its stop-string check) ends that request
    with a 500 and frees its KV; the request beside it finishes normally."""
    path, proc, sb = model
    s = InProcessScheduler(path)

    class ExplodingTokenizer:
        def decode(self, ids):
            raise RuntimeError("tokenizer exploded")

    s.sched._tokenizer = ExplodingTokenizer()
    bad = s.submit(_text(8, 1), max_new_tokens=4, stop=["never"])
    good = s.submit(_text(9, 2), max_new_tokens=4, ignore_eos=True)
    s.run_until_idle()
    assert s.finished[bad].type == "abort" and s.finished[bad].status_code == 500
    assert "tokenizer exploded" in s.finished[bad].message
    assert s.finished[good].type == "length" and len(s.outputs[good]) == 4
    assert s.sched.get_info()["num_request_errors"] == 1
    s.assert_no_leak()


def test_failing_forward_ends_its_batch_and_the_next_request_runs(model, monkeypatch):
    path, proc, sb = model
    s = InProcessScheduler(path)
    real = s.sched.worker.forward_batch_generation
    calls = {"n": 0}

    def flaky(batch, *a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("bad shapes in this batch")
        return real(batch, *a, **k)

    monkeypatch.setattr(s.sched.worker, "forward_batch_generation", flaky)
    first = s.submit(_text(8, 3), max_new_tokens=3)
    s.run_until_idle()
    assert s.finished[first].type == "abort" and s.finished[first].status_code == 500
    second = s.submit(_text(8, 4), max_new_tokens=3, ignore_eos=True)
    s.run_until_idle()
    assert s.finished[second].type == "length" and len(s.outputs[second]) == 3
    # the failed step's KV was never computed: its prompt is not served from the prefix cache
    again = s.submit(_text(8, 3), max_new_tokens=3, ignore_eos=True)
    s.run_until_idle()
    assert s.meta[again]["cached_tokens"] == 0 and len(s.outputs[again]) == 3
    s.assert_no_leak()


def test_prompt_plus_max_new_tokens_beyond_the_pool_is_rejected(model):
    path, proc, sb = model
    s = InProcessScheduler(path, max_total_tokens=64)
    rid = s.submit(_text(40, 5), max_new_tokens=50)
    s.run_until_idle()
    r = s.finished[rid]
    assert r.type == "abort" and r.status_code == 400 and "40" in r.message and "50" in r.message and "64" in r.message
    s.assert_no_leak()


def test_data_parallel_replicas_draw_their_own_seed_streams(model):
    path, _, _ = model
    prompt = _text(12, 7)

    def sampled(dp_rank: int, **kw) -> list[int]:
        s = InProcessScheduler(path, dp_rank=dp_rank, random_seed=3, **kw)
        rid = s.submit(prompt, max_new_tokens=16, temperature=1.0, ignore_eos=True)  # no per-request seed
        s.run_until_idle()
        return s.outputs[rid]

    # the same unseeded request on each replica (what an n=2 chat split across them sends) samples apart;
    # replica 0 keeps --random-seed's own stream, so a single server's outputs do not move
    first = sampled(0, dp_size=2)
    assert sampled(1, dp_size=2) != first
    assert sampled(0) == first


def test_get_load_counts_prompt_tokens_still_to_prefill(model):
    """/get_load's num_pending_tokens (upstream's newer field): waiting prompts plus the rest of the prompt
    being prefilled in chunks; num_tokens adds the KV held; ts_tic moves forward."""
    path, _, _ = model
    s = InProcessScheduler(path, chunked_prefill_size=16)
    s.submit(_text(40, 1), None, max_new_tokens=2, ignore_eos=True)
    s.submit(_text(30, 2), None, max_new_tokens=2, ignore_eos=True)
    first = s.sched.get_load()
    assert (first.num_reqs, first.num_waiting_reqs, first.num_pending_tokens, first.num_tokens) == (2, 2, 70, 70)
    s.step()  # the first 16 tokens of the 40-token prompt
    load = s.sched.get_load()
    assert s.sched.chunked_req is not None and load.num_pending_tokens == 70 - 16 and load.num_tokens == 16 + 30
    assert load.ts_tic > first.ts_tic
    s.run_until_idle()
    idle = s.sched.get_load()
    assert (idle.num_reqs, idle.num_pending_tokens, idle.num_tokens) == (0, 0, 0)
    s.assert_no_leak()
