"""Our Qwen3-VL / Qwen3-VL-MoE / Qwen2.5-VL against transformers on the same weights (float32): logits of every
prompt position within 1e-4 relative error, and identical greedy tokens."""

from __future__ import annotations

import pytest
import torch

from parity_utils import (
    PLACEHOLDER,
    TEST_DEVICE,
    hf_greedy,
    hf_inputs,
    hf_logits,
    make_runner,
    noise_image,
    our_greedy,
    our_logits,
    rel_err,
    small_processor,
)

transformers = pytest.importorskip("transformers")

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MODELS = {
    "qwen3-vl-tiny": dict(patch=16, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    # sparse layers 0, 1, 3 (8 experts, top 2, renormalized), dense layer 2; experts in the released layout
    "qwen3-vl-moe-tiny": dict(patch=16, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    "qwen2.5-vl-tiny": dict(patch=14, mean=CLIP_MEAN, std=CLIP_STD),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def setup(request, tiny_model_dir):
    name = request.param
    path = str(tiny_model_dir(name))
    hf = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval().to(TEST_DEVICE)
    runner, sb = make_runner(path)
    proc = small_processor(path, **MODELS[name])
    return name, hf, sb, proc


def _text(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 5000, (n,), generator=g).tolist()


def _prompt(parts, proc, seed=0):
    """parts: ints (text lengths) and (w, h) tuples (images), in order."""
    ids, images = [], []
    for k, p in enumerate(parts):
        if isinstance(p, int):
            ids += _text(p, seed * 100 + k)
        else:
            ids += PLACEHOLDER
            images.append(noise_image(p[0], p[1], seed * 100 + k))
    return proc.process(ids, images)


CASES = {
    "text_only": [23],
    "one_image": [5, (96, 64), 7],
    "three_images_mixed_sizes": [3, (96, 64), 4, (40, 130), 2, (600, 28), 6],
    "image_first": [(80, 80), 9],
    "image_last": [9, (64, 96)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_prompt_logits_match_transformers(setup, case):
    name, hf, sb, proc = setup
    ids, mm = _prompt(CASES[case], proc)
    ref = hf_logits(hf, ids, mm.mm_items)
    (ours,) = our_logits(sb, [(ids, mm if mm.mm_items else None)])
    assert ours.shape == ref.shape
    assert rel_err(ours, ref) <= 1e-4, f"{name}/{case}"


def test_batch_of_two_prompts_matches_each_alone(setup):
    name, hf, sb, proc = setup
    a = _prompt([4, (96, 64), 6], proc, seed=1)
    b = _prompt([11, (64, 64), 3, (32, 96), 2], proc, seed=2)
    outs = our_logits(sb, [a, b])
    for (ids, mm), ours in zip([a, b], outs):
        assert rel_err(ours, hf_logits(hf, ids, mm.mm_items)) <= 1e-4


@pytest.mark.parametrize("chunk", [3, 7, 16])
def test_chunked_prefill_splitting_images_matches(setup, chunk):
    name, hf, sb, proc = setup
    ids, mm = _prompt([3, (96, 64), 4, (64, 64), 5], proc, seed=3)
    assert any(s % chunk for it in mm.mm_items for s, _ in it.offsets), "a chunk boundary must fall inside an image"
    (ours,) = our_logits(sb, [(ids, mm)], chunk_size=chunk)
    assert rel_err(ours, hf_logits(hf, ids, mm.mm_items)) <= 1e-4


def test_greedy_tokens_match_generate(setup):
    name, hf, sb, proc = setup
    ids, mm = _prompt([6, (96, 64), 5], proc, seed=4)
    assert our_greedy(sb, ids, mm) == hf_greedy(hf, hf_inputs(hf, ids, mm.mm_items))


# bf16: the same weights in bf16 on both sides, judged against the float32 reference. transformers' own
# bf16 logits sit 2-10% (max-abs relative) off its float32 ones on these random-weight models (CPU and an
# H200, 2026-11-26), so a fixed bound on ours-vs-transformers-bf16 measures two roundings at once (5.1e-2 on
# the H200 against the 3e-2 once written here). The claim is that ours rounds no worse than transformers:
# our bf16 error against float32 within BF16_ERR_RATIO of transformers' bf16 error, and our greedy tokens
# agreeing with the float32 ones nearly as often as transformers' bf16 tokens do (a MoE router flips
# experts in bf16: both sides' logits move by ~0.7 of their range there, and agreement drops with it).
BF16_ERR_RATIO = 1.5
BF16_AGREEMENT_SLACK = 0.15
BF16_DEVICES = [pytest.param("cpu", marks=pytest.mark.slow),
                pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
                    not torch.cuda.is_available(), reason="needs CUDA")])]


@pytest.mark.parametrize("device", BF16_DEVICES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_bf16_rounds_no_worse_than_transformers(tiny_model_dir, name, device):
    path = str(tiny_model_dir(name))
    hf32 = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval().to(device)
    hf = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.bfloat16).eval().to(device)
    _, sb = make_runner(path, dtype="bfloat16", device=device)
    proc = small_processor(path, **MODELS[name])
    ours_errs, hf_errs, agree, hf_agree, total = [], [], 0, 0, 0
    for seed, case in enumerate(sorted(CASES)):
        ids, mm = _prompt(CASES[case], proc, seed=seed)
        (ours,) = our_logits(sb, [(ids, mm)])
        ref = hf_logits(hf32, ids, mm.mm_items)
        ours_errs.append(rel_err(ours, ref))
        hf_errs.append(rel_err(hf_logits(hf, ids, mm.mm_items), ref))
        mine = our_greedy(sb, ids, mm)
        want, theirs = (hf_greedy(model, hf_inputs(model, ids, mm.mm_items)) for model in (hf32, hf))
        agree += sum(a == b for a, b in zip(mine, want))
        hf_agree += sum(a == b for a, b in zip(theirs, want))
        total += len(want)
    where = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"\n{name} bf16 on {where}: max logit rel err vs float32: ours {max(ours_errs):.2e}, transformers "
          f"{max(hf_errs):.2e}; greedy tokens equal to float32's: ours {agree}/{total}, transformers {hf_agree}/{total}")
    assert max(ours_errs) <= BF16_ERR_RATIO * max(hf_errs)
    assert agree / total >= hf_agree / total - BF16_AGREEMENT_SLACK
