"""gather_blend_rows: the Triton kernel against its torch fallback (embedding_bag over a float32 table)
on the ViT position-embedding shape of the seed workload: 96,000 patches, 4 bilinear taps into the
2304-row learned table of width 1152 (Qwen3-VL-8B/235B class) and 1024 (Qwen3-VL-2B/4B).

  python sgl-kernel/benchmark/bench_gather_blend_rows.py --out rows.jsonl

Needs CUDA for meaningful figures; under TRITON_INTERPRET=1 on CPU use `--rows 64` to check it runs.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sgl_kernel.vision import gather_blend_rows, gather_blend_rows_torch


def timed(fn, cuda: bool, iters: int) -> float:
    fn()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=96_000)
    ap.add_argument("--dims", type=int, nargs="+", default=[1152, 1024])
    ap.add_argument("--table-rows", type=int, default=2304)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", help="append one JSON line per shape")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = getattr(torch, args.dtype) if cuda else torch.float32  # the interpreter needs float32
    rows = []
    for d in args.dims:
        g = torch.Generator().manual_seed(d)
        table = torch.randn(args.table_rows, d, generator=g).to(device, dtype)
        idx = torch.randint(0, args.table_rows, (args.rows, 4), generator=g, dtype=torch.int64).to(device, torch.int32)
        w = torch.rand(args.rows, 4, generator=g).to(device)
        ref = gather_blend_rows_torch(table, idx, w, torch.float32)
        out = gather_blend_rows(table, idx, w, torch.float32, backend="triton")
        diff = ((out - ref).abs().max() / ref.abs().max()).item()
        assert diff <= 1e-5, f"kernel and torch path disagree: {diff}"
        t_ref = timed(lambda: gather_blend_rows_torch(table, idx, w), cuda, args.iters)
        t_k = timed(lambda: gather_blend_rows(table, idx, w, backend="triton"), cuda, args.iters)
        rows.append(dict(rows=args.rows, dim=d, dtype=str(dtype), device=device, torch_ms=t_ref, triton_ms=t_k,
                         ratio=t_ref / t_k, max_rel_diff=diff))
    print(f"{'rows x dim':>14} | {'torch ms':>9} | {'triton ms':>9} | ratio")
    for r in rows:
        print(f"{r['rows']:>7} x {r['dim']:<4} | {r['torch_ms']:9.3f} | {r['triton_ms']:9.3f} | {r['ratio']:.2f}x")
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
