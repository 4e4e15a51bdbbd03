"""Tests for the deterministic random-weight model generator (sglang.testing.make_model): every preset's
tensor names, shapes and parameter counts against transformers' own (on the meta device), the MoE
layout, the shard plan of the large presets, and short replicas."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from sglang.testing import make_model as mm
from sglang.testing.hf_configs import build_config_dict
from sglang.testing.presets import LARGE_PRESETS, PRESETS, get_preset

transformers = pytest.importorskip("transformers")
from make_model_utils import as_loaded, hub_to_transformers, meta_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_transformers")


# ----------------------------------------------------------------------------- names, shapes, counts


@pytest.mark.parametrize("name", list(PRESETS))
def test_names_and_shapes_match_transformers(name):
    p, config, model = meta_model(name)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if p.tie_word_embeddings:
        expected.pop("lm_head.weight")  # tied: not stored in the checkpoint
    ours = {hub_to_transformers(s.name, p.family): as_loaded(s.name, s.shape) for s in mm.tensor_specs(name)}
    assert len(ours) == len(mm.tensor_specs(name))  # renaming is injective
    assert set(ours) == set(expected), (set(ours) ^ set(expected))
    for k, shape in ours.items():
        assert shape == expected[k], k
    # unique parameter count (tied lm_head counted once) == our enumeration
    n_meta = sum(prm.numel() for prm in model.parameters())  # parameters() de-duplicates tied weights
    assert n_meta == mm.count_parameters(name)
    assert config.tie_word_embeddings == p.tie_word_embeddings


def test_qwen3_vl_4b_param_count():
    assert mm.count_parameters("qwen3-vl-4b") == 4_437_815_808
    assert mm.count_parameters("qwen3-vl-4b", "vision") == 415_347_712
    _, _, model = meta_model("qwen3-vl-4b")
    assert sum(p.numel() for p in model.parameters()) == 4_437_815_808
    assert sum(p.numel() for p in model.model.visual.parameters()) == 415_347_712


def test_known_param_counts():
    # Parameter counts of the public checkpoints (the MoE ones: 31.1B and 235.7B on their Hub pages).
    assert mm.count_parameters("qwen3-vl-2b") == 2_127_532_032
    assert mm.count_parameters("qwen3-vl-8b") == 8_767_123_696
    assert mm.count_parameters("qwen2.5-vl-3b") == 3_754_622_976
    assert mm.count_parameters("qwen2.5-vl-7b") == 8_292_166_656
    assert mm.count_parameters("qwen3-vl-30b-a3b") == 31_070_754_032
    assert mm.count_parameters("qwen3-vl-235b-a22b") == 235_670_022_896


def test_moe_presets_write_the_released_fused_experts():
    specs = {s.name: s.shape for s in mm.tensor_specs("qwen3-vl-30b-a3b")}
    pre = "model.language_model.layers.47.mlp"
    assert specs[f"{pre}.experts.gate_up_proj"] == (128, 2048, 1536)
    assert specs[f"{pre}.experts.down_proj"] == (128, 768, 2048)
    assert specs[f"{pre}.gate.weight"] == (128, 2048)
    assert not any(".mlp.gate_proj." in n for n in specs)  # every layer sparse
    tc = build_config_dict("qwen3-vl-30b-a3b")["text_config"]
    assert (tc["num_experts"], tc["num_experts_per_tok"], tc["moe_intermediate_size"]) == (128, 8, 768)
    assert tc["norm_topk_prob"] is True and tc["decoder_sparse_step"] == 1 and tc["mlp_only_layers"] == []
    from sglang.testing.presets import with_text_layers

    short = {s.name for s in mm.tensor_specs(with_text_layers("qwen3-vl-30b-a3b", 4))}
    assert "model.language_model.layers.3.mlp.experts.down_proj" in short
    assert not any(".layers.4." in n for n in short)
    # the dense presets keep their manifest digest (folders made before MoE presets are still reused)
    import dataclasses

    from sglang.testing.model_manifest import _canonical, preset_digest

    dense = dataclasses.asdict(get_preset("qwen3-vl-tiny"))
    dense["text"].pop("moe")
    assert preset_digest(get_preset("qwen3-vl-tiny")) == hashlib.sha256(_canonical(dense)).hexdigest()[:16]


@pytest.mark.parametrize("name", LARGE_PRESETS)
def test_large_preset_shard_plan(name):
    p = get_preset(name)
    specs = mm.tensor_specs(name)
    shards = mm.plan_shards(specs, "bfloat16", mm.DEFAULT_MAX_SHARD_BYTES)
    assert [s for shard in shards for s in shard] == specs
    # a tensor over the limit (235B's fused experts, 3.2 GB) gets a shard of its own; the rest pack
    small = sum(s.numel * 2 for s in specs if s.numel * 2 <= mm.DEFAULT_MAX_SHARD_BYTES)
    assert len(shards) >= -(-small // mm.DEFAULT_MAX_SHARD_BYTES) and len(shards) > 1
    for shard in shards:
        size = sum(s.numel * 2 for s in shard)
        assert size <= mm.DEFAULT_MAX_SHARD_BYTES or len(shard) == 1
    assert p.default_dtype == "bfloat16"


def test_a_short_replica_keeps_every_width_and_the_vision_tower():
    from sglang.testing.hf_configs import build_config_dict
    from sglang.testing.presets import get_preset, with_text_layers

    full = get_preset("qwen3-vl-4b")
    short = with_text_layers(full, 4)
    assert short.name == "qwen3-vl-4b-4l" and short.text.num_hidden_layers == 4
    assert short.vision == full.vision and short.text == replace(full.text, num_hidden_layers=4)
    cfg = build_config_dict(short, "bfloat16")
    assert cfg["text_config"]["num_hidden_layers"] == 4 and cfg["vision_config"]["depth"] == full.vision.depth
    assert with_text_layers(full, full.text.num_hidden_layers) is full
    with pytest.raises(ValueError, match="3..36 text layers"):  # one per deepstack level at least
        with_text_layers(full, 2)
