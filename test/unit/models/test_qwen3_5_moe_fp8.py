"""FP8 Qwen3.5-MoE (the Qwen3.6-35B-A3B-FP8 layout): `make_model --quantize fp8` on `qwen3.5-moe-tiny` (each
expert's linears apart in e4m3 with 16x16 block scales, the shared expert's linears in FP8; the router, the
shared expert's gate and the DeltaNet's in_proj_a / in_proj_b unquantized) against transformers in float32
on the float model it stands for (dequantize_folder: experts fused back to [E, 2I, H] / [E, H, I]).

Bounds, as test_fp8_moe.py / test_qwen3_5_fp8.py hold them. Weights alone (activations unquantized in the
dense FP8 linears and the experts): prompt logits within 1e-4 relative and the same greedy tokens, for a text
and an image prompt: every expert weight and block scale is in its place. The real path (activations
quantized per token and group): Pearson r over every logit, with our routing pinned to transformers' choices
(see MIN_PEARSON_PINNED). `--quantization fp8` of a bfloat16 checkpoint: its experts are quantized after
loading and track the same checkpoint served unquantized."""

from __future__ import annotations

import pytest
import torch

from parity_utils import fp8_float_activations, hf_greedy, make_runner, our_greedy, our_logits, rel_err
from qwen3_5_driver import prompt, ref_kwargs, tiny_processor
from sglang.srt.layers.quantization.fp8 import Fp8LinearMethod
from sglang.testing.fp8_checkpoint import dequantize_folder
from sglang.testing.make_model import make_model

transformers = pytest.importorskip("transformers")

PRESET = "qwen3.5-moe-tiny"
TOL = 1e-4
ROUTING_MARGIN = 1e-4  # as test_qwen3_5_moe_parity.py: a prompt with a near-tie in routing is a bad witness
# Quantized activations move the unquantized router's inputs; with random tiny weights near-ties are common,
# and each flipped (token, expert) swaps an expert's output: unpinned, r measured 0.81-0.94 over 8 prompts.
# Pinned to transformers' routing (same experts and weights), r measured 0.949-0.981 over the same 8; gate and
# up scales swapped in every expert: 0.838.
MIN_PEARSON_PINNED = 0.93
# --quantization fp8 of the bfloat16 checkpoint against it unquantized, routing pinned likewise: measured 0.923
# (0.906-0.937 over 4 prompts; 128x128 blocks, one per matrix at these widths, where the checkpoint's are 16x16;
# the dense tiny model's online figure is 0.946); gate and up scales swapped: 0.872. Where each expert's weight
# went is proven exactly by the dequantized-weights check in the same test.
MIN_PEARSON_ONLINE = 0.90
# max |difference| / max |float| of 8 experts' summed TP 8 output at real widths with FP8 activations: measured
# 0.059 (-FP8) and 0.065 (--quantization fp8); where the weights sit is proven by the 1e-5 check beside it
MAX_REL_REAL_WIDTHS = 0.1


@pytest.fixture(scope="module")
def fp8_moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("q35moefp8")
    path = make_model(PRESET, root / "fp8", seed=0, progress=False, quantize="fp8")
    transformers.logging.set_verbosity_error()
    ref = transformers.AutoModelForImageTextToText.from_pretrained(str(dequantize_folder(path, root / "ref")),
                                                                   dtype=torch.float32).eval()
    _, sb = make_runner(str(path))
    return path, ref, sb


def _router_logits(model, layers, kwargs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the model's logits, each layer's router logits [T, E]) for one forward."""
    captured = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o))
             for layer in layers]
    try:
        with torch.no_grad():
            out = model(**kwargs)
    finally:
        for h in hooks:
            h.remove()
    return out, captured


def _ref(ref, ids, mm) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """transformers' logits and router logits, checked free of routing near-ties (see ROUTING_MARGIN)."""
    out, routers = _router_logits(ref, ref.model.language_model.layers, ref_kwargs(ids, mm))
    top = torch.cat(routers).topk(ref.config.text_config.num_experts_per_tok + 1, dim=-1).values
    assert (top[:, -2] - top[:, -1]).min() > ROUTING_MARGIN, "a near-tie in routing: pick another prompt"
    return out.logits[0].float(), routers


def _pinned_logits(sb, ids, mm, routers, monkeypatch) -> torch.Tensor:
    """Our prompt logits with each layer's router output replaced by `routers` (one prefill, same tokens)."""
    with monkeypatch.context() as m:
        for layer, logits in zip(sb.runner.model.model.layers, routers):
            m.setattr(layer.mlp.gate, "forward", lambda x, logits=logits: logits.to(x.device, x.dtype))
        return our_logits(sb, [(ids, mm)])[0]


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a.float().flatten(), b.float().flatten()]))[0, 1].item()


