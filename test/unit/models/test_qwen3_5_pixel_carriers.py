"""SGLANG_MM_UINT8_PIXELS and SGLANG_MM_COMPACT_STILL_IMAGES on Qwen3.5 (the Qwen3-VL tower without deepstack,
ahead of the hybrid DeltaNet decoder) against transformers on the same random weights (float32), through the
standalone driver (qwen3_5_driver.py): our model gets the switched processor's carriers (uint8 pixels
normalized where the tower runs; compact still images, one temporal frame), transformers the baseline
processor's float32 pixel values for the same prompt. Logits of every prompt position within 1e-4 relative
error and identical greedy tokens, for images, videos beside images, chunked prefill cutting through the
items (DeltaNet states carried over the cut), and both switches together. The Qwen3-VL / Qwen2.5-VL cases
are test_uint8_pixels_parity.py and test_compact_still_images_parity.py."""

from __future__ import annotations

import pytest
import torch

from qwen3_5_driver import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, Qwen3_5Driver, noise_image, ref_kwargs, text_ids
from sglang.srt.model_loader.loader import get_model
from sglang.srt.multimodal.hashing import ensure_item_hashes
from sglang.srt.multimodal.mm_types import Modality
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from sglang.testing.sample_video import make_clip  # noqa: E402

TOL = 1e-4
SWITCHES = {"uint8": {"uint8_pixels": True}, "compact": {"compact_still_images": True},
            "uint8_compact": {"uint8_pixels": True, "compact_still_images": True}}


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    path = str(tiny_model_dir("qwen3.5-tiny"))
    transformers.logging.set_verbosity_error()
    ref = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)  # video timestamps are text tokens
    procs = {"base": QwenVLProcessor.from_pretrained(path, tok)}
    for name, flags in SWITCHES.items():
        procs[name] = QwenVLProcessor.from_pretrained(path, tok)
        for attr, value in flags.items():
            setattr(procs[name], attr, value)
    return ref, get_model(path, dtype="float32"), procs


def _prompts(parts, procs, switch: str, seed: int = 0):
    """(ids, baseline mm, switched mm); parts: ints (text lengths), ("img", w, h, seed), ("vid", w, h, fps, s)."""
    ids, images, videos = [], [], []
    for k, p in enumerate(parts):
        if isinstance(p, int):
            ids += text_ids(p, seed * 100 + k)
        elif p[0] == "img":
            ids += [VISION_START, IMAGE_PAD, VISION_END]
            images.append(noise_image(p[3], p[1], p[2]))
        else:
            ids += [VISION_START, VIDEO_PAD, VISION_END]
            videos.append(make_clip(p[1], p[2], p[3], p[4], seed=seed * 100 + k))
    b_ids, b = procs["base"].process(ids, images, videos=videos)
    s_ids, s = procs[switch].process(ids, images, videos=videos)
    assert b_ids == s_ids and torch.equal(b.mrope_positions, s.mrope_positions)
    uint8, compact = (SWITCHES[switch].get(k, False) for k in ("uint8_pixels", "compact_still_images"))
    for bi, si in zip(b.mm_items, s.mm_items):  # the switched carriers are what the model gets
        assert (si.feature.dtype == torch.uint8 and si.pixel_norm is not None) == uint8
        if compact and not uint8 and bi.modality == Modality.IMAGE:
            assert bi.feature.numel() == 2 * si.feature.numel()  # one temporal frame of two
        if compact and uint8:
            assert si.pixel_norm.temporal_patch_size == (1 if bi.modality == Modality.IMAGE else 2)
    ensure_item_hashes(s)  # as the tokenizer does: the per-image ViT cache keys on the carrier's hash
    return b_ids, b, s


def _ref_logits(ref, ids, mm) -> torch.Tensor:
    with torch.no_grad():
        return ref(**ref_kwargs(ids, mm)).logits[0]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


CASES = {
    "images": [3, ("img", 96, 64, 1), 4, ("img", 40, 130, 2), 2],
    "video_image": [2, ("vid", 64, 64, 5, 2.4), 3, ("img", 80, 64, 3), 4],
    "same_image_twice": [2, ("img", 64, 96, 4), 3, ("img", 64, 96, 4), 2],
}


@pytest.mark.parametrize("switch", sorted(SWITCHES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_prompt_logits_match_transformers(setup, switch, case):
    ref, ours, procs = setup
    ids, b, s = _prompts(CASES[case], procs, switch, seed=len(case))
    driver = Qwen3_5Driver(ours)
    driver.add("r", ids, s)
    got, want = driver.prefill("r"), _ref_logits(ref, ids, b)
    assert got.shape == want.shape
    assert _rel(got, want) <= TOL, f"{switch}/{case}"


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_chunked_prefill_through_the_items_matches(setup, switch):
    ref, ours, procs = setup
    ids, b, s = _prompts([3, ("img", 96, 64, 5), 2, ("vid", 64, 48, 6, 1.0), 2, ("img", 64, 64, 8), 4], procs,
                         switch, seed=7)
    chunk = 5
    assert sum(bool(a % chunk) for it in s.mm_items for a, _ in it.offsets) >= 2, "chunks must cut items"
    driver = Qwen3_5Driver(ours)
    driver.add("r", ids, s)
    assert _rel(driver.prefill("r", chunk), _ref_logits(ref, ids, b)) <= TOL


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_greedy_tokens_match_generate(setup, switch):
    ref, ours, procs = setup
    ids, b, s = _prompts([4, ("vid", 64, 48, 12, 2.5), 3, ("img", 64, 64, 6), 2], procs, switch, seed=9)
    driver = Qwen3_5Driver(ours)
    driver.add("r", ids, s)
    tokens, _ = driver.greedy("r", 6, chunks=7)
    kw = ref_kwargs(ids, b)
    with torch.no_grad():
        out = ref.generate(**kw, attention_mask=torch.ones_like(kw["input_ids"]), max_new_tokens=6, min_new_tokens=6,
                           do_sample=False)
    assert tokens == out[0, len(ids):].tolist()
