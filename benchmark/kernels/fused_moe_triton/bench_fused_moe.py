"""Times one MoE layer's expert product at the released shapes: the torch path on CPU (the Triton kernels
on a GPU), without and with expert parallelism (one rank of --ep-size EP: E/ep experts, the other ranks'
(token, slot) rows as -1), and the block-FP8 experts (a w8a8 GEMM pair per expert).

  python benchmark/kernels/fused_moe_triton/bench_fused_moe.py [--preset qwen3-vl-30b-a3b] [--tokens 1 16 256]
      [--ep 1 2] [--fp8] [--dtype float32] [--threads 2] [--reps 3]

Prints one line per (path, ep, T): median ms over --reps runs and the experts computed on this rank."""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _time(fn, reps: int, cuda: bool) -> float:
    fn()
    out = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main(argv=None) -> list[dict]:
    from sgl_kernel.moe import fused_experts, fused_experts_fp8, topk_softmax_torch
    from sgl_kernel.quantization import quantize_weight_block_fp8
    from sglang.testing.presets import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3-vl-30b-a3b")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--ep", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--fp8", action="store_true", help="also the block-FP8 experts")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    moe, hidden = PRESETS[args.preset].text.moe, PRESETS[args.preset].text.hidden_size
    e_all, k, inter = moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size
    dtype, dev, cuda = getattr(torch, args.dtype), torch.device(args.device), args.device == "cuda"
    rows = []
    for ep in args.ep:
        e = e_all // ep  # rank 0's experts: ids [0, e)
        g = torch.Generator().manual_seed(0)
        w13 = (torch.randn(e, 2 * inter, hidden, generator=g) / hidden**0.5).to(dtype).to(dev)
        w2 = (torch.randn(e, hidden, inter, generator=g) / inter**0.5).to(dtype).to(dev)
        fp8 = None
        if args.fp8:
            q13, s13 = zip(*(quantize_weight_block_fp8(w.float().cpu()) for w in w13))
            q2, s2 = zip(*(quantize_weight_block_fp8(w.float().cpu()) for w in w2))
            fp8 = [torch.stack(t).to(dev) for t in (q13, s13, q2, s2)]
        for t in args.tokens:
            x = torch.randn(t, hidden, generator=g).to(dtype).to(dev)
            weights, ids = topk_softmax_torch(torch.randn(t, e_all, generator=g), k, True)
            ids = torch.where(ids < e, ids, -1).to(torch.int32)
            weights, ids = weights.to(dev), ids.to(dev)
            computed = int(ids[ids >= 0].unique().numel())
            ms = _time(lambda: fused_experts(x, w13, w2, weights, ids, has_remote=ep > 1), args.reps, cuda)
            rows.append(dict(path=f"{'triton' if cuda else 'torch'} {args.dtype}", ep=ep, tokens=t, ms=ms, experts=computed))
            if fp8 is not None:
                ms8 = _time(lambda: fused_experts_fp8(x, fp8[0], fp8[1], fp8[2], fp8[3], weights, ids, (128, 128),
                                                      (128, 128)), args.reps, cuda)
                rows.append(dict(path="fp8 w8a8", ep=ep, tokens=t, ms=ms8, experts=computed))
    for r in rows:
        print(f"{args.preset} {r['path']:>16} ep {r['ep']} (rank 0 of {r['ep']}) T={r['tokens']:>4}: {r['ms']:8.1f} ms, "
              f"{r['experts']} of {e_all // r['ep']} local experts computed", flush=True)
    return rows


if __name__ == "__main__":
    main()
