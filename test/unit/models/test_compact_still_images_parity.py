"""SGLANG_MM_COMPACT_STILL_IMAGES through our Qwen3-VL / Qwen2.5-VL against transformers on the same random
weights (float32): our engine gets still images as one temporal frame (half the bytes), embedded against the
patch kernel folded over time; transformers gets the baseline processor's duplicated pair for the same prompt.
Logits of every prompt position within 1e-4 relative error and identical greedy tokens, for images alone,
images between videos (compact rows widened in the mixed tower call), chunked prefill through them, a
repeated image served from the per-image ViT cache, and a tower behind a ViT graph runner (full rows only);
Qwen3.5's tower (the Qwen3-VL one) embeds compact images like the pair."""

from __future__ import annotations

import pytest
import torch

from parity_utils import TEST_DEVICE, hf_greedy, hf_kwargs, make_runner, noise_image, our_greedy, our_logits, rel_err

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from sglang.srt.multimodal.hashing import ensure_item_hashes  # noqa: E402
from sglang.srt.multimodal.mm_types import Modality  # noqa: E402
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
    compact = QwenVLProcessor.from_pretrained(path, tok)
    compact.compact_still_images = True
    runner, sb = make_runner(path)
    return request.param, hf, runner, sb, base, compact


def _prompts(parts, base, compact, seed=0):
    """(ids, baseline mm, compact mm); parts: ints (text lengths), ("img", w, h, seed), ("vid", w, h, fps, s)."""
    ids, images, videos = [], [], []
    for k, p in enumerate(parts):
        if isinstance(p, int):
            ids += torch.randint(0, 5000, (p,), generator=torch.Generator().manual_seed(seed * 100 + k)).tolist()
        elif p[0] == "img":
            ids += [VISION_START, IMAGE_PAD, VISION_END]
            images.append(noise_image(p[1], p[2], p[3]))
        else:
            ids += [VISION_START, VIDEO_PAD, VISION_END]
            videos.append(make_clip(p[1], p[2], p[3], p[4], seed=seed * 100 + k))
    b_ids, b = base.process(ids, images, videos=videos)
    c_ids, c = compact.process(ids, images, videos=videos)
    assert b_ids == c_ids and torch.equal(b.mrope_positions, c.mrope_positions)
    for bi, ci in zip(b.mm_items, c.mm_items):
        ratio = 2 if bi.modality == Modality.IMAGE else 1  # images: one frame of two; videos unchanged
        assert bi.feature.numel() == ratio * ci.feature.numel(), (bi.modality, bi.feature.shape, ci.feature.shape)
    ensure_item_hashes(c)  # as the tokenizer does: the ViT cache keys on the compact item's hash
    return b_ids, b, c


CASES = {
    "images": [3, ("img", 96, 64, 1), 4, ("img", 40, 130, 2), 2],
    "video_image_video": [2, ("vid", 64, 64, 5, 2.4), 3, ("img", 80, 64, 3), 2, ("vid", 51, 77, 24, 1.0), 4],
    "same_image_twice": [2, ("img", 64, 96, 4), 3, ("img", 64, 96, 4), 2],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compact_prompt_logits_match_transformers(setup, case):
    name, hf, _, sb, base, compact = setup
    ids, b, c = _prompts(CASES[case], base, compact, seed=len(case))
    with torch.no_grad():
        ref = hf(**hf_kwargs(hf, ids, b)).logits[0].float().cpu()
    (ours,) = our_logits(sb, [(ids, c)])
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) <= 1e-4, f"{name}/{case}"


@pytest.mark.parametrize("chunk", [5, 16])
def test_compact_chunked_prefill_matches(setup, chunk):
    name, hf, _, sb, base, compact = setup
    ids, b, c = _prompts([3, ("img", 96, 64, 5), 2, ("img", 64, 64, 8), 4], base, compact, seed=7)
    assert any(s % chunk for it in c.mm_items for s, _ in it.offsets), "a chunk boundary must fall inside an item"
    with torch.no_grad():
        ref = hf(**hf_kwargs(hf, ids, b)).logits[0].float().cpu()
    (ours,) = our_logits(sb, [(ids, c)], chunk_size=chunk)
    assert rel_err(ours, ref) <= 1e-4


def test_compact_greedy_tokens_match_generate(setup):
    name, hf, _, sb, base, compact = setup
    ids, b, c = _prompts([4, ("img", 96, 64, 6), 3, ("vid", 64, 48, 12, 2.5), 2], base, compact, seed=9)
    assert our_greedy(sb, ids, c) == hf_greedy(hf, hf_kwargs(hf, ids, b))


def test_a_vit_graph_runner_gets_full_rows(setup):
    """The ViT CUDA graphs were captured on full-width rows: behind a runner, compact rows are widened (and
    the logits still match)."""
    name, hf, runner, sb, base, compact = setup
    model, widths = runner.model, []

    def graph(pixels, grids):
        widths.append(pixels.shape[1])
        return model.visual(pixels, grids)

    ids, b, c = _prompts([3, ("img", 96, 64, 11), 2], base, compact, seed=11)
    model.vit_graph = graph
    try:
        (ours,) = our_logits(sb, [(ids, c)])
    finally:
        model.vit_graph = None
    v = model.config.vision
    assert widths == [v.in_channels * v.temporal_patch_size * v.patch_size**2]
    with torch.no_grad():
        ref = hf(**hf_kwargs(hf, ids, b)).logits[0].float().cpu()
    assert rel_err(ours, ref) <= 1e-4


def test_qwen3_5_tower_embeds_compact_images_like_the_pair(tiny_model_dir):
    """Qwen3.5 builds the Qwen3-VL tower (the same patch embedding): a compact image's features equal the
    baseline pair's (whose parity with transformers test_qwen3_5_parity.py holds)."""
    from sglang.srt.model_loader.loader import get_model
    from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor

    model = get_model(str(tiny_model_dir("qwen3.5-tiny")), dtype="float32")
    ip = QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3, min_pixels=4 * 32 * 32,
                              max_pixels=48 * 32 * 32)
    procs = [QwenVLProcessor(None, ip, model_type="qwen3_vl") for _ in range(2)]
    procs[1].compact_still_images = True
    imgs = [noise_image(96, 64, 1), noise_image(40, 130, 2)]
    pair, one = (p.process([VISION_START, IMAGE_PAD, VISION_END] * 2, imgs)[1].mm_items for p in procs)
    assert one[0].feature.shape[1] * 2 == pair[0].feature.shape[1]
    with torch.no_grad():
        for a, b in zip(model.get_image_feature(one), model.get_image_feature(pair)):
            assert rel_err(a, b) <= 1e-5
