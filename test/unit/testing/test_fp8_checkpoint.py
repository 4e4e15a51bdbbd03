"""make_model --quantize fp8 writes the layout of Qwen's -FP8 releases; dequantize_folder gives back the
float model it stands for (what transformers runs as the reference)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from sglang.testing.fp8_checkpoint import dequantize_folder, is_quantized_linear
from sglang.testing.make_model import generate_tensor, make_model


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory):
    return make_model("qwen3-vl-tiny", tmp_path_factory.mktemp("fp8") / "m", seed=0, progress=False, quantize="fp8")


def _tensors(folder):
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def test_text_linears_are_e4m3_with_block_scales_and_the_rest_is_untouched(fp8_dir):
    cfg = json.loads((fp8_dir / "config.json").read_text())
    qc = cfg["quantization_config"]
    # the releases' 128x128 blocks, shrunk with the tiny widths so every scale has several blocks per axis
    assert {k: qc[k] for k in ("quant_method", "fmt", "activation_scheme", "weight_block_size")} == {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}
    tensors = _tensors(fp8_dir)
    quantized = [n for n in tensors if is_quantized_linear(n)]
    layers = cfg["text_config"]["num_hidden_layers"]
    assert len(quantized) == 7 * layers  # q, k, v, o, gate, up, down in each text layer
    for name in quantized:
        w, s = tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")]
        assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
        assert s.shape == (-(-w.shape[0] // 16), -(-w.shape[1] // 16)) and min(s.shape) >= 2
    assert all(t.dtype == torch.float32 for n, t in tensors.items() if "visual" in n)
    assert "model.visual.blocks.0.attn.qkv" in qc["modules_to_not_convert"]
    assert not any(is_quantized_linear(m + ".weight") for m in qc["modules_to_not_convert"])
    # untouched tensors are the generator's own values
    name = "model.language_model.embed_tokens.weight"
    assert torch.equal(tensors[name], generate_tensor("qwen3-vl-tiny", name, seed=0))


def test_the_dequantized_folder_is_the_model_within_e4m3_rounding(fp8_dir, tmp_path):
    out = dequantize_folder(fp8_dir, tmp_path / "deq")
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    tensors = _tensors(out)
    assert not any(n.endswith("weight_scale_inv") for n in tensors)
    name = "model.language_model.layers.1.mlp.down_proj.weight"
    w, orig = tensors[name], generate_tensor("qwen3-vl-tiny", name, seed=0)
    assert w.dtype == torch.float32 and w.shape == orig.shape
    assert not torch.equal(w, orig)
    assert ((w - orig).abs() <= orig.abs().max() * 2 ** -8 + orig.abs() * 2 ** -4).all()


def test_transformers_loads_the_dequantized_folder(fp8_dir, tmp_path):
    from transformers import AutoModelForImageTextToText

    out = dequantize_folder(fp8_dir, tmp_path / "deq")
    model = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32)
    name = "model.language_model.layers.0.self_attn.q_proj.weight"
    got = dict(model.named_parameters())[name]
    assert torch.equal(got, _tensors(out)[name])


def _dequantize_by_hand(w: torch.Tensor, s: torch.Tensor, block: int) -> torch.Tensor:
    """Block dequantization written apart from the loader and the kernels: every (i, j) element times the
    scale of block (i // block, j // block), one element at a time over numpy arrays."""
    import numpy as np

    wf, sf = w.float().numpy(), s.numpy()
    out = np.empty_like(wf)
    for i in range(wf.shape[0]):
        for j in range(wf.shape[1]):
            out[i, j] = wf[i, j] * sf[i // block, j // block]
    return torch.from_numpy(out)


def test_the_engine_loads_exactly_the_hand_dequantized_weights(fp8_dir):
    """The loader's block indexing (per fused part and TP grid) against a dequantization that shares no code
    with it: with 16x16 blocks every scale has several blocks per axis, so a block taken for its neighbour
    shows (with one block per matrix, as 128x128 gave the tiny presets, no indexing error could)."""
    from sgl_kernel.quantization import dequantize_block_fp8

    from sglang.srt.model_loader.loader import get_model

    model = get_model(str(fp8_dir), "float32", "cpu")
    tensors = _tensors(fp8_dir)
    attn = model.model.layers[1].self_attn
    pre = "model.language_model.layers.1.self_attn."
    want = torch.cat([_dequantize_by_hand(tensors[pre + f"{p}_proj.weight"], tensors[pre + f"{p}_proj.weight_scale_inv"], 16)
                      for p in ("q", "k", "v")])
    got = dequantize_block_fp8(attn.qkv_proj.weight, attn.qkv_proj.weight_scale_inv, attn.qkv_proj.fp8_block)
    assert torch.equal(got.float(), want)
    mlp, pre = model.model.layers[1].mlp, "model.language_model.layers.1.mlp."
    want = _dequantize_by_hand(tensors[pre + "down_proj.weight"], tensors[pre + "down_proj.weight_scale_inv"], 16)
    got = dequantize_block_fp8(mlp.down_proj.weight, mlp.down_proj.weight_scale_inv, mlp.down_proj.fp8_block)
    assert torch.equal(got.float(), want)
