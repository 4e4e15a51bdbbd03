"""SGLANG_MM_UINT8_PIXELS through our Qwen3-VL / Qwen2.5-VL against transformers on the same random weights
(float32): our engine gets the uint8 carriers (normalized where the vision tower runs), transformers the
baseline processor's float32 pixel values for the same prompt; logits of every prompt position within
1e-4 relative error and identical greedy tokens, for images, videos, both mixed, chunked prefill cutting
through them, and a repeated image served from the per-image ViT cache (hashed as the uint8 carrier)."""

from __future__ import annotations

import pytest
import torch

from parity_utils import TEST_DEVICE, hf_greedy, hf_kwargs, make_runner, noise_image, our_greedy, our_logits, rel_err

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from sglang.srt.multimodal.hashing import ensure_item_hashes  # noqa: E402
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor  # noqa: E402
from sglang.testing.sample_video import make_clip  # noqa: E402

VIDEO_PAD, IMAGE_PAD, VISION_START, VISION_END = 151656, 151655, 151652, 151653
MODELS = ("qwen3-vl-tiny", "qwen2.5-vl-tiny")


@pytest.fixture(scope="module", params=MODELS)
def setup(request, tiny_model_dir):
    path = str(tiny_model_dir(request.param))
    hf = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval().to(TEST_DEVICE)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    base = QwenVLProcessor.from_pretrained(path, tok)
    u8 = QwenVLProcessor.from_pretrained(path, tok)
    u8.uint8_pixels = True
    _, sb = make_runner(path)
    return request.param, hf, sb, base, u8


def _text(n: int, seed: int) -> list[int]:
    return torch.randint(0, 5000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prompts(parts, base, u8, seed=0):
    """(ids, baseline mm, uint8 mm); parts: ints (text lengths), ("img", w, h, seed), ("vid", w, h, fps, s)."""
    ids, images, videos = [], [], []
    for k, p in enumerate(parts):
        if isinstance(p, int):
            ids += _text(p, seed * 100 + k)
        elif p[0] == "img":
            ids += [VISION_START, IMAGE_PAD, VISION_END]
            images.append(noise_image(p[1], p[2], p[3]))
        else:
            ids += [VISION_START, VIDEO_PAD, VISION_END]
            videos.append(make_clip(p[1], p[2], p[3], p[4], seed=seed * 100 + k))
    b_ids, b = base.process(ids, images, videos=videos)
    u_ids, u = u8.process(ids, images, videos=videos)
    assert b_ids == u_ids and torch.equal(b.mrope_positions, u.mrope_positions)
    assert all(it.feature.dtype == torch.uint8 and it.pixel_norm is not None for it in u.mm_items)
    ensure_item_hashes(u)  # as the tokenizer does: the ViT cache keys on the uint8 hash
    return b_ids, b, u


CASES = {
    "images": [3, ("img", 96, 64, 1), 4, ("img", 40, 130, 2), 2],
    "video": [5, ("vid", 67, 45, 10, 1.5), 6],
    "video_image_video": [2, ("vid", 64, 64, 5, 2.4), 3, ("img", 80, 64, 3), 2, ("vid", 51, 77, 24, 1.0), 4],
    "same_image_twice": [2, ("img", 64, 96, 4), 3, ("img", 64, 96, 4), 2],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_uint8_prompt_logits_match_transformers(setup, case):
    name, hf, sb, base, u8 = setup
    ids, b, u = _prompts(CASES[case], base, u8, seed=len(case))
    with torch.no_grad():
        ref = hf(**hf_kwargs(hf, ids, b)).logits[0].float().cpu()
    (ours,) = our_logits(sb, [(ids, u)])
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) <= 1e-4, f"{name}/{case}"


@pytest.mark.parametrize("chunk", [5, 16])
def test_uint8_chunked_prefill_matches(setup, chunk):
    name, hf, sb, base, u8 = setup
    ids, b, u = _prompts([3, ("img", 96, 64, 5), 2, ("vid", 160, 112, 10, 2.0), 4], base, u8, seed=7)
    assert any(s % chunk for it in u.mm_items for s, _ in it.offsets), "a chunk boundary must fall inside an item"
    with torch.no_grad():
        ref = hf(**hf_kwargs(hf, ids, b)).logits[0].float().cpu()
    (ours,) = our_logits(sb, [(ids, u)], chunk_size=chunk)
    assert rel_err(ours, ref) <= 1e-4


def test_uint8_greedy_tokens_match_generate(setup):
    name, hf, sb, base, u8 = setup
    ids, b, u = _prompts([4, ("vid", 64, 48, 12, 2.5), 3, ("img", 64, 64, 6), 2], base, u8, seed=9)
    assert our_greedy(sb, ids, u) == hf_greedy(hf, hf_kwargs(hf, ids, b))
