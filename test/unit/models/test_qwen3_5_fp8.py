"""Qwen3.5 with block-FP8 weights (make_model --quantize fp8: the text decoder's attention, MLP and the
DeltaNet's in_proj_qkv / in_proj_z / out_proj as e4m3 with block scales; in_proj_a / in_proj_b, the conv,
A_log, dt_bias, norms and the vision tower unquantized) against transformers on the float model the
checkpoint stands for: with activations unquantized our logits equal it; on the real path they track it.
The DeltaNet's in_proj_qkv is one fused tensor in the checkpoint, so its scales load through the fused path."""

from __future__ import annotations

import pytest
import torch

from parity_utils import fp8_float_activations, TEST_DEVICE, make_runner, noise_image, our_logits, rel_err
from sglang.srt.layers.quantization.fp8 import Fp8LinearMethod
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
from sglang.testing.fp8_checkpoint import dequantize_folder
from sglang.testing.make_model import make_model

transformers = pytest.importorskip("transformers")

IMAGE_PAD, VISION_START, VISION_END = 248056, 248053, 248054
MIN_PEARSON_TINY = 0.95
MIN_PEARSON_ONLINE = 0.93


@pytest.fixture(scope="module")
def fp8_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("q35fp8")
    path = make_model("qwen3.5-tiny", tmp / "fp8", seed=0, progress=False, quantize="fp8")
    return path, dequantize_folder(path, tmp / "ref")


def test_which_tensors_are_quantized(fp8_model):
    path, _ = fp8_model
    _, sb = make_runner(str(path))
    layers = sb.runner.model.model.layers
    gdn, attn = layers[0].linear_attn, layers[3].self_attn
    fp8 = torch.float8_e4m3fn
    for linear in (gdn.in_proj_qkv, gdn.in_proj_z, gdn.out_proj, attn.qkv_proj, attn.o_proj, layers[0].mlp.down_proj):
        assert linear.weight.dtype == fp8 and linear.weight_scale_inv.abs().min() > 0
    for kept in (gdn.in_proj_a.weight, gdn.in_proj_b.weight, gdn.conv1d.weight, gdn.A_log, gdn.dt_bias):
        assert kept.dtype == torch.float32


def test_fp8_logits_equal_the_float_model_and_track_it_with_fp8_activations(fp8_model, monkeypatch):
    path, ref_path = fp8_model
    _, sb = make_runner(str(path))
    proc = QwenVLProcessor.from_pretrained(str(path))
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 5000, (30,), generator=g).tolist() + [VISION_START, IMAGE_PAD, VISION_END] + \
        torch.randint(0, 5000, (12,), generator=g).tolist()
    ids, mm = proc.process(ids, [noise_image(96, 64, 3)])
    hf = transformers.AutoModelForImageTextToText.from_pretrained(str(ref_path), dtype=torch.float32).eval()
    hf = hf.to(TEST_DEVICE)
    t = torch.tensor([ids], device=hf.device)
    with torch.no_grad():
        ref = hf(input_ids=t, mm_token_type_ids=(t == IMAGE_PAD).long(),
                 pixel_values=torch.cat([torch.as_tensor(it.feature) for it in mm.mm_items]).to(hf.device),
                 image_grid_thw=torch.tensor([list(it.image_grid_thw) for it in mm.mm_items])).logits[0].float().cpu()
    real = our_logits(sb, [(ids, mm)])[0]
    r = torch.corrcoef(torch.stack([real.flatten(), ref.flatten()]))[0, 1].item()
    print(f"qwen3.5-tiny fp8: Pearson r {r:.5f}")
    assert r >= MIN_PEARSON_TINY
    monkeypatch.setattr(Fp8LinearMethod, "apply", fp8_float_activations)
    exact = our_logits(sb, [(ids, mm)])[0]
    assert rel_err(exact, ref) < 1e-4


def test_online_fp8_keeps_the_decay_projections_and_tracks_the_float_model(tiny_model_dir):
    path = str(tiny_model_dir("qwen3.5-tiny"))
    _, flt = make_runner(path)
    _, fp8 = make_runner(path, quantization="fp8")
    gdn = fp8.runner.model.model.layers[0].linear_attn
    assert gdn.in_proj_qkv.weight.dtype == torch.float8_e4m3fn
    assert gdn.in_proj_a.weight.dtype == gdn.in_proj_b.weight.dtype == torch.float32
    ids = list(range(100, 160))
    a, b = our_logits(flt, [(ids, None)])[0], our_logits(fp8, [(ids, None)])[0]
    r = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1].item()
    print(f"qwen3.5-tiny --quantization fp8: Pearson r {r:.5f}")
    # measured 0.946 (60 tokens through long-lived DeltaNet states; online blocks are 128x128, one per matrix at
    # these widths, where the checkpoint's are 16x16: 0.985 above); a misplaced scale or weight falls far below
    assert r >= MIN_PEARSON_ONLINE


def test_fp8_moe_starts_and_the_shared_experts_tp_split_is_checked():
    """Qwen3.5-MoE starts in FP8 (the -FP8 layout and --quantization fp8); at TP the shared expert's down_proj
    columns are checked like the experts'; Qwen3-VL-MoE's --quantization fp8 starts too."""
    from sglang.srt.layers.quantization import startup_problem

    release = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    moe = {"num_attention_heads": 16, "head_dim": 256, "num_experts": 256, "moe_intermediate_size": 512,
           "shared_expert_intermediate_size": 512}
    assert startup_problem({"model_type": "qwen3_5_moe", "text_config": moe}, "fp8", 8) is None
    assert startup_problem({"model_type": "qwen3_5_moe", "quantization_config": release, "text_config": moe}, None, 8) is None
    odd = {**moe, "shared_expert_intermediate_size": 520}  # 65 columns a rank at TP 8
    problem = startup_problem({"model_type": "qwen3_5_moe", "quantization_config": release, "text_config": odd}, None, 8)
    assert problem is not None and "the shared expert's down_proj's 520 input features" in problem
    assert startup_problem({"model_type": "qwen3_vl_moe", "text_config": moe}, "fp8", 8) is None
