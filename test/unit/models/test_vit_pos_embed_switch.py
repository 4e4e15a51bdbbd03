"""SGLANG_VIT_FAST_POS_EMBED on the real loading path: with the switch on and off the same checkpoint
gives the same vision features and logits, both match transformers, the switch-off tower keeps the
baseline path, and the Triton kernel (interpreted on CPU) gives the same features."""

from __future__ import annotations

import pytest
import torch

from parity_utils import PLACEHOLDER, hf_logits, noise_image, our_logits, rel_err, runners_with_switch, small_processor
from test_model_parity import MODELS

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=sorted(MODELS))
def both(request, tiny_model_dir):
    name = request.param
    path = str(tiny_model_dir(name))
    runners = runners_with_switch(path, "SGLANG_VIT_FAST_POS_EMBED")
    hf = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return name, runners, hf, small_processor(path, **MODELS[name])


def _prompt(proc):
    """A square-ish image, a one-window-high strip and a tall one: three distinct grid shapes."""
    ids = [5, *PLACEHOLDER, 6, *PLACEHOLDER, 7, *PLACEHOLDER, 8]
    return proc.process(ids, [noise_image(96, 64, 0), noise_image(600, 28, 1), noise_image(40, 130, 2)])


def test_switch_selects_the_path(both):
    _, runners, _, _ = both
    off, on = runners[False][0].model.visual, runners[True][0].model.visual
    assert off.rotary_ids is None and on.rotary_ids is not None
    if hasattr(off, "pos_interp"):  # Qwen3-VL only: Qwen2.5-VL has no learned position table
        assert off.pos_interp is None and on.pos_interp is not None


def test_vision_features_equal_on_and_off(both):
    _, runners, _, proc = both
    _, mm = _prompt(proc)
    with torch.no_grad():
        off = runners[False][0].model.get_image_feature(mm.mm_items)
        again = runners[True][0].model.get_image_feature(mm.mm_items)  # cold caches
        on = runners[True][0].model.get_image_feature(mm.mm_items)  # warm caches
    for a, b, c in zip(on, off, again):
        assert a.shape == b.shape
        assert rel_err(a, b) <= 1e-5
        assert torch.equal(a, c)


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
def test_logits_match_transformers(both, on):
    name, runners, hf, proc = both
    ids, mm = _prompt(proc)
    (ours,) = our_logits(runners[on][1], [(ids, mm)])
    assert rel_err(ours, hf_logits(hf, ids, mm.mm_items)) <= 1e-4, name


def test_triton_kernel_in_the_model_under_the_interpreter(both):
    name, runners, _, proc = both
    visual = runners[True][0].model.visual
    if not hasattr(visual, "pos_interp"):
        pytest.skip(f"{name} has no learned position table")
    pytest.importorskip("triton")
    from sgl_kernel.testing import interpreted

    _, mm = _prompt(proc)
    with torch.no_grad():
        ref = runners[False][0].model.get_image_feature(mm.mm_items)
        with interpreted("sgl_kernel.vision._pos_embed_triton"):
            visual.pos_interp.backend = "triton"
            try:
                out = runners[True][0].model.get_image_feature(mm.mm_items)
            finally:
                visual.pos_interp.backend = "auto"
    for a, b in zip(out, ref):
        assert rel_err(a, b) <= 1e-5
