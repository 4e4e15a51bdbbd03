"""How closely FP8 tracks the float model, at real widths: prompt logits of our engine with an -FP8
checkpoint (make_model --quantize fp8), with --quantization fp8, and with an FP8 KV cache, each against
transformers in float32 on the float weights the run stands for (the dequantized weights for the -FP8
checkpoint). Prints Pearson r over every logit and the mean |difference| of the prompt tokens'
log-probabilities, and writes them as JSON.

The model is a short replica (real widths and vision tower, --num-layers text layers) so that it runs on a
CPU in minutes; on a GPU pass --device cuda.

  python benchmark/performance/bench_fp8_accuracy.py [--preset qwen3-vl-2b] [--num-layers 4] [--output r.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
from sglang.testing.fp8_checkpoint import dequantize_folder
from sglang.testing.make_model import make_model
from sglang.testing.presets import get_preset, with_text_layers

PLACEHOLDER = [151652, 151655, 151653]


def _prompt(path: str, preset, text_tokens: int, image: tuple[int, int]):
    v = preset.vision
    mean, std = preset.image_mean, preset.image_std
    ip = QwenVLImageProcessor(patch_size=v.patch_size, image_mean=mean, image_std=std, min_pixels=preset.min_pixels,
                              max_pixels=preset.max_pixels)
    proc = QwenVLProcessor(None, ip, model_type=json.loads((Path(path) / "config.json").read_text())["model_type"])
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (image[1], image[0], 3), dtype=np.uint8), "RGB")
    ids = rng.integers(0, 5000, text_tokens // 2).tolist() + PLACEHOLDER + rng.integers(0, 5000, text_tokens // 2).tolist()
    return proc.process(ids, [img])


def _ours(path: str, device: str, ids, mm, **cfg) -> torch.Tensor:
    runner = ModelRunner(ModelRunnerConfig(model_path=path, dtype="float32", device=device, max_total_tokens=8192,
                                           max_running_requests=4, context_length=8192, **cfg))
    sb = StaticBatchRunner(runner)
    seqs = [StaticSeq(ids, mm)]
    try:
        _, full = sb.extend(seqs, chunk_size=512, return_all_logits=True)
    finally:
        sb.release(seqs)
    return full[0].float().cpu()


def _reference(path: str, device: str, ids, mm) -> torch.Tensor:
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval().to(device)
    t = torch.tensor([ids], device=device)
    items = mm.mm_items
    with torch.no_grad():
        out = hf(input_ids=t, mm_token_type_ids=(t == 151655).long(),
                 pixel_values=torch.cat([torch.as_tensor(it.feature) for it in items]).to(device),
                 image_grid_thw=torch.tensor([list(it.image_grid_thw) for it in items], device=device))
    return out.logits[0].float().cpu()


def figures(ours: torch.Tensor, ref: torch.Tensor, ids: list[int]) -> dict:
    r = torch.corrcoef(torch.stack([ours.flatten(), ref.flatten()]))[0, 1].item()
    nxt = torch.tensor(ids[1:])
    lp = lambda x: torch.log_softmax(x, -1)[:-1].gather(1, nxt[:, None])  # noqa: E731
    return {"pearson_r": r, "mean_abs_dlogprob": (lp(ours) - lp(ref)).abs().mean().item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-vl-2b")
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--text-tokens", type=int, default=96)
    ap.add_argument("--image", default="448x448", help="WxH of the prompt's one image")
    ap.add_argument("--workdir", default=None, help="where the replicas go (default: a temporary folder)")
    ap.add_argument("--output", default=None)
    args = ap.parse_args()
    preset = with_text_layers(get_preset(args.preset), args.num_layers)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fp8_accuracy_"))
    t0 = time.perf_counter()
    float_dir = str(make_model(preset, work / "float", dtype="float32", progress=True))
    fp8_dir = str(make_model(preset, work / "fp8", dtype="float32", progress=True, quantize="fp8"))
    deq_dir = str(dequantize_folder(fp8_dir, work / "fp8-dequantized"))
    w, h = (int(x) for x in args.image.split("x"))
    ids, mm = _prompt(float_dir, preset, args.text_tokens, (w, h))
    print(f"{preset.name}: {len(ids)} prompt tokens, models ready in {time.perf_counter() - t0:.0f} s", flush=True)
    ref_float, ref_deq = _reference(float_dir, args.device, ids, mm), _reference(deq_dir, args.device, ids, mm)
    runs = {
        "-FP8 checkpoint vs its dequantized weights": (fp8_dir, ref_deq, {}),
        "--quantization fp8 vs the float checkpoint": (float_dir, ref_float, {"quantization": "fp8"}),
        "--kv-cache-dtype fp8_e4m3 vs float KV": (float_dir, ref_float, {"kv_cache_dtype": "fp8_e4m3"}),
        "--kv-cache-dtype fp8_e5m2 vs float KV": (float_dir, ref_float, {"kv_cache_dtype": "fp8_e5m2"}),
        "float (no FP8) vs transformers": (float_dir, ref_float, {}),
    }
    rows = {}
    for name, (path, ref, cfg) in runs.items():
        rows[name] = figures(_ours(path, args.device, ids, mm, **cfg), ref, ids)
        print(f"{name:<46} Pearson r {rows[name]['pearson_r']:.5f}  mean |dlogprob| "
              f"{rows[name]['mean_abs_dlogprob']:.4f}", flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps({"preset": preset.name, "prompt_tokens": len(ids),
                                                 "device": args.device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
