"""Block-FP8 linears: which checkpoints are served or refused, and every layer kind (column, fused q/k/v
and gate/up, row) holding exactly its TP shard of the checkpoint's e4m3 weight and block scales, also when
a shard or a fused part starts inside a 128-row block."""

from __future__ import annotations

import math

import pytest
import torch

from sglang.srt.distributed.parallel_state import TPInfo
from sglang.srt.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.quantization import Fp8Config, QuantizationError, quantization_config
from sgl_kernel.quantization import dequantize_block_fp8, quantize_weight_block_fp8

RELEASE = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
           "modules_to_not_convert": ["lm_head", "model.visual.blocks.0.attn.qkv"]}


@pytest.mark.parametrize("qc, words", [
    ({"quant_method": "awq", "bits": 4}, "AWQ"),
    ({"quant_method": "gptq"}, "GPTQ"),
    ({"quant_method": "compressed-tensors"}, "compressed-tensors"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "per-tensor FP8"),
    ({**RELEASE, "activation_scheme": "static"}, "activation_scheme 'static'"),
    ({**RELEASE, "fmt": "e5m2"}, "e4m3"),
    ({"quant_method": "what"}, "'what' is not supported"),
])
def test_unsupported_checkpoints_are_refused_by_name(qc, words):
    with pytest.raises(QuantizationError, match=words):
        quantization_config({"quantization_config": qc})


def test_the_release_format_and_the_flag_are_served():
    cfg = quantization_config({"quantization_config": RELEASE})
    assert cfg.serialized and cfg.block == (128, 128) and "lm_head" in cfg.not_convert
    assert quantization_config({}) is None
    assert not quantization_config({}, "fp8").serialized
    with pytest.raises(QuantizationError, match="--quantization 'int4'"):
        quantization_config({}, "int4")


def test_modules_to_not_convert_keeps_those_linears_float_and_refuses_half_a_fusion():
    cfg = Fp8Config.from_checkpoint({**RELEASE, "modules_to_not_convert": [
        "model.language_model.layers.1.mlp", "model.language_model.layers.2.self_attn.q_proj"]})
    assert cfg.method_for("model.layers.0.mlp.down_proj") is not None
    assert cfg.method_for("model.layers.1.mlp.down_proj") is None
    assert cfg.method_for("model.layers.1.mlp.gate_up_proj", ("gate_proj", "up_proj")) is None
    with pytest.raises(QuantizationError, match="q_proj"):
        cfg.method_for("model.layers.2.self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj"))


def _ckpt(rows: int, cols: int, seed: int):
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05
    q, s = quantize_weight_block_fp8(w)
    return q, s, dequantize_block_fp8(q, s)


def _local(layer) -> torch.Tensor:
    return dequantize_block_fp8(layer.weight.data, layer.weight_scale_inv.data, layer.fp8_block)


def _method():
    return Fp8Config.from_checkpoint(RELEASE).method_for("x")


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_column_parallel_shards_hold_their_rows_even_inside_a_block(tp):
    q, s, full = _ckpt(320, 200, 0)  # 320 / 4 = 80 rows: shards start inside 128-row blocks
    for rank in range(tp):
        layer = ColumnParallelLinear(200, 320, bias=False, tp=TPInfo(rank, tp), quant=_method())
        layer.weight.weight_loader(layer.weight, q)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s)
        n = 320 // tp
        assert torch.equal(_local(layer), full[rank * n:(rank + 1) * n])


@pytest.mark.parametrize("tp", [1, 2])
def test_fused_qkv_and_gate_up_hold_each_part_with_its_own_scales(tp):
    hd, heads, kv_heads, hidden = 32, 6, 2, 96  # q 192 rows, k/v 64: parts start inside blocks
    parts = {sid: _ckpt(n * hd, hidden, i) for i, (sid, n) in enumerate((("q", heads), ("k", kv_heads), ("v", kv_heads)))}
    for rank in range(tp):
        layer = QKVParallelLinear(hidden, hd, heads, kv_heads, bias=False, tp=TPInfo(rank, tp), quant=_method())
        for sid, (q, s, _) in parts.items():
            layer.weight.weight_loader(layer.weight, q, sid)
            layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s, sid)
        got = layer.split_qkv(_local(layer).t())
        for (sid, (_, _, full)), g in zip(parts.items(), got):
            n = full.shape[0] // tp
            assert torch.equal(g.t(), full[rank * n:(rank + 1) * n]), sid
    gate, up = _ckpt(160, 64, 7), _ckpt(160, 64, 8)
    for rank in range(tp):
        layer = MergedColumnParallelLinear(64, [160, 160], bias=False, tp=TPInfo(rank, tp), quant=_method())
        for i, (q, s, _) in enumerate((gate, up)):
            layer.weight.weight_loader(layer.weight, q, i)
            layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s, i)
        n = 160 // tp
        expect = torch.cat([gate[2][rank * n:(rank + 1) * n], up[2][rank * n:(rank + 1) * n]])
        assert torch.equal(_local(layer), expect)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_row_parallel_shards_hold_their_columns_and_quantize_activations_to_match(tp):
    q, s, full = _ckpt(48, 256, 3)  # 256 / 4 = 64 columns: groups of 64
    x = torch.randn(5, 256)
    outs = []
    for rank in range(tp):
        layer = RowParallelLinear(256, 48, bias=False, reduce_results=False, tp=TPInfo(rank, tp), quant=_method())
        layer.weight.weight_loader(layer.weight, q)
        layer.weight_scale_inv.weight_loader(layer.weight_scale_inv, s)
        k = 256 // tp
        assert torch.equal(_local(layer), full[:, rank * k:(rank + 1) * k])
        assert layer.fp8_block[1] == math.gcd(128, rank * k)  # rank 0 starts on a block: its last group is partial
        outs.append(layer.matmul(x[:, rank * k:(rank + 1) * k]))
    # the shards' partial products add up to the product with the whole weight (activation groups differ)
    torch.testing.assert_close(sum(outs), x @ full.t(), rtol=0.1, atol=0.1 * (x @ full.t()).abs().max().item())


