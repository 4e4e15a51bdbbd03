"""Loading: checkpoints written by transformers' save_pretrained, shape-true replicas on the meta
device, and loud failures for checkpoints that do not fit the model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from parity_utils import PLACEHOLDER, hf_logits, make_runner, noise_image, our_logits, rel_err, small_processor  # noqa: E402

transformers = pytest.importorskip("transformers")


def _perturbed(model):
    """transformers initializes norms to 1 and biases to 0; perturb everything so a weight loaded
    into the wrong place cannot hide."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise * 0.1 if p.dim() > 1 else 1 + 0.1 * noise)
    return model.eval()


def _hf_qwen3_vl():
    cfg = transformers.Qwen3VLConfig(
        text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=16, vocab_size=151680, rope_theta=5e6,
                         rope_scaling=dict(rope_type="default", mrope_section=[4, 2, 2], mrope_interleaved=True)),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                           deepstack_visual_indexes=[1], num_position_embeddings=36),
        tie_word_embeddings=False,
    )
    return _perturbed(transformers.Qwen3VLForConditionalGeneration(cfg)), 16


def _hf_qwen2_5_vl():
    cfg = transformers.Qwen2_5_VLConfig(
        text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=151680,
                         rope_scaling=dict(type="mrope", mrope_section=[2, 3, 3])),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                           fullatt_block_indexes=[2], window_size=56, patch_size=14),
        tie_word_embeddings=True,
    )
    return _perturbed(transformers.Qwen2_5_VLForConditionalGeneration(cfg)), 14


@pytest.mark.parametrize("build", [_hf_qwen3_vl, _hf_qwen2_5_vl], ids=["qwen3_vl", "qwen2_5_vl"])
def test_save_pretrained_checkpoint_loads_and_matches(build, tmp_path):
    hf, patch = build()
    hf.save_pretrained(tmp_path)
    proc = small_processor(str(tmp_path), patch, (0.5,) * 3, (0.5,) * 3)
    ids, mm = proc.process([5, 6, *PLACEHOLDER, 7, 8, *PLACEHOLDER, 9], [noise_image(128, 96, 0), noise_image(64, 160, 1)])
    _, sb = make_runner(str(tmp_path))
    (ours,) = our_logits(sb, [(ids, mm)])
    assert rel_err(ours, hf_logits(hf, ids, mm.mm_items)) <= 1e-4


def test_checkpoint_with_unknown_or_missing_tensor_fails_loudly(tiny_model_dir, tmp_path):
    src = tiny_model_dir("qwen3-vl-tiny")
    for f in src.iterdir():
        if f.is_file():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    weights = load_file(str(tmp_path / "model.safetensors"))
    name = next(n for n in weights if n.endswith("mlp.linear_fc1.bias"))
    dropped = weights.pop(name)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match="not found in checkpoint"):
        make_runner(str(tmp_path))
    weights[name] = dropped
    weights["model.visual.extra.weight"] = torch.zeros(2)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(KeyError, match="matches no model parameter"):
        make_runner(str(tmp_path))


@pytest.mark.parametrize("preset,expected", [("qwen3-vl-4b", 4_437_815_808)])
def test_shape_true_replica_builds_on_meta_with_real_parameter_count(preset, expected, tmp_path):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models.registry import get_model_class
    from sglang.testing.make_model import build_config_dict, get_preset

    raw = build_config_dict(get_preset(preset), "bfloat16")
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_pretrained(tmp_path)
    with torch.device("meta"):
        model = get_model_class(cfg.architecture)(cfg, dtype=torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    assert total == expected
    assert sum(p.numel() for p in model.visual.parameters()) == 415_347_712