def test_the_checkpoint_and_the_model_quantize_what_the_releases_do(fp8_moe):
    from safetensors import safe_open

    path, _, sb = fp8_moe
    pre = "model.language_model.layers.0"
    with safe_open(str(next(path.glob("*.safetensors"))), framework="pt") as f:
        names = set(f.keys())
        w, s = f.get_tensor(f"{pre}.mlp.experts.5.gate_proj.weight"), f.get_tensor(f"{pre}.mlp.experts.5.gate_proj.weight_scale_inv")
        kept = {n: f.get_tensor(n).dtype for n in names if n.startswith(pre) and n.endswith(
            ("mlp.gate.weight", "shared_expert_gate.weight", "in_proj_a.weight", "in_proj_b.weight"))}
    assert w.dtype == torch.float8_e4m3fn and tuple(w.shape) == (48, 64) and tuple(s.shape) == (3, 4)
    assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in names)
    assert f"{pre}.mlp.shared_expert.down_proj.weight_scale_inv" in names
    assert len(kept) == 4 and set(kept.values()) == {torch.float32}
    block = sb.runner.model.model.layers[0].mlp
    assert type(block.experts).__name__ == "Fp8FusedMoE" and block.experts.down_proj.dtype == torch.float8_e4m3fn
    assert block.experts.block13 == (16, 16) and block.experts.block2 == (16, 16)
    for linear in (block.shared_expert.gate_up_proj, block.shared_expert.down_proj):
        assert linear.weight.dtype == torch.float8_e4m3fn and linear.weight_scale_inv.abs().min() > 0
    for kept_linear in (block.gate, block.shared_expert_gate, sb.runner.model.model.layers[0].linear_attn.in_proj_a):
        assert kept_linear.weight.dtype == torch.float32 and not hasattr(kept_linear, "weight_scale_inv")


@pytest.mark.parametrize("kind", ["text", "image"])
def test_weights_alone_equal_the_dequantized_model(fp8_moe, kind, monkeypatch):
    import sgl_kernel.moe.fp8 as moe_fp8

    _, ref, sb = fp8_moe
    monkeypatch.setattr(Fp8LinearMethod, "apply", fp8_float_activations)
    monkeypatch.setattr(moe_fp8, "w8a8_linear", moe_fp8.dequantized_linear)
    ids, mm = prompt(kind, tiny_processor(), seed=3)
    want, _ = _ref(ref, ids, mm)
    got = our_logits(sb, [(ids, mm)])[0]
    assert got.shape == want.shape and rel_err(got, want) < TOL
    assert our_greedy(sb, ids, mm, n=6) == hf_greedy(ref, ref_kwargs(ids, mm), n=6)


def test_quantized_activations_track_the_float_model(fp8_moe, monkeypatch):
    _, ref, sb = fp8_moe
    ids, mm = prompt("image", tiny_processor(), seed=3)
    want, routers = _ref(ref, ids, mm)
    r = _pearson(_pinned_logits(sb, ids, mm, routers, monkeypatch), want)
    free = _pearson(our_logits(sb, [(ids, mm)])[0], want)
    print(f"{PRESET} fp8 checkpoint: Pearson r {r:.5f} routing pinned, {free:.5f} routing free")
    assert r >= MIN_PEARSON_PINNED


def test_online_fp8_of_a_bf16_checkpoint(tmp_path_factory, monkeypatch):
    from safetensors import safe_open
    from sgl_kernel.quantization import dequantize_block_fp8

    path = make_model(PRESET, tmp_path_factory.mktemp("q35moebf16") / "bf16", seed=0, progress=False, dtype="bfloat16")
    _, flt = make_runner(str(path))
    _, fp8 = make_runner(str(path), quantization="fp8")
    block, gdn = fp8.runner.model.model.layers[1].mlp, fp8.runner.model.model.layers[1].linear_attn
    experts = block.experts
    assert experts.gate_up_proj.dtype == experts.down_proj.dtype == torch.float8_e4m3fn
    assert block.shared_expert.gate_up_proj.weight.dtype == torch.float8_e4m3fn
    assert block.gate.weight.dtype == block.shared_expert_gate.weight.dtype == gdn.in_proj_b.weight.dtype == torch.float32
    # each expert's FP8 weight, dequantized, is the checkpoint's within e4m3's rounding (half of 2^-3 relative)
    with safe_open(str(next(path.glob("*.safetensors"))), framework="pt") as f:
        gate_up = f.get_tensor("model.language_model.layers.1.mlp.experts.gate_up_proj").float()
        down = f.get_tensor("model.language_model.layers.1.mlp.experts.down_proj").float()
    for e in range(gate_up.shape[0]):
        for w, q, s, b in ((gate_up[e], experts.gate_up_proj[e], experts.gate_up_proj_scale_inv[e], experts.block13),
                           (down[e], experts.down_proj[e], experts.down_proj_scale_inv[e], experts.block2)):
            err = (dequantize_block_fp8(q, s, b) - w).abs()
            assert bool((err <= w.abs() / 16 + 1e-3 * w.abs().max()).all()), e
    ids = prompt("text", tiny_processor(), seed=3)[0]
    routers = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, o: routers.append(o)) for layer in flt.runner.model.model.layers]
    try:
        want = our_logits(flt, [(ids, None)])[0]
    finally:
        for h in hooks:
            h.remove()
    r = _pearson(_pinned_logits(fp8, ids, None, routers, monkeypatch), want)
    print(f"{PRESET} bf16 checkpoint --quantization fp8: Pearson r {r:.5f} routing pinned, "
          f"{_pearson(our_logits(fp8, [(ids, None)])[0], want):.5f} routing free")
    assert r >= MIN_PEARSON_ONLINE


