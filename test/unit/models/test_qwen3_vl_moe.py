"""Qwen3-VL-MoE beyond the parity suite (test_model_parity.py runs qwen3-vl-moe-tiny against transformers):
transformers' own save layout loads to the same model, sparse layers sit where transformers puts them,
and the routing really spreads tokens over the experts."""

from __future__ import annotations

import pytest
import torch

from parity_utils import make_runner, our_logits

transformers = pytest.importorskip("transformers")


def _ids(n, seed):
    return torch.randint(0, 5000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_transformers_save_layout_loads_to_the_same_logits(tiny_model_dir, tmp_path):
    path = tiny_model_dir("qwen3-vl-moe-tiny")
    hf = transformers.AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32)
    hf.save_pretrained(tmp_path)  # experts as [E, 2I, H] / [E, H, I], num_local_experts
    prompt = [(_ids(19, 0), None)]
    (released,) = our_logits(make_runner(str(path))[1], prompt)
    (saved,) = our_logits(make_runner(str(tmp_path))[1], prompt)
    assert torch.equal(released, saved)


@pytest.mark.parametrize("step,mlp_only", [(1, []), (2, []), (1, [0, 3]), (3, [2])])
def test_sparse_layers_where_transformers_puts_them(step, mlp_only):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models.qwen3_vl_moe import Qwen3MoeModel, Qwen3MoeSparseMoeBlock
    from sglang.testing.hf_configs import build_config_dict

    raw = build_config_dict("qwen3-vl-moe-tiny")
    raw["text_config"].update(num_hidden_layers=6, decoder_sparse_step=step, mlp_only_layers=mlp_only)
    hf_cfg = transformers.Qwen3VLMoeConfig(**raw)
    with torch.device("meta"):
        hf = transformers.Qwen3VLMoeForConditionalGeneration(hf_cfg)
        ours = Qwen3MoeModel(ModelConfig.from_dict(raw).text)
    hf_sparse = [type(l.mlp).__name__.endswith("SparseMoeBlock") for l in hf.model.language_model.layers]
    assert [isinstance(l.mlp, Qwen3MoeSparseMoeBlock) for l in ours.layers] == hf_sparse
    assert any(hf_sparse) and (step > 1 or bool(mlp_only)) == (not all(hf_sparse))


def test_tokens_spread_over_experts(tiny_model_dir):
    """A degenerate router (every token on the same experts) would make the parity test vacuous."""
    from sglang.srt.layers.moe import select_experts

    runner, sb = make_runner(str(tiny_model_dir("qwen3-vl-moe-tiny")))
    block = runner.model.model.layers[0].mlp
    seen = []
    handle = block.gate.register_forward_hook(lambda m, i, o: seen.append(select_experts(o, 2, True)[1]))
    try:
        our_logits(sb, [(_ids(40, 1), None)])
    finally:
        handle.remove()
    counts = torch.bincount(torch.cat(seen).flatten().long(), minlength=8)
    assert (counts > 0).sum() >= 6, counts.tolist()


def test_each_quantization_builds_its_experts():
    """--quantization fp8: float experts quantized after loading (Fp8MoEMethod; served in test_qwen3_vl_moe_fp8.py);
    a -FP8 checkpoint: Fp8FusedMoE (test_fp8_moe.py); experts it names in modules_to_not_convert stay float."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.moe import Fp8FusedMoE, Fp8MoEMethod, FusedMoE
    from sglang.srt.layers.quantization import quantization_config, startup_problem
    from sglang.srt.models.qwen3_vl_moe import Qwen3MoeSparseMoeBlock, Qwen3VLMoeForConditionalGeneration
    from sglang.testing.hf_configs import build_config_dict

    def experts(raw, flag):
        with torch.device("meta"):
            model = Qwen3VLMoeForConditionalGeneration(ModelConfig.from_dict(raw), quant=quantization_config(raw, flag))
        return [(type(l.mlp.experts), type(l.mlp.experts.quant_method)) for l in model.model.layers
                if isinstance(l.mlp, Qwen3MoeSparseMoeBlock)]

    raw = build_config_dict("qwen3-vl-moe-tiny")
    assert startup_problem(raw, "fp8", 1) is None
    assert experts(raw, "fp8") == [(FusedMoE, Fp8MoEMethod)] * 3
    assert experts(raw, None) == [(FusedMoE, type(None))] * 3
    raw["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128],
                                  "modules_to_not_convert": ["model.language_model.layers.1.mlp.experts"]}
    assert experts(raw, "fp8") == [(Fp8FusedMoE, type(None)), (FusedMoE, type(None)), (Fp8FusedMoE, type(None))]
