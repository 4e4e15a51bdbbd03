"""Videos through our Qwen3-VL / Qwen2.5-VL / Qwen3-VL-MoE against transformers on the same random weights (float32):
transformers' model is fed OUR processor's pixel_values_videos / video_grid_thw (and Qwen2.5-VL's
second_per_grid_ts) on the same prompt ids; logits of every prompt position agree within 1e-4 relative
error and greedy tokens are identical: video alone, video + images in any order, two videos, and chunked
prefill cutting through a video."""

from __future__ import annotations

import pytest
import torch

from parity_utils import TEST_DEVICE, hf_greedy, hf_kwargs, make_runner, noise_image, our_greedy, our_logits, rel_err

transformers = pytest.importorskip("transformers")
pytest.importorskip("av")

from sglang.srt.multimodal.mm_types import Modality  # noqa: E402
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor  # noqa: E402
from sglang.testing.sample_video import make_clip  # noqa: E402

VIDEO_PAD, IMAGE_PAD, VISION_START, VISION_END = 151656, 151655, 151652, 151653
MODELS = ("qwen3-vl-tiny", "qwen2.5-vl-tiny", "qwen3-vl-moe-tiny")  # the MoE: Qwen3-VL's tower, sparse decoder


@pytest.fixture(scope="module", params=MODELS)
def setup(request, tiny_model_dir):
    path = str(tiny_model_dir(request.param))
    hf = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval().to(TEST_DEVICE)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    proc = QwenVLProcessor.from_pretrained(path, tok)
    _, sb = make_runner(path)
    return request.param, hf, sb, proc


def _text(n: int, seed: int) -> list[int]:
    return torch.randint(0, 5000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prompt(parts, proc, seed=0, **kw):
    """parts: ints (text lengths), ("img", w, h) and ("vid", w, h, fps, seconds), in prompt order."""
    ids, images, videos = [], [], []
    for k, p in enumerate(parts):
        if isinstance(p, int):
            ids += _text(p, seed * 100 + k)
        elif p[0] == "img":
            ids += [VISION_START, IMAGE_PAD, VISION_END]
            images.append(noise_image(p[1], p[2], seed * 100 + k))
        else:
            ids += [VISION_START, VIDEO_PAD, VISION_END]
            videos.append(make_clip(p[1], p[2], p[3], p[4], seed=seed * 100 + k))
    return proc.process(ids, images, videos=videos, **kw)


CASES = {
    "video_only": [5, ("vid", 67, 45, 10, 1.5), 6],
    "video_then_image": [3, ("vid", 96, 64, 8, 2.0), 4, ("img", 64, 96), 2],
    "image_then_two_videos": [2, ("img", 80, 64), 3, ("vid", 64, 64, 5, 2.4), 2, ("vid", 51, 77, 24, 1.0), 4],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_video_prompt_logits_match_transformers(setup, case):
    name, hf, sb, proc = setup
    ids, mm = _prompt(CASES[case], proc, seed=len(case))
    assert any(it.modality == Modality.VIDEO and it.image_grid_thw[0] >= 2 for it in mm.mm_items)
    with torch.no_grad():
        ref = hf(**hf_kwargs(hf, ids, mm)).logits[0].float().cpu()
    (ours,) = our_logits(sb, [(ids, mm)])
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) <= 1e-4, f"{name}/{case}"


@pytest.mark.parametrize("chunk", [5, 16])
def test_chunked_prefill_through_a_video_matches(setup, chunk):
    name, hf, sb, proc = setup
    ids, mm = _prompt([3, ("vid", 160, 112, 10, 2.0), 4], proc, seed=7)
    video = mm.mm_items[0]
    s, e = video.offsets[0][0], video.offsets[-1][1]
    assert any(s < b < e for b in range(chunk, len(ids), chunk)), "a chunk boundary must fall inside the video"
    with torch.no_grad():
        ref = hf(**hf_kwargs(hf, ids, mm)).logits[0].float().cpu()
    (ours,) = our_logits(sb, [(ids, mm)], chunk_size=chunk)
    assert rel_err(ours, ref) <= 1e-4


def test_greedy_tokens_match_generate_with_video(setup):
    name, hf, sb, proc = setup
    ids, mm = _prompt([4, ("vid", 64, 48, 12, 2.5), 3, ("img", 64, 64), 2], proc, seed=9)
    assert our_greedy(sb, ids, mm) == hf_greedy(hf, hf_kwargs(hf, ids, mm))


def test_qwen25_time_step_changes_positions_not_pixels(setup):
    """second_per_grid_ts reaches M-RoPE: the same frames at another sampled rate move the video's
    temporal positions (Qwen2.5-VL); Qwen3-VL encodes time as timestamp text instead."""
    name, hf, sb, proc = setup
    ids = [1, 2, VISION_START, VIDEO_PAD, VISION_END, 3]
    frames = [noise_image(64, 64, s) for s in range(4)]
    a_ids, a = proc.process(ids, [], videos=[frames])
    _, vcfg = proc.media_config({"fps": 1.0})
    b_ids, b = proc.process(ids, [], videos=[frames], video_config=vcfg)
    assert torch.equal(a.mm_items[0].feature, b.mm_items[0].feature)
    if "qwen2" in name:
        assert a_ids == b_ids and not torch.equal(a.mrope_positions, b.mrope_positions)
    else:
        assert a_ids != b_ids  # the timestamps in the prompt differ
