"""vit-chunk-per-image before/after in one process: a many-image request under chunked prefill.

For each mode (baseline: first chunk encodes every image, cache keyed by the image set; per-image:
each chunk encodes the images it overlaps, cache keyed per image) it reports TTFT, total ViT time,
images encoded and how ViT work spreads over chunks, then cache reuse for a request sharing all but
one image with the previous one and for a multi-turn chat that resends earlier images.

  python benchmark/multimodal/bench_vit_chunk_per_image.py --images 32 --chunked-prefill-size 512
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from inprocess_scheduler import BenchScheduler  # noqa: E402

PLACEHOLDER = [151652, 151655, 151653]


def _image(seed: int, w: int, h: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _prompt(proc, seeds, w, h):
    ids = [100, 101, 102]
    for k in range(len(seeds)):
        ids += PLACEHOLDER + [200 + k % 50]
    return proc.process(ids, [_image(s, w, h) for s in seeds])


def _instrument(bench):
    """Wraps the model's per-image ViT entry point to record (images, ms) per call."""
    model = bench.sched.worker.model_runner.model
    calls = []
    inner = model.get_image_feature

    def timed(items):
        t0 = time.perf_counter()
        out = inner(items)
        calls.append((len(items), (time.perf_counter() - t0) * 1e3))
        return out

    model.get_image_feature = timed
    return calls


def run_mode(per_image: bool, args, proc) -> dict:
    os.environ["SGLANG_VIT_CHUNK_PER_IMAGE"] = "1" if per_image else "0"
    os.environ["SGLANG_VLM_CACHE_SIZE_MB"] = str(args.cache_mb)
    bench = BenchScheduler(model_path=args.model_path, dtype=args.dtype, chunked_prefill_size=args.chunked_prefill_size,
                           max_total_tokens=args.max_total_tokens, context_length=args.context_length,
                           disable_radix_cache=True)
    calls = _instrument(bench)
    w, h = args.resolution
    bench.run_request(*_prompt(proc, [10_000 + i for i in range(2)], w, h))  # warm-up
    calls.clear()
    seeds = list(range(args.images))
    main = bench.run_request(*_prompt(proc, seeds, w, h))
    vit_calls = list(calls)
    # a request sharing all images but the first with the previous one
    calls.clear()
    overlap = bench.run_request(*_prompt(proc, [999] + seeds[1:], w, h))
    # a multi-turn chat: turn k resends the k-1 earlier images plus one new image
    turns = []
    for k in range(1, args.turns + 1):
        turns.append(bench.run_request(*_prompt(proc, [5000 + j for j in range(k)], w, h))["meta"]["vit_encoded_images"])
    return {
        "mode": "per-image" if per_image else "baseline",
        "ttft_ms": round(main["ttft_ms"], 1),
        "vit_ms": round(sum(ms for _, ms in vit_calls), 1),
        "vit_calls": len(vit_calls),
        "images_encoded": main["meta"]["vit_encoded_images"],
        "images_per_vit_call": [n for n, _ in vit_calls],
        "overlap_images_encoded": overlap["meta"]["vit_encoded_images"],
        "multi_turn_images_encoded": turns,
        "prompt_tokens": main["meta"]["prompt_tokens"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="default: the embedded tiny Qwen3-VL")
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--resolution", default="1280x720", help="WxH of each image")
    ap.add_argument("--max-pixels", type=int, default=None, help="override the processor's max_pixels")
    ap.add_argument("--chunked-prefill-size", type=int, default=512)
    ap.add_argument("--cache-mb", type=float, default=100.0, help="SGLANG_VLM_CACHE_SIZE_MB for both modes")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-total-tokens", type=int, default=65536)
    ap.add_argument("--context-length", type=int, default=None)
    ap.add_argument("--output", default=None, help="write results as JSON here")
    args = ap.parse_args()
    args.resolution = tuple(int(v) for v in args.resolution.lower().split("x"))

    from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
    from sglang.testing.make_model import ensure_model

    args.model_path = args.model_path or str(ensure_model("qwen3-vl-tiny"))
    proc = QwenVLProcessor.from_pretrained(args.model_path)
    if args.max_pixels:
        import dataclasses

        proc.image_processor = dataclasses.replace(proc.image_processor, max_pixels=args.max_pixels)
    if args.context_length is None:
        args.context_length = 65536

    results = [run_mode(False, args, proc), run_mode(True, args, proc)]
    base, new = results
    print(f"model {args.model_path}, {args.images} images of {args.resolution[0]}x{args.resolution[1]}, "
          f"{base['prompt_tokens']} prompt tokens, chunk {args.chunked_prefill_size}, cache {args.cache_mb} MiB")
    print(f"{'mode':<10} {'TTFT ms':>9} {'ViT ms':>8} {'encoded':>8} {'ViT calls':>9}  images per ViT call")
    for r in results:
        print(f"{r['mode']:<10} {r['ttft_ms']:>9} {r['vit_ms']:>8} {r['images_encoded']:>8} {r['vit_calls']:>9}  "
              f"{r['images_per_vit_call']}")
    print(f"TTFT ratio baseline/per-image: {base['ttft_ms'] / new['ttft_ms']:.2f}x")
    print(f"request sharing {args.images - 1}/{args.images} images: encoded {base['overlap_images_encoded']} "
          f"(baseline) vs {new['overlap_images_encoded']} (per-image)")
    print(f"multi-turn images encoded per turn: {base['multi_turn_images_encoded']} (baseline) vs "
          f"{new['multi_turn_images_encoded']} (per-image)")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "results": results},
                                                indent=2, default=str))


if __name__ == "__main__":
    main()
