"""SGLANG_VIT_PATCH_EMBED_LINEAR on the real loading path: the same checkpoint loaded with the switch on
and off gives the same vision features and logits, and both match transformers."""

from __future__ import annotations

import pytest
import torch

from parity_utils import PLACEHOLDER, hf_logits, noise_image, our_logits, rel_err, runners_with_switch, small_processor
from test_model_parity import MODELS

from sglang.srt.layers.vision_blocks import Conv3dPatchEmbed, LinearPatchEmbed

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=sorted(MODELS))
def both(request, tiny_model_dir):
    name = request.param
    path = str(tiny_model_dir(name))
    runners = runners_with_switch(path, "SGLANG_VIT_PATCH_EMBED_LINEAR")
    hf = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return name, runners, hf, small_processor(path, **MODELS[name])


def _prompt(proc):
    ids = [5, 6, *PLACEHOLDER, 7, *PLACEHOLDER, 8, 9]
    return proc.process(ids, [noise_image(96, 64, 0), noise_image(40, 130, 1)])


def test_switch_selects_the_module(both):
    _, runners, _, _ = both
    assert type(runners[False][0].model.visual.patch_embed) is Conv3dPatchEmbed
    assert type(runners[True][0].model.visual.patch_embed) is LinearPatchEmbed


def test_vision_features_equal_on_and_off(both):
    _, runners, _, proc = both
    _, mm = _prompt(proc)
    with torch.no_grad():
        off = runners[False][0].model.get_image_feature(mm.mm_items)
        on = runners[True][0].model.get_image_feature(mm.mm_items)
    for a, b in zip(on, off):
        assert a.shape == b.shape
        assert rel_err(a, b) <= 1e-5


@pytest.mark.parametrize("on", [False, True], ids=["off", "on"])
def test_logits_match_transformers(both, on):
    name, runners, hf, proc = both
    ids, mm = _prompt(proc)
    (ours,) = our_logits(runners[on][1], [(ids, mm)])
    assert rel_err(ours, hf_logits(hf, ids, mm.mm_items)) <= 1e-4, name