def test_an_expert_scale_off_its_grid_is_refused_by_name(fp8_moe, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from sglang.srt.layers.quantization import QuantizationError
    from sglang.srt.model_loader.loader import get_model

    path, _, _ = fp8_moe
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    shard = next(bad.glob("*.safetensors"))
    tensors = load_file(str(shard))
    name = "model.language_model.layers.2.mlp.experts.6.down_proj.weight_scale_inv"
    tensors[name] = torch.cat([tensors[name], tensors[name][:, :1]], dim=1)  # [4, 3] -> [4, 4]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(QuantizationError, match=rf"{name}: expert down_proj scale shape \(4, 4\) != \(4, 3\)"):
        get_model(str(bad), dtype="float32")



def test_real_widths_at_tp8_sum_to_one_rank_and_track_float():
    """Qwen3.5-35B-A3B's expert widths (H 2048, I 512; 8 experts, top-8) at TP 8: each rank holds 64 intermediate
    rows, so gate_up keeps 64-row scale groups and odd ranks' down_proj starts 64 columns into a 128-column block.
    -FP8 path: the ranks' partial products (weights alone) sum to the dequantized weights' product, so every
    rank's slice of every weight and scale is in its place; with FP8 activations, and with --quantization fp8
    (blocks of each rank's own slice), the sum tracks the float product (bounds: MAX_REL_REAL_WIDTHS)."""
    from sgl_kernel.moe.fp8 import dequantized_linear, fused_experts_fp8
    from moe_fp8_utils import fp8_rank, per_expert_fp8
    from sglang.srt.distributed.parallel_state import TPInfo
    from sglang.srt.layers.moe import Fp8MoEMethod, fused_experts, select_experts
    from sglang.srt.models.qwen3_5_moe import Qwen3_5MoeExperts

    e, h, i, tp = 8, 2048, 512, 8
    g = torch.Generator().manual_seed(7)
    gate_up, down = torch.randn(e, 2 * i, h, generator=g) * 0.02, torch.randn(e, h, i, generator=g) * 0.02
    x = torch.randn(16, h, generator=g)
    weights, ids = select_experts(torch.randn(16, e, generator=g), 8, True)
    stored, deq_gate_up, deq_down = per_expert_fp8(gate_up, down)

    def online_rank(r):
        m = Qwen3_5MoeExperts(e, h, i, TPInfo(r, tp), torch.float32)
        m.gate_up_proj.weight_loader(m.gate_up_proj, gate_up)
        m.down_proj.weight_loader(m.down_proj, down)
        m.quant_method = Fp8MoEMethod((128, 128))
        m.quant_method.process_weights_after_loading(m)
        return m

    def product(m, linear=None):
        return fused_experts_fp8(x, m.gate_up_proj, m.gate_up_proj_scale_inv, m.down_proj, m.down_proj_scale_inv,
                                 weights, ids, m.block13, m.block2, linear=linear)

    ranks = [fp8_rank(stored, e, h, i, TPInfo(r, tp)) for r in range(tp)]
    assert ranks[1].block13 == (64, 128) and ranks[1].block2 == (128, 64) and ranks[2].block2 == (128, 128)
    exact = sum(product(m, dequantized_linear) for m in ranks)
    assert rel_err(exact, fused_experts(x, deq_gate_up, deq_down, weights, ids)) < 1e-5
    want = fused_experts(x, gate_up, down, weights, ids)
    real = rel_err(sum(product(m) for m in ranks), want)
    online = rel_err(sum(product(online_rank(r)) for r in range(tp)), want)
    print(f"real widths, TP {tp}: max rel error vs float {real:.4f} (-FP8), {online:.4f} (--quantization fp8)")
    assert real < MAX_REL_REAL_WIDTHS and online < MAX_REL_REAL_WIDTHS
