"""Our Qwen3-VL / Qwen3-VL-MoE / Qwen2.5-VL against transformers on the same weights (float32): logits of every
prompt position within 1e-4 relative error, and identical greedy tokens."""

from __future__ import annotations

import pytest
import torch

from parity_utils import (
    PLACEHOLDER,
    TEST_DEVICE,
    hf_inputs,
    hf_logits,
    make_runner,
    noise_image,
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
    from sglang.srt.model_executor.static_batch import StaticSeq

    ids, mm = _prompt([6, (96, 64), 5], proc, seed=4)
    seq = StaticSeq(ids, mm)
    try:
        ours = sb.generate_greedy([seq], max_new_tokens=8)[0]
    finally:
        sb.release([seq])
    kwargs = hf_inputs(hf, ids, mm.mm_items)
    with torch.no_grad():
        ref = hf.generate(
            **kwargs,
            attention_mask=torch.ones_like(kwargs["input_ids"]),
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
        )[0, len(ids) :].tolist()
    assert ours == ref


# bf16 on the GPU: the same weights in bf16 on both sides. Logits differ by rounding, so the bound
# is looser and stated here; greedy agreement over a few prompts is reported (and must stay high).
BF16_LOGIT_REL_TOL = 3e-2
BF16_MIN_GREEDY_AGREEMENT = 0.75


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 parity runs on CUDA only")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_bf16_logits_and_greedy_agreement_on_cuda(tiny_model_dir, name):
    from sglang.srt.model_executor.static_batch import StaticSeq

    path = str(tiny_model_dir(name))
    hf = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.bfloat16).eval().to("cuda")
    _, sb = make_runner(path, dtype="bfloat16", device="cuda")
    proc = small_processor(path, **MODELS[name])
    errs, agree, total = [], 0, 0
    for seed, case in enumerate(sorted(CASES)):
        ids, mm = _prompt(CASES[case], proc, seed=seed)
        (ours,) = our_logits(sb, [(ids, mm)])
        errs.append(rel_err(ours, hf_logits(hf, ids, mm.mm_items)))
        seq = StaticSeq(ids, mm)
        try:
            mine = sb.generate_greedy([seq], max_new_tokens=8)[0]
        finally:
            sb.release([seq])
        kwargs = hf_inputs(hf, ids, mm.mm_items)
        with torch.no_grad():
            ref = hf.generate(**kwargs, attention_mask=torch.ones_like(kwargs["input_ids"]), max_new_tokens=8,
                              min_new_tokens=8, do_sample=False)[0, len(ids):].tolist()
        agree += sum(a == b for a, b in zip(mine, ref))
        total += len(ref)
    print(f"\n{name} bf16 on {torch.cuda.get_device_name()}: max logit rel err {max(errs):.2e}, "
          f"greedy agreement {agree}/{total} = {agree / total:.1%}")
    assert max(errs) <= BF16_LOGIT_REL_TOL
    assert agree / total >= BF16_MIN_GREEDY_AGREEMENT
