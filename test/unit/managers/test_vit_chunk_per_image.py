"""vit-chunk-per-image through the scheduler, on Qwen3-VL and on Qwen3.5 (hybrid DeltaNet decoder): outputs
equal to the baseline path for several chunk sizes, also when later requests resume from the prefix cache
after shared images (Qwen3.5: from state snapshots at the images' ends, or inside an image); partial image
overlap between requests encodes only the new image, and a cache smaller than one request's images still
encodes each image once per request (the baseline recomputes)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from scheduler_utils import InProcessScheduler
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

def _img(seed, w=64, h=64):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _prompt(proc, seeds, sizes=None, question=(200,)):
    ids = [100, 101, 102]
    for k in range(len(seeds)):
        ids += [proc.vision_start_token_id, proc.image_token_id, proc.vision_end_token_id, 200 + k]
    sizes = sizes or [(64, 64)] * len(seeds)
    return proc.process(ids + list(question), [_img(s, *wh) for s, wh in zip(seeds, sizes)])


# Qwen3.5: the hybrid DeltaNet decoder, whose prefix cache resumes only at state snapshots (images' ends)
@pytest.fixture(scope="module", params=["qwen3-vl-tiny", "qwen3.5-tiny"])
def setup(request, tiny_model_dir):
    path = str(tiny_model_dir(request.param))
    return path, QwenVLProcessor.from_pretrained(path)  # the checkpoint's special ids


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


@pytest.mark.parametrize("kw", [dict(chunked_prefill_size=5), dict(chunked_prefill_size=16),
                                dict(chunked_prefill_size=7, page_size=16, mamba_track_interval=8)],
                         ids=["chunk5", "chunk16", "page16_resume_mid_image"])
def test_prefix_hits_after_images_equal_to_baseline(setup, monkeypatch, kw):
    """One after the other: three images and a question; the same images, another question; the first two
    images and a new third. The later requests resume from the prefix cache (on Qwen3.5 at the state
    snapshots taken at the images' ends, mid-chunk; with 16-token pages at a page inside the second image,
    where an 8-token interval snapshot lies) and are prefilled in chunks that cut the images: the same tokens
    and cached tokens with the switch on and off, and per image only the new image encoded."""
    path, proc = setup
    sizes = [(64, 64), (96, 64), (64, 160)]
    prompts = [_prompt(proc, [1, 2, 3], sizes, (300, 301)), _prompt(proc, [1, 2, 3], sizes, (302,)),
               _prompt(proc, [1, 2, 4], sizes)]
    chunk = kw["chunked_prefill_size"]
    assert any(a < c < b for _, mm in prompts for it in mm.mm_items for a, b in it.offsets
               for c in range(chunk, b, chunk)), "a prefill chunk must end inside an image"
    rows = {}
    for on in (False, True):
        monkeypatch.setenv("SGLANG_VIT_CHUNK_PER_IMAGE", "1" if on else "0")
        s = InProcessScheduler(path, **kw)
        rows[on] = []
        for ids, mm in prompts:
            rid = s.submit(ids, mm, max_new_tokens=4, ignore_eos=True)
            s.run_until_idle()
            rows[on].append((s.outputs[rid], s.meta[rid]["cached_tokens"], s.meta[rid]["vit_encoded_images"]))
        s.assert_no_leak()
        hybrid = s.sched.worker.model_runner.state_pool is not None
    assert [r[:2] for r in rows[True]] == [r[:2] for r in rows[False]]
    assert [r[2] for r in rows[True]] == [3, 0, 1]  # the third's second image: from the embedding cache
    cached = [r[1] for r in rows[True]]
    spans = [it.offsets[-1] for it in prompts[2][1].mm_items]
    assert cached[0] == 0 and cached[1] >= spans[2][1]
    if "page_size" in kw:
        assert spans[1][0] < cached[2] < spans[1][1], "the third request must resume inside its second image"
    elif hybrid:  # resumed from the deepest snapshot: the end of the last shared image
        assert cached == [0, spans[2][1], spans[1][1]]
    else:
        assert cached[2] >= spans[1][1]
