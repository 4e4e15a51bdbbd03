"""The -FP8 writer for Qwen3.5-MoE's expert layout (sglang/testing/fp8_checkpoint.py): the releases fuse experts
as gate_up [E, 2I, H] / down [E, H, I] (not Qwen3-VL-MoE's transposed [E, H, 2I] / [E, I, H]); the -FP8 layout
stores one [I, H] / [I, H] / [H, I] linear per expert. Split and fuse are inverses for both families, each
expert's gate rows are its first I, and a folder quantized then dequantized is the float folder within e4m3's
rounding, under the names and shapes the float checkpoint has."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from sglang.srt.layers.moe import expert_params_mapping
from sglang.testing.fp8_checkpoint import dequantize_folder, experts_transposed, fuse_experts, split_experts
from sglang.testing.make_model import make_model

E, I, H = 3, 5, 7  # no dim equal to another: a transposition or a swapped half cannot go unseen


@pytest.mark.parametrize("model_type", ["qwen3_5_moe", "qwen3_vl_moe"])
def test_split_gives_each_expert_its_linears_and_fuse_inverts_it(model_type):
    transposed = experts_transposed(model_type)
    g = torch.Generator().manual_seed(0)
    linears = {"gate_up_proj": torch.randn(E, 2 * I, H, generator=g), "down_proj": torch.randn(E, H, I, generator=g)}
    pre = "model.language_model.layers.4.mlp.experts"
    fused = {f"{pre}.{k}": (t.transpose(1, 2).contiguous() if transposed else t) for k, t in linears.items()}
    parts = {}
    for name, t in fused.items():
        parts.update(split_experts(name, t, transposed))
    assert len(parts) == 3 * E
    for e in range(E):
        assert torch.equal(parts[f"{pre}.{e}.gate_proj.weight"], linears["gate_up_proj"][e, :I])
        assert torch.equal(parts[f"{pre}.{e}.up_proj.weight"], linears["gate_up_proj"][e, I:])
        assert torch.equal(parts[f"{pre}.{e}.down_proj.weight"], linears["down_proj"][e])
    back = fuse_experts(parts, transposed)
    assert set(back) == set(fused) and all(torch.equal(back[n], fused[n]) for n in fused)
    # every per-expert name is one the loader maps onto the fused parameter, with its (expert, part) shard
    mapped = {part for _, part, _ in expert_params_mapping(E)}
    assert {n[len(pre) - len(".experts"):] for n in parts} == mapped


def test_an_unknown_family_is_refused_by_name():
    with pytest.raises(ValueError, match="'mixtral'"):
        experts_transposed("mixtral")


def test_quantize_then_dequantize_is_the_float_folder(tiny_model_dir, tmp_path):
    flt = tiny_model_dir("qwen3.5-moe-tiny")
    fp8 = make_model("qwen3.5-moe-tiny", tmp_path / "fp8", seed=0, progress=False, quantize="fp8")
    deq = dequantize_folder(fp8, tmp_path / "deq")
    with safe_open(str(next(fp8.glob("*.safetensors"))), "pt") as q:
        scaled = {n[: -len("_scale_inv")] for n in q.keys() if n.endswith(".weight_scale_inv")}
        assert all(q.get_slice(n).get_dtype() == "F8_E4M3" for n in scaled)
    quantized = 0
    with safe_open(str(next(flt.glob("*.safetensors"))), "pt") as a, safe_open(str(next(deq.glob("*.safetensors"))), "pt") as b:
        # the MTP head (skipped when serving) is stored per expert in the float release and comes back fused
        names = {n for n in a.keys() if not n.startswith("mtp.")}
        assert names == {n for n in b.keys() if not n.startswith("mtp.")}
        for n in sorted(names):
            w, d = a.get_tensor(n), b.get_tensor(n)
            assert d.shape == w.shape and d.dtype == torch.float32, n
            if n in scaled or n.endswith(("experts.gate_up_proj", "experts.down_proj")):
                quantized += 1
                # e4m3 keeps 3 mantissa bits: within 1/16 of each value, plus the block's subnormal spacing
                assert bool(((d - w).abs() <= w.abs() / 16 + 1e-3 * w.abs().max()).all()), n
                assert not torch.equal(d, w), n
            else:
                assert torch.equal(d, w), n
    # per decoder layer: 2 fused expert tensors + the shared expert's 3; the DeltaNet's 3 (layers 0-2) or
    # the attention's 4 (layer 3)
    assert quantized == 4 * 5 + 3 * 3 + 4
