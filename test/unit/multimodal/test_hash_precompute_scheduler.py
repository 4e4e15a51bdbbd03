"""mm-hash-precompute through the scheduler, on Qwen3-VL and Qwen3.5: requests hashed by the tokenizer
(switch 1) and requests hashed in the scheduler loop (switch 0, the baseline) get the same tokens, the same
prefix-cache hits (cached_tokens) and the same vision-encoder work (vit_encoded_images); the `hash` stage
is timed once, where the hashing happened."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "managers"))
from scheduler_utils import InProcessScheduler  # noqa: E402

from sglang.srt.multimodal.hashing import configured_hash_algo, precompute_item_hashes  # noqa: E402
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor  # noqa: E402

def _img(seed, w=64, h=64):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


# Qwen3.5: the hybrid DeltaNet decoder, whose prefix hits resume from state snapshots at the images' ends
@pytest.fixture(scope="module", params=["qwen3-vl-tiny", "qwen3.5-tiny"])
def setup(request, tiny_model_dir):
    path = str(tiny_model_dir(request.param))
    return path, QwenVLProcessor.from_pretrained(path)  # the checkpoint's special ids


def _prompt(proc, seeds, precompute: bool):
    ids = [100, 101, 102]
    for k in range(len(seeds)):
        ids += [proc.vision_start_token_id, proc.image_token_id, proc.vision_end_token_id, 200 + k]
    ids, mm = proc.process(ids, [_img(s, 64 + 32 * (s % 2), 64) for s in seeds])
    if precompute:  # what RequestBuilder.build does in the tokenizer process
        precompute_item_hashes(mm, configured_hash_algo())
    return ids, mm


# Same images again (full prefix hit), a shared first image (partial hit + embedding reuse), new ones.
WORKLOAD = [[1, 2], [1, 2], [1, 3], [4, 5, 2], [4, 5, 2]]


def _run(setup, monkeypatch, switch: str, **kw):
    path, proc = setup
    monkeypatch.setenv("SGLANG_MM_PRECOMPUTE_HASH", switch)
    monkeypatch.delenv("SGLANG_MM_HASH_ALGO", raising=False)
    s = InProcessScheduler(path, **kw)
    rows = []
    for seeds in WORKLOAD:  # one at a time, so each request sees its predecessors' cache entries
        ids, mm = _prompt(proc, seeds, precompute=switch != "0")
        rid = s.submit(ids, mm, max_new_tokens=3, ignore_eos=True)
        s.run_until_idle()
        rows.append((s.outputs[rid], s.meta[rid]["cached_tokens"], s.meta[rid]["vit_encoded_images"]))
    s.assert_no_leak()
    return rows


@pytest.mark.parametrize("kw", [{}, {"chunked_prefill_size": 24}], ids=["whole", "chunked"])
def test_same_outputs_and_cache_behaviour_both_ways(setup, monkeypatch, kw):
    off = _run(setup, monkeypatch, "0", **kw)
    on = _run(setup, monkeypatch, "1", **kw)
    assert on == off
    cached = [c for _, c, _ in on]
    assert cached[0] == 0 and cached[1] > 0 and cached[4] > 0  # the radix cache matched image tokens
    assert on[1][2] == 0  # the repeated request encoded no image


def test_hash_stage_timed_once_where_it_ran(setup, monkeypatch):
    path, proc = setup
    monkeypatch.setenv("SGLANG_MM_PRECOMPUTE_HASH", "1")
    s = InProcessScheduler(path, enable_vlm_stage_timer=True)
    # Precomputed upstream: the request carries the tokenizer's `hash` timing; the scheduler keeps it.
    ids, mm = _prompt(proc, [7, 8], precompute=True)
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    msg = TokenizedGenerateReqInput("up", ids, SamplingParams(max_new_tokens=1, temperature=0.0), mm,
                                    stage_timings_ms={"processor": 1.0, "hash": 123.0})
    s.sched.process_input_requests([msg])
    s.outputs["up"] = []
    # Unhashed (reached the scheduler another way): hashed and timed here.
    ids2, mm2 = _prompt(proc, [9], precompute=False)
    rid = s.submit(ids2, mm2, max_new_tokens=1)
    s.run_until_idle()
    assert s.meta["up"]["stage_timings_ms"]["hash"] == 123.0
    assert all(it.hash is not None for it in mm2.mm_items)
    assert "hash" in s.meta[rid]["stage_timings_ms"]
