"""vit-chunk-per-image through the scheduler: outputs equal to the baseline path for several chunk
sizes, partial image overlap between requests encodes only the new image, and a cache smaller than
one request's images still encodes each image once per request (the baseline recomputes)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from scheduler_utils import InProcessScheduler
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

PLACEHOLDER = [151652, 151655, 151653]


def _img(seed, w=64, h=64):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _prompt(proc, seeds, sizes=None):
    ids = [100, 101, 102]
    for k in range(len(seeds)):
        ids += PLACEHOLDER + [200 + k]
    sizes = sizes or [(64, 64)] * len(seeds)
    return proc.process(ids, [_img(s, *wh) for s, wh in zip(seeds, sizes)])


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    return path, QwenVLProcessor.from_pretrained(path)


def _run(path, prompts, monkeypatch, on: bool, **kw):
    monkeypatch.setenv("SGLANG_VIT_CHUNK_PER_IMAGE", "1" if on else "0")
    s = InProcessScheduler(path, **kw)
    rids = [s.submit(ids, mm, max_new_tokens=4, ignore_eos=True) for ids, mm in prompts]
    s.run_until_idle()
    s.assert_no_leak()
    return s, rids


@pytest.mark.parametrize("chunk", [5, 16, 64])
def test_outputs_equal_to_baseline(setup, monkeypatch, chunk):
    path, proc = setup
    sizes = [(64, 64), (96, 64), (64, 160), (128, 64)]
    prompts = [_prompt(proc, [1, 2, 3, 4], sizes), _prompt(proc, [3, 5], sizes[2:])]
    outs = {}
    for on in (False, True):
        s, rids = _run(path, prompts, monkeypatch, on, chunked_prefill_size=chunk)
        outs[on] = [s.outputs[r] for r in rids]
    assert outs[True] == outs[False]


@pytest.mark.parametrize("on,expected", [(True, 1), (False, 32)], ids=["per_image", "baseline"])
def test_request_sharing_31_of_32_images(setup, monkeypatch, on, expected):
    path, proc = setup
    monkeypatch.setenv("SGLANG_VIT_CHUNK_PER_IMAGE", "1" if on else "0")
    # no prefix cache: the reuse measured here is the embedding cache's alone
    s = InProcessScheduler(path, chunked_prefill_size=48, disable_radix_cache=True)
    first = s.submit(*_prompt(proc, list(range(32))), max_new_tokens=2)
    s.run_until_idle()
    second = s.submit(*_prompt(proc, [99] + list(range(1, 32))), max_new_tokens=2)
    s.run_until_idle()
    assert s.meta[first]["vit_encoded_images"] == 32
    assert s.meta[second]["vit_encoded_images"] == expected


@pytest.mark.parametrize("on,expect_once", [(True, True), (False, False)], ids=["per_image", "baseline"])
def test_cache_smaller_than_one_request(setup, monkeypatch, on, expect_once):
    path, proc = setup
    monkeypatch.setenv("SGLANG_VLM_CACHE_SIZE_MB", "0")
    prompts = [_prompt(proc, list(range(8)), [(64, 96)] * 8)]
    s, (rid,) = _run(path, prompts, monkeypatch, on, chunked_prefill_size=8)
    encoded = s.meta[rid]["vit_encoded_images"]
    if expect_once:
        assert encoded == 8
    else:
        assert encoded > 8, "the baseline re-encodes the whole image set for every chunk"
