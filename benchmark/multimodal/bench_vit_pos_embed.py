"""Microbenchmark for [vit-pos-embed]: the Qwen3-VL ViT's position inputs computed the baseline way
(per forward: bilinear interpolation of the learned table, rotary ids + cos/sin) against the cached
path (SGLANG_VIT_FAST_POS_EMBED), both towers in one process on the same table.

  python benchmark/multimodal/bench_vit_pos_embed.py --device cpu --output /tmp/pos.json

Default workload is the seed's: one request of 20 images of 960x1280 (patch 16: 20 grids of 80x60,
96,000 patches) on a Qwen3-VL-235B/8B-class tower (hidden 1152, 16 heads, 48x48 learned table).
"after (cached)" is the steady state, every grid shape already seen; "after (cold)" empties the
per-grid caches before each call, so it also pays the CPU-side tap/index construction and the copy to
device (the rotary cos/sin table, built once per device, stays).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vit_op_timing import check_device, device_name, print_table, time_ms, write_json  # noqa: E402

from sglang.srt.configs.model_config import VisionConfig  # noqa: E402
from sglang.srt.layers.vision_pos_embed import GridLRU  # noqa: E402
from sglang.srt.models.qwen3_vl import Qwen3VisionTransformer  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def towers(args, dtype, device):
    cfg = VisionConfig(depth=0, hidden_size=args.hidden, intermediate_size=8, num_heads=args.heads, out_hidden_size=8,
                       patch_size=args.patch_size, temporal_patch_size=2, spatial_merge_size=args.merge,
                       num_position_embeddings=args.num_position_embeddings)
    table = torch.randn(args.num_position_embeddings, args.hidden, generator=torch.Generator().manual_seed(0))
    out = {}
    for fast in (False, True):
        vit = Qwen3VisionTransformer(cfg, dtype=dtype, fast_pos_embed=fast).to(device)
        with torch.no_grad():
            vit.pos_embed.weight.copy_(table.to(dtype))
        out[fast] = vit
    return out[False], out[True]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--width", type=int, default=960)
    ap.add_argument("--height", type=int, default=1280)
    ap.add_argument("--patch-size", type=int, default=16)
    ap.add_argument("--merge", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1152)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--num-position-embeddings", type=int, default=2304)
    ap.add_argument("--warmup", type=int, default=None, help="default 5 on cuda, 1 on cpu")
    ap.add_argument("--iters", type=int, default=None, help="default 50 on cuda, 5 on cpu")
    ap.add_argument("--output", help="write the results as JSON here")
    args = ap.parse_args()
    check_device(args.device)
    warmup = args.warmup if args.warmup is not None else (5 if args.device == "cuda" else 1)
    iters = args.iters if args.iters is not None else (50 if args.device == "cuda" else 5)
    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    unit = args.patch_size * args.merge
    if args.width % unit or args.height % unit:
        raise SystemExit(f"--width/--height must be multiples of patch * merge = {unit}")
    grid = [(1, args.height // args.patch_size, args.width // args.patch_size)] * args.images
    base, fast = towers(args, dtype, device)

    def cold_pos():
        fast.pos_interp.cache = GridLRU(fast.pos_interp.cache.max_bytes)
        return fast.pos_embeds(grid, dtype)

    def cold_rot():
        # The cos/sin table stays: it is built once per device (256 positions), not per grid shape.
        fast.rotary_ids.cache = GridLRU(fast.rotary_ids.cache.max_bytes)
        return fast.rotary_cos_sin(grid, device)

    with torch.no_grad():
        def rel_diff(a, b):
            return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()

        diff_pos = rel_diff(fast.pos_embeds(grid, dtype), base.pos_embeds(grid, dtype))
        pairs = zip(fast.rotary_cos_sin(grid, device), base.rotary_cos_sin(grid, device))
        diff_rot = max(rel_diff(a, b) for a, b in pairs)
        ops = {
            "fast_pos_embed_interpolate": (lambda: base.pos_embeds(grid, dtype), lambda: fast.pos_embeds(grid, dtype),
                                           cold_pos, diff_pos),
            "rot_pos_emb": (lambda: base.rotary_cos_sin(grid, device), lambda: fast.rotary_cos_sin(grid, device),
                            cold_rot, diff_rot),
        }
        results = []
        for name, (before_fn, after_fn, cold_fn, diff) in ops.items():
            before = time_ms(before_fn, args.device, warmup, iters, f"{name} baseline")
            after = time_ms(after_fn, args.device, warmup, iters, f"{name} cached")
            cold = time_ms(cold_fn, args.device, warmup, iters, f"{name} cold")
            results.append(dict(op=name, before_ms=before, after_ms=after, ratio=before / after,
                                after_cold_ms=cold, ratio_cold=before / cold, max_rel_diff=diff))
    n = sum(t * h * w for t, h, w in grid)
    print(f"\nViT position inputs, {args.images} images {args.width}x{args.height} ({n} patches), hidden "
          f"{args.hidden}, head_dim {args.hidden // args.heads}, {args.dtype}, {device_name(args.device)}")
    print_table(
        ["op", "baseline ms (off)", "cached ms (on)", "ratio", "cold ms (on)", "ratio cold", "max rel diff"],
        [[r["op"], r["before_ms"], r["after_ms"], f"{r['ratio']:.2f}x", r["after_cold_ms"], f"{r['ratio_cold']:.2f}x",
          f"{r['max_rel_diff']:.1e}"] for r in results],
    )
    write_json(args.output, dict(benchmark="vit-pos-embed", device=device_name(args.device), dtype=args.dtype,
                                 patches=n, grid=grid[0], images=args.images, warmup=warmup, iters=iters,
                                 torch=torch.__version__, results=results))


if __name__ == "__main__":
    main()
