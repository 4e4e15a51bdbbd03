"""ViTStrategy: the vision-tower switches resolved once from the environment and passed down through
the model constructor (models and layers never read a switch)."""

from __future__ import annotations

import dataclasses

import pytest

from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.layers.vision_blocks import Conv3dPatchEmbed, LinearPatchEmbed
from sglang.srt.model_loader.loader import get_model


def test_defaults_are_the_switch_defaults(monkeypatch):
    monkeypatch.delenv("SGLANG_VIT_PATCH_EMBED_LINEAR", raising=False)
    monkeypatch.delenv("SGLANG_VIT_FAST_POS_EMBED", raising=False)
    assert ViTStrategy.from_env() == ViTStrategy() == ViTStrategy(patch_embed_linear=True, fast_pos_embed=True)


@pytest.mark.parametrize("linear, fast", [("0", "1"), ("1", "0"), ("false", "no")])
def test_from_env_reads_both_switches(monkeypatch, linear, fast):
    monkeypatch.setenv("SGLANG_VIT_PATCH_EMBED_LINEAR", linear)
    monkeypatch.setenv("SGLANG_VIT_FAST_POS_EMBED", fast)
    s = ViTStrategy.from_env()
    assert (s.patch_embed_linear, s.fast_pos_embed) == (linear == "1", fast == "1")


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ViTStrategy().fast_pos_embed = False


@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen2.5-vl-tiny"])
def test_get_model_passes_the_strategy_down(tiny_model_dir, monkeypatch, preset):
    path = str(tiny_model_dir(preset))
    # an explicit strategy wins over the environment: the model never reads the switches itself
    monkeypatch.setenv("SGLANG_VIT_PATCH_EMBED_LINEAR", "1")
    monkeypatch.setenv("SGLANG_VIT_FAST_POS_EMBED", "1")
    off = get_model(path, "float32", vit=ViTStrategy(patch_embed_linear=False, fast_pos_embed=False)).visual
    assert type(off.patch_embed) is Conv3dPatchEmbed and off.rotary_ids is None
    # no strategy: resolved from the environment when the model is built
    monkeypatch.setenv("SGLANG_VIT_FAST_POS_EMBED", "0")
    env = get_model(path, "float32").visual
    assert type(env.patch_embed) is LinearPatchEmbed and env.rotary_ids is None
