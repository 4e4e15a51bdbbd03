"""The generated Qwen3.5-MoE checkpoints (sglang.testing: presets, make_model, qwen3_5_checkpoint):
`qwen3.5-moe-tiny` is what transformers' Qwen3.5-MoE loads with no missing or unexpected keys, in the
released layout (fused experts in the decoder layers, one tensor per expert in the MTP layer); our
config reader takes its MoE fields and refuses what it cannot serve; the `qwen3.5-35b-a3b` replica is
shape-true to transformers' model of its config (checked on the meta device: nothing is generated)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from sglang.srt.configs.model_config import ModelConfig, ModelConfigError
from sglang.testing import make_model as mm
from sglang.testing.presets import get_preset, list_presets

transformers = pytest.importorskip("transformers")

PRESET = "qwen3.5-moe-tiny"
REPLICA = "qwen3.5-35b-a3b"
LM = "model.language_model"


def test_presets_are_listed_with_the_moe_model_type(tiny_model_dir, capsys):
    for name in (PRESET, REPLICA):
        p = get_preset(name)
        assert name in list_presets() and p.family == "qwen3_5"
        assert (p.model_type, p.architecture) == ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration")
    assert get_preset("qwen3.5-tiny").model_type == "qwen3_5"  # the dense preset is untouched
    path = tiny_model_dir(PRESET)
    assert mm.main(["--preset", PRESET, "--out", str(path)]) == 0
    assert capsys.readouterr().out.startswith("reused ")


def test_transformers_loads_every_tensor(tiny_model_dir):
    path = tiny_model_dir(PRESET)
    model, info = transformers.AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32,
                                                                           output_loading_info=True)
    assert type(model).__name__ == "Qwen3_5MoeForConditionalGeneration"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    state = model.state_dict()
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        for name in names:
            if not name.startswith("mtp."):  # the released layout is transformers' own: no conversion
                assert torch.equal(state[name], f.get_tensor(name)), name
    assert set(names) == {s.name for s in mm.tensor_specs(PRESET)}
    assert {n for n in names if not n.startswith("mtp.")} == set(state) - {"lm_head.weight"}  # tied


def test_released_expert_layout(tiny_model_dir):
    """Every decoder layer: router [E, H], fused experts [E, 2I, H] / [E, H, I], shared expert and its
    [1, H] gate, no dense MLP; the MTP layer: one [I, H] / [H, I] linear per expert."""
    with safe_open(str(tiny_model_dir(PRESET) / "model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    for i in range(4):
        mlp = f"{LM}.layers.{i}.mlp"
        assert shapes[f"{mlp}.gate.weight"] == (8, 64)
        assert shapes[f"{mlp}.experts.gate_up_proj"] == (8, 96, 64)
        assert shapes[f"{mlp}.experts.down_proj"] == (8, 64, 48)
        assert shapes[f"{mlp}.shared_expert.gate_proj.weight"] == (80, 64)
        assert shapes[f"{mlp}.shared_expert.down_proj.weight"] == (64, 80)
        assert shapes[f"{mlp}.shared_expert_gate.weight"] == (1, 64)
        assert f"{mlp}.gate_proj.weight" not in shapes and f"{mlp}.experts.0.gate_proj.weight" not in shapes
    assert shapes["mtp.layers.0.mlp.experts.7.up_proj.weight"] == (48, 64)
    assert shapes["mtp.layers.0.mlp.experts.7.down_proj.weight"] == (64, 48)
    assert "mtp.layers.0.mlp.experts.gate_up_proj" not in shapes


def test_config_files(tiny_model_dir):
    path = tiny_model_dir(PRESET)
    raw = json.loads((path / "config.json").read_text())
    assert "intermediate_size" not in raw["text_config"]  # the releases' text config has no dense MLP
    cfg = transformers.AutoConfig.from_pretrained(path)
    tc = cfg.text_config
    assert (cfg.model_type, tc.model_type, cfg.vision_config.model_type) == (
        "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_moe_vision")
    assert (tc.num_experts, tc.num_experts_per_tok, tc.moe_intermediate_size, tc.shared_expert_intermediate_size) == (
        8, 2, 48, 80)
    assert tc.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert (cfg.image_token_id, cfg.vision_start_token_id, tc.eos_token_id) == (248056, 248053, 248044)
    assert list(transformers.GenerationConfig.from_pretrained(path).eos_token_id) == [248046, 248044]


def test_config_reader(tiny_model_dir):
    cfg = ModelConfig.from_pretrained(tiny_model_dir(PRESET))
    assert (cfg.architecture, cfg.model_type) == ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")
    moe = cfg.text.moe
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size) == (8, 2, 48)
    assert moe.shared_expert_intermediate_size == 80 and moe.norm_topk_prob
    assert all(moe.is_sparse_layer(i) for i in range(4))
    assert cfg.text.intermediate_size == 80 + 2 * 48  # one token's MLP width (the memory budget's figure)
    assert cfg.text.hybrid.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert cfg.text.hybrid.rotary_dim == 8 and cfg.text.mrope_section == (2, 1, 1)
    assert cfg.vision.deepstack_visual_indexes == () and cfg.eos_token_ids == (248046, 248044)


def _raw_text_with(tiny_model_dir, **changes) -> dict:
    raw = json.loads((tiny_model_dir(PRESET) / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            raw["text_config"].pop(k)
        else:
            raw["text_config"][k] = v
    return raw


@pytest.mark.parametrize("changes,message", [
    ({"mlp_only_layers": [1]}, "experts in every layer"),
    ({"decoder_sparse_step": 2}, "experts in every layer"),
    ({"shared_expert_intermediate_size": None}, "shared_expert_intermediate_size"),
    ({"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size must be >= 1"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok 9"),
])
def test_config_reader_refuses_what_it_cannot_serve(tiny_model_dir, changes, message):
    with pytest.raises(ModelConfigError, match=message):
        ModelConfig.from_dict(_raw_text_with(tiny_model_dir, **changes))


def test_router_renormalizes_whatever_norm_topk_prob_says(tiny_model_dir):
    """transformers' Qwen3.5-MoE router divides the top-k weights by their sum unconditionally."""
    assert ModelConfig.from_dict(_raw_text_with(tiny_model_dir, norm_topk_prob=False)).text.moe.norm_topk_prob