def test_a_tp_size_that_cuts_column_groups_below_16_is_refused_with_the_sizes_that_work():
    with pytest.raises(QuantizationError, match="TP sizes that work: 1, 2"):
        RowParallelLinear(96, 16, bias=False, tp=TPInfo(1, 4), quant=_method())  # rank 1 starts at column 24


def test_online_quantization_quantizes_the_loaded_local_weight():
    layer = ColumnParallelLinear(200, 96, bias=True, tp=TPInfo(0, 1), quant=Fp8Config.online().method_for("x"))
    w = torch.randn(96, 200) * 0.05
    layer.weight.weight_loader(layer.weight, w)
    layer.bias.weight_loader(layer.bias, torch.ones(96))
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.weight.dtype == torch.float8_e4m3fn
    assert ((_local(layer) - w).abs() <= w.abs() * 2 ** -4 + 1e-3).all()
    x = torch.randn(3, 200)
    torch.testing.assert_close(layer(x), x @ w.t() + 1, rtol=0.1, atol=0.1)


def test_startup_refuses_tp_sizes_that_cut_column_groups_and_bad_formats_in_one_line():
    from sglang.srt.layers.quantization import startup_problem

    raw = {"quantization_config": RELEASE, "text_config": {"num_attention_heads": 32, "head_dim": 128,
                                                           "intermediate_size": 9728}}
    assert startup_problem(raw, None, 4) is None  # 9728 / 4 = 2432 = 19 x 128
    problem = startup_problem(raw, None, 8)  # 1216 columns a rank: rank 1 starts 64 columns into a block
    assert problem is None  # 64-column groups still take the kernels
    raw["text_config"]["intermediate_size"] = 9720  # 1215 columns a rank
    assert "TP sizes that work: 1" in startup_problem(raw, None, 8)
    assert "AWQ" in startup_problem({"quantization_config": {"quant_method": "awq"}}, None, 1)
    assert startup_problem({}, "fp8", 8) is None  # online: blocks of each rank's own weight


def test_every_model_type_starts_in_fp8_both_ways():
    """The -FP8 layout and --quantization fp8, dense and MoE (Qwen3.5-MoE's and Qwen3-VL-MoE's experts are
    quantized after loading); the -FP8 layout's TP split is still checked."""
    from sglang.srt.layers.quantization import startup_problem

    text = {"num_attention_heads": 16, "head_dim": 256, "intermediate_size": 9216}
    moe = {**text, "num_experts": 8}
    assert startup_problem({"model_type": "qwen3_5_moe", "quantization_config": RELEASE, "text_config": moe}, None, 1) is None
    assert startup_problem({"model_type": "qwen3_5_moe", "text_config": moe}, "fp8", 1) is None
    for model_type, config in (("qwen3_vl_moe", moe), ("qwen3_5", text), ("qwen3_vl", text)):
        assert startup_problem({"model_type": model_type, "quantization_config": RELEASE, "text_config": config}, None, 1) is None
        assert startup_problem({"model_type": model_type, "text_config": config}, "fp8", 8) is None
    odd = {**moe, "moe_intermediate_size": 520}  # 65 columns a rank at TP 8: the -FP8 layout is refused, online is not
    problem = startup_problem({"model_type": "qwen3_vl_moe", "quantization_config": RELEASE, "text_config": odd}, None, 8)
    assert problem is not None and "the experts' down_proj's 520 input features" in problem
    assert startup_problem({"model_type": "qwen3_vl_moe", "text_config": odd}, "fp8", 8) is None
