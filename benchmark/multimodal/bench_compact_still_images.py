"""Microbenchmark for [compact-still-images] (SGLANG_MM_COMPACT_STILL_IMAGES): per 1280x720 image with
Qwen3-VL's preprocessing (736x1280, 3680 patches), the bytes an image item carries and the processor's time,
the baseline's duplicated temporal pair against one frame; and the patch embedding (the Linear module, the
default) on full rows against compact rows with the kernel folded per call, in one process.

  OMP_NUM_THREADS=2 python benchmark/multimodal/bench_compact_still_images.py --output /tmp/compact.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vit_op_timing import check_device, device_name, print_table, time_ms, write_json  # noqa: E402

from sglang.srt.layers.vision_blocks import make_patch_embed  # noqa: E402
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor  # noqa: E402
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor  # noqa: E402

QWEN3 = QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3, min_pixels=65536,
                             max_pixels=16777216)
IMG, VS, VE = 151655, 151652, 151653


def bench_processor(rounds: int) -> list[dict]:
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (720, 1280, 3), dtype=np.uint8))
    rows = []
    for uint8 in (False, True):
        out = {}
        for compact in (False, True):
            proc = QwenVLProcessor(None, QWEN3, model_type="qwen3_vl")
            proc.compact_still_images, proc.uint8_pixels = compact, uint8
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                _, mm = proc.process([1, VS, IMG, VE], [img])
                times.append((time.perf_counter() - t0) * 1e3)
            f = mm.mm_items[0].feature
            out[compact] = (f.numel() * f.element_size(), statistics.median(times), tuple(f.shape))
        rows.append(dict(carrier="uint8" if uint8 else "float32", bytes_before=out[False][0], bytes_after=out[True][0],
                         bytes_ratio=out[False][0] / out[True][0], processor_ms_before=out[False][1],
                         processor_ms_after=out[True][1], shape_before=out[False][2], shape_after=out[True][2]))
    return rows


def bench_patch_embed(n: int, embed: int, dtype, device: str, warmup: int, iters: int) -> dict:
    g = torch.Generator().manual_seed(0)
    m = make_patch_embed(True, 16, 2, 3, embed, bias=True, dtype=dtype).to(device).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(dtype))
    compact = torch.randn(n, 3 * 16 * 16, generator=g).to(dtype).to(device)
    full = compact.view(n, 3, 1, 256).expand(n, 3, 2, 256).reshape(n, -1).contiguous()
    with torch.no_grad():
        ref, out = m(full).float(), m(compact).float()
        rel = ((out - ref).abs().max() / ref.abs().max()).item()
        before = time_ms(lambda: m(full), device, warmup, iters, f"full {n}")
        after = time_ms(lambda: m(compact), device, warmup, iters, f"compact {n}")
    return dict(patches=n, out_features=embed, dtype=str(dtype).removeprefix("torch."), before_ms=before,
                after_ms=after, ratio=before / after, max_rel_diff=rel)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5, help="processor runs per setting (median)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--output", default=None, help="write the JSON summary here")
    args = ap.parse_args()
    check_device(args.device)
    proc_rows = bench_processor(args.rounds)
    pe_rows = [bench_patch_embed(n, 1152, dt, args.device, args.warmup, args.iters)
               for dt in (torch.float32, torch.bfloat16) for n in (3680, 36800)]
    print_table(["carrier", "bytes before", "bytes after", "ratio", "proc ms before", "proc ms after"],
                [[r["carrier"], r["bytes_before"], r["bytes_after"], r["bytes_ratio"], r["processor_ms_before"],
                  r["processor_ms_after"]] for r in proc_rows])
    print_table(["patches", "dtype", "full ms", "compact ms", "ratio", "max rel diff"],
                [[r["patches"], r["dtype"], r["before_ms"], r["after_ms"], r["ratio"], r["max_rel_diff"]]
                 for r in pe_rows])
    summary = {"device": device_name(args.device), "processor": proc_rows, "patch_embed": pe_rows}
    if args.output:
        write_json(args.output, summary)


if __name__ == "__main__":
    main()