def test_tiny_model_is_not_degenerate(tiny_model_dir):
    """Prompt-dependent, well-scaled logits: a parity test on a flat model would prove little."""
    model = transformers.AutoModelForImageTextToText.from_pretrained(str(tiny_model_dir(PRESET)),
                                                                     dtype=torch.float32).eval()
    a = torch.tensor([[785, 812, 1123, 389, 279, 561, 13, 90, 400, 77]])
    b = a.clone()
    b[0, 0] += 7
    with torch.no_grad():
        la, lb = model(input_ids=a).logits[0, -1], model(input_ids=b).logits[0, -1]
    assert torch.isfinite(la).all() and la[:3000].std() > 1.0
    assert (la - lb).norm() / la.norm() > 0.05


def test_35b_replica_is_shape_true():
    """transformers' model of the replica's config has exactly the replica's tensors (names and shapes,
    MTP aside), ~35B parameters with 8 of 256 experts active; our reader parses the same config."""
    raw = mm.build_config_dict(REPLICA)
    with torch.device("meta"):
        ref = transformers.Qwen3_5MoeForConditionalGeneration(transformers.Qwen3_5MoeConfig(**raw))
    specs = mm.tensor_specs(REPLICA)
    assert {s.name: tuple(s.shape) for s in specs if not s.name.startswith("mtp.")} == {
        n: tuple(t.shape) for n, t in ref.state_dict().items()}
    assert sum(1 for s in specs if s.name.startswith("mtp.layers.0.mlp.experts.")) == 3 * 256
    assert 34e9 < mm.count_parameters(REPLICA) < 37e9
    cfg = ModelConfig.from_dict(raw)
    assert (cfg.text.moe.num_experts, cfg.text.moe.num_experts_per_tok, cfg.text.moe.moe_intermediate_size) == (
        256, 8, 512)
    assert cfg.text.moe.shared_expert_intermediate_size == 512 and not cfg.tie_word_embeddings
    assert cfg.text.hybrid.full_attention_layers == tuple(range(3, 40, 4)) and cfg.text.hybrid.rotary_dim == 64
