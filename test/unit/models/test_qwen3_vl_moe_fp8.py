"""`--quantization fp8` of a float Qwen3-VL-MoE checkpoint (`qwen3-vl-moe-tiny`, experts in the released
[E, H, 2I] / [E, I, H] layout): the float experts load as FusedMoE holds them ([E_local, 2n, H] / [E_local, H, n],
transposed from the released layout), then Fp8MoEMethod quantizes each rank's local experts. A -FP8 checkpoint
(test_fp8_moe.py) still loads into Fp8FusedMoE.

Where each expert's weight went is proven exactly: every expert's FP8 weight, dequantized, is the checkpoint's
within e4m3's rounding. The logits, against the same checkpoint served unquantized: Pearson r with our routing
pinned to the float model's choices (as test_qwen3_5_moe_fp8.py: quantized activations move the unquantized
router's inputs, and near-ties among random tiny weights flip experts). At Qwen3-VL-30B-A3B's expert widths
(H 2048, I 768) the TP 8 and TP 8 / EP 2 ranks' partial products sum to the float product."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from parity_utils import PLACEHOLDER, make_runner, noise_image, our_greedy, our_logits, rel_err, small_processor

transformers = pytest.importorskip("transformers")

PRESET = "qwen3-vl-moe-tiny"
ROUTING_MARGIN = 1e-4  # a prompt whose float routing has a near-tie is a bad witness
# Routing pinned to the float model's: measured 0.981 (text), 0.988 (image), 0.973-0.987 over 8 other prompts
# (routing free: 0.89-0.98). 128-column blocks (gate_up in 16-row groups). Over those 8 prompts, experts rolled
# by one: 0.06-0.34; gate and up rows swapped: 0.41-0.54; down scales doubled: 0.75-0.83.
MIN_PEARSON_PINNED = 0.95
# max |difference| / max |float| of the ranks' summed output at real widths, FP8 activations: measured 0.064
# (TP 8, 96 intermediate rows a rank), 0.061 (TP 8 / EP 2), 0.056 (-FP8 at TP 8); where each rank's weights
# sit is proven by the e4m3-rounding and 1e-5 checks beside it
MAX_REL_REAL_WIDTHS = 0.1


@pytest.fixture(scope="module")
def runners(tiny_model_dir):
    path = tiny_model_dir(PRESET)
    _, flt = make_runner(str(path))
    _, fp8 = make_runner(str(path), quantization="fp8")
    proc = small_processor(str(path), 16, (0.5,) * 3, (0.5,) * 3)
    g = torch.Generator().manual_seed(5)
    text = lambda n: torch.randint(0, 5000, (n,), generator=g).tolist()  # noqa: E731
    prompts = {"text": (text(21), None), "image": proc.process(text(6) + PLACEHOLDER + text(9), [noise_image(96, 64, 3)])}
    return path, flt, fp8, prompts


def _sparse(sb, model=None) -> list:
    from sglang.srt.models.qwen3_vl_moe import Qwen3MoeSparseMoeBlock

    layers = (model or sb.runner.model).model.layers
    return [layer.mlp for layer in layers if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)]


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a.float().flatten(), b.float().flatten()]))[0, 1].item()


def _float_logits_and_routers(flt, ids, mm) -> tuple[torch.Tensor, list[torch.Tensor]]:
    routers = []
    hooks = [block.gate.register_forward_hook(lambda m, i, o: routers.append(o)) for block in _sparse(flt)]
    try:
        logits = our_logits(flt, [(ids, mm)])[0]
    finally:
        for h in hooks:
            h.remove()
    top = torch.cat(routers).topk(3, dim=-1).values  # top-2 routing: the 2nd and 3rd choices must differ
    assert (top[:, -2] - top[:, -1]).min() > ROUTING_MARGIN, "a near-tie in routing: pick another prompt"
    return logits, routers


def _pinned_logits(sb, ids, mm, routers, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as m:
        for block, logits in zip(_sparse(sb), routers):
            m.setattr(block.gate, "forward", lambda x, logits=logits: logits.to(x.device, x.dtype))
        return our_logits(sb, [(ids, mm)])[0]


def test_startup_accepts_online_fp8_at_any_tp_and_ep():
    from sglang.srt.layers.quantization import startup_problem
    from sglang.testing.hf_configs import build_config_dict

    raw = build_config_dict(PRESET)
    for tp, ep in ((1, 1), (2, 1), (2, 2), (8, 1), (8, 2), (8, 8)):
        assert startup_problem(raw, "fp8", tp, ep) is None, (tp, ep)
    assert "--quantization 'int4'" in startup_problem(raw, "int4", 1)


def test_the_experts_become_e4m3_in_their_place(runners):
    from safetensors import safe_open
    from sgl_kernel.quantization import dequantize_block_fp8

    from sglang.srt.layers.moe import Fp8FusedMoE, Fp8MoEMethod

    path, _, fp8, _ = runners
    blocks = _sparse(fp8)
    assert len(blocks) == 3  # layer 2 is in mlp_only_layers
    dense = fp8.runner.model.model.layers[2].mlp
    assert dense.down_proj.weight.dtype == torch.float8_e4m3fn
    with safe_open(str(next(Path(path).glob("*.safetensors"))), framework="pt") as f:
        gate_up = f.get_tensor("model.language_model.layers.3.mlp.experts.gate_up_proj").float()  # [E, H, 2I]
        down = f.get_tensor("model.language_model.layers.3.mlp.experts.down_proj").float()  # [E, I, H]
    assert tuple(gate_up.shape) == (8, 64, 96) and tuple(down.shape) == (8, 48, 64)
    for block in blocks:
        experts = block.experts
        assert not isinstance(experts, Fp8FusedMoE) and isinstance(experts.quant_method, Fp8MoEMethod)
        assert experts.gate_up_proj.dtype == experts.down_proj.dtype == torch.float8_e4m3fn
        assert experts.gate_up_proj_scale_inv.dtype == torch.float32 and experts.gate_up_proj_scale_inv.min() > 0
        assert experts.block13 == (16, 128) and experts.block2 == (128, 128)  # no gate_up scale spans gate and up
        assert block.gate.weight.dtype == torch.float32 and not hasattr(block.gate, "weight_scale_inv")
    experts = blocks[-1].experts
    for e in range(8):
        for w, q, s, b in ((gate_up[e].t(), experts.gate_up_proj[e], experts.gate_up_proj_scale_inv[e], experts.block13),
                           (down[e].t(), experts.down_proj[e], experts.down_proj_scale_inv[e], experts.block2)):
            err = (dequantize_block_fp8(q, s, b) - w).abs()  # e4m3 rounds to half of 2^-3 relative
            assert bool((err <= w.abs() / 16 + 1e-3 * w.abs().max()).all()), e


@pytest.mark.parametrize("kind", ["text", "image"])
def test_logits_track_the_float_model(runners, kind, monkeypatch):
    _, flt, fp8, prompts = runners
    ids, mm = prompts[kind]
    want, routers = _float_logits_and_routers(flt, ids, mm)
    r = _pearson(_pinned_logits(fp8, ids, mm, routers, monkeypatch), want)
    free = _pearson(our_logits(fp8, [(ids, mm)])[0], want)
    print(f"{PRESET} --quantization fp8 ({kind}): Pearson r {r:.5f} routing pinned, {free:.5f} routing free")
    assert r >= MIN_PEARSON_PINNED


@pytest.mark.parametrize("batched", [False, True])
def test_the_scheduler_serves_greedy_tokens(runners, batched, monkeypatch):
    """One request at a time: the static runner's greedy tokens. Batched, the FP8 activations are left
    unquantized (weights alone): with them quantized, the float GEMMs' last-bit differences between batch
    shapes (1.6e-5 in the float model's logits) cross e4m3 rounding steps (2^-4 relative), and the tiny model's
    logits then move by up to 0.47, flipping a near-tied greedy token."""
    import sgl_kernel.moe.fp8 as moe_fp8

    from parity_utils import fp8_float_activations
    from sglang.srt.layers.quantization.fp8 import Fp8LinearMethod

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "managers"))
    from scheduler_utils import InProcessScheduler

    path, _, fp8, prompts = runners
    if batched:
        monkeypatch.setattr(Fp8LinearMethod, "apply", fp8_float_activations)
        monkeypatch.setattr(moe_fp8, "w8a8_linear", moe_fp8.dequantized_linear)
    s = InProcessScheduler(str(path), quantization="fp8", **({} if batched else {"max_running_requests": 1}))
    assert _sparse(None, s.sched.worker.model_runner.model)[0].experts.down_proj.dtype == torch.float8_e4m3fn
    rids = {kind: s.submit(ids, mm, max_new_tokens=6, ignore_eos=True) for kind, (ids, mm) in prompts.items()}
    s.run_until_idle()
    for kind, (ids, mm) in prompts.items():
        assert s.outputs[rids[kind]] == our_greedy(fp8, ids, mm, n=6), kind
        assert s.finished[rids[kind]].type == "length"
    s.assert_no_leak()


def test_real_widths_tp_and_ep_ranks_sum_to_the_float_product():
    """Qwen3-VL-30B-A3B's expert widths (H 2048, I 768; 4 of its experts, top 3), released layout. -FP8: at TP 8
    each rank holds 96 intermediate rows, so odd ranks' down_proj starts 32 columns into a 128-column block;
    the ranks' weights-alone products sum to the dequantized weights' product. --quantization fp8: blocks of
    each rank's own slice (96 rows: 32-row gate_up groups; 96 down columns in one partial 128-column group;
    at TP 8 / EP 2, 2 experts and 192 rows of each a rank); the sum tracks the float product."""
    from sgl_kernel.moe.fp8 import dequantized_linear, fused_experts_fp8
    from moe_fp8_utils import fp8_rank, per_expert_fp8
    from sgl_kernel.quantization import dequantize_block_fp8
    from sglang.srt.distributed.parallel_state import TPInfo
    from sglang.srt.layers.moe import Fp8MoEMethod, FusedMoE, fused_experts, select_experts

    e, h, i, tp = 4, 2048, 768, 8
    g = torch.Generator().manual_seed(11)
    released_gate_up, released_down = torch.randn(e, h, 2 * i, generator=g) * 0.02, torch.randn(e, i, h, generator=g) * 0.02
    gate_up, down = released_gate_up.transpose(1, 2).contiguous(), released_down.transpose(1, 2).contiguous()  # [E, 2I, H], [E, H, I]
    x = torch.randn(16, h, generator=g)
    weights, ids = select_experts(torch.randn(16, e, generator=g), 3, True)
    want = fused_experts(x, gate_up, down, weights, ids)

    def product(m, linear=None):
        return fused_experts_fp8(x, m.gate_up_proj, m.gate_up_proj_scale_inv, m.down_proj, m.down_proj_scale_inv,
                                 weights, m.local_ids(ids), m.block13, m.block2, linear=linear)

    def online_rank(info):
        m = FusedMoE(e, h, i, info, torch.float32)
        m.gate_up_proj.weight_loader(m.gate_up_proj, released_gate_up)
        m.down_proj.weight_loader(m.down_proj, released_down)
        m.quant_method = Fp8MoEMethod((128, 128))
        m.quant_method.process_weights_after_loading(m)
        return m

    figures = {}
    for ep in (1, 2):
        ranks = [online_rank(TPInfo(r, tp, ep_size=ep)) for r in range(tp)]
        assert ranks[1].block13 == ((32, 128) if ep == 1 else (64, 128)) and ranks[1].block2 == (128, 128)
        assert ranks[1].gate_up_proj.dtype == torch.float8_e4m3fn and ranks[1].gate_up_proj.shape[0] == e // ep
        for m in (ranks[1], ranks[-1]):  # a rank's local slice, dequantized, is the float slice within e4m3's rounding
            n, r = m.local_inter, m.tp.moe_tp_rank
            rows = torch.cat([torch.arange(r * n, (r + 1) * n), i + torch.arange(r * n, (r + 1) * n)])
            for le in range(m.num_local_experts):
                x_ = m.first_expert + le
                for w, q, s, b in ((gate_up[x_, rows], m.gate_up_proj[le], m.gate_up_proj_scale_inv[le], m.block13),
                                   (down[x_, :, r * n:(r + 1) * n], m.down_proj[le], m.down_proj_scale_inv[le], m.block2)):
                    err = (dequantize_block_fp8(q, s, b) - w).abs()
                    assert bool((err <= w.abs() / 16 + 1e-3 * w.abs().max()).all()), (ep, r, x_)
        figures[ep] = rel_err(sum(product(m) for m in ranks), want)
        assert figures[ep] < MAX_REL_REAL_WIDTHS, figures

    stored, deq_gate_up, deq_down = per_expert_fp8(gate_up, down)
    ranks = [fp8_rank(stored, e, h, i, TPInfo(r, tp)) for r in range(tp)]
    assert ranks[1].block2 == (128, 32) and ranks[4].block2 == (128, 128)
    exact = sum(product(m, dequantized_linear) for m in ranks)
    assert rel_err(exact, fused_experts(x, deq_gate_up, deq_down, weights, ids)) < 1e-5
    print(f"real widths: max rel error vs float {figures[1]:.4f} (TP 8), {figures[2]:.4f} (TP 8 / EP 2), "
          f"{rel_err(sum(product(m) for m in ranks), want):.4f} (-FP8 at TP 8)")
