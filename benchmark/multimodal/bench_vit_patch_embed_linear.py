"""Microbenchmark for [vit-patch-embed-linear]: the baseline Conv3d patch embedding against the Linear
that replaces it (SGLANG_VIT_PATCH_EMBED_LINEAR), both loaded from the same conv-shaped weight, in one
process.

  python benchmark/multimodal/bench_vit_patch_embed_linear.py --device cpu --output /tmp/pe.json

Default shapes are the seed's (96,000 patches = 20 images of 960x1280 at patch 16, 1536 -> 1152, the
Qwen3-VL-235B/8B-class ViT) and Qwen3-VL-4B's (1536 -> 1024).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vit_op_timing import check_device, device_name, print_table, time_ms, write_json  # noqa: E402

from sglang.srt.layers.vision_blocks import make_patch_embed  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def bench_shape(n: int, embed: int, patch: int, temporal: int, dtype, device: str, warmup: int, iters: int) -> dict:
    g = torch.Generator().manual_seed(0)
    conv_w = (torch.randn(embed, 3, temporal, patch, patch, generator=g) * 0.02).to(dtype)
    bias = torch.randn(embed, generator=g).to(dtype)
    mods = {}
    for linear in (False, True):
        m = make_patch_embed(linear, patch, temporal, 3, embed, bias=True, dtype=dtype).to(device).eval()
        for name, p in m.named_parameters():
            src = {"proj.weight": conv_w, "proj.bias": bias}[name]
            loader = getattr(p, "weight_loader", None)
            with torch.no_grad():
                loader(p, src) if loader else p.copy_(src)
        mods[linear] = m
    x = torch.randn(n, 3 * temporal * patch * patch, generator=g).to(dtype).to(device)
    with torch.no_grad():
        ref, out = mods[False](x).float(), mods[True](x).float()
        rel = ((out - ref).abs().max() / ref.abs().max()).item()
        del ref, out
        before = time_ms(lambda: mods[False](x), device, warmup, iters, f"conv3d {embed}")
        after = time_ms(lambda: mods[True](x), device, warmup, iters, f"linear {embed}")
    k = 3 * temporal * patch * patch
    return dict(patches=n, in_features=k, out_features=embed, before_ms=before, after_ms=after,
                ratio=before / after, max_rel_diff=rel, after_tflops=2 * n * k * embed / after / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--patches", type=int, default=96_000)
    ap.add_argument("--embed", type=int, nargs="+", default=[1152, 1024], help="output widths to run")
    ap.add_argument("--patch-size", type=int, default=16)
    ap.add_argument("--temporal-patch-size", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=None, help="default 3 on cuda, 1 on cpu")
    ap.add_argument("--iters", type=int, default=None, help="default 20 on cuda, 3 on cpu")
    ap.add_argument("--output", help="write the results as JSON here")
    args = ap.parse_args()
    check_device(args.device)
    warmup = args.warmup if args.warmup is not None else (3 if args.device == "cuda" else 1)
    iters = args.iters if args.iters is not None else (20 if args.device == "cuda" else 3)
    dtype = DTYPES[args.dtype]

    results = [
        bench_shape(args.patches, e, args.patch_size, args.temporal_patch_size, dtype, args.device, warmup, iters)
        for e in args.embed
    ]
    print(f"\npatch embedding, {args.patches} patches, {args.dtype}, {device_name(args.device)}")
    print_table(
        ["shape", "Conv3d ms (off)", "Linear ms (on)", "ratio", "max rel diff"],
        [[f"{r['in_features']}->{r['out_features']}", r["before_ms"], r["after_ms"], f"{r['ratio']:.2f}x",
          f"{r['max_rel_diff']:.1e}"] for r in results],
    )
    write_json(args.output, dict(benchmark="vit-patch-embed-linear", device=device_name(args.device),
                                 dtype=args.dtype, warmup=warmup, iters=iters, torch=torch.__version__,
                                 results=results))


if __name__ == "__main__":
    main()
