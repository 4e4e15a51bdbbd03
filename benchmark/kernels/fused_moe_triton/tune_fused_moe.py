"""Tunes the fused-MoE grouped GEMM (sgl_kernel.moe) on this GPU and writes upstream-named JSON configs
(sgl_kernel/moe/configs.py): for each token count M, every candidate tile config is checked against the
torch reference, timed, and the fastest kept.

  # Qwen3-VL-30B-A3B at TP1 (E=128, N=768) and the 235B at TP1 (N=1536), bf16, on the GPU at hand:
  python benchmark/kernels/fused_moe_triton/tune_fused_moe.py --preset qwen3-vl-30b-a3b --out-dir DIR
  python benchmark/kernels/fused_moe_triton/tune_fused_moe.py --preset qwen3-vl-235b-a22b --out-dir DIR
  # TP/EP change the per-rank shape: E = experts / ep, N = moe_intermediate_size / (tp / ep)
  python benchmark/kernels/fused_moe_triton/tune_fused_moe.py --preset qwen3-vl-30b-a3b --tp-size 4 --ep-size 2

--out-dir defaults to sgl_kernel/moe/configs/triton_<version>/, where the engine looks (or point
SGLANG_MOE_CONFIG_DIR at DIR). Without a CUDA device the script refuses, except --smoke: a tiny shape and
two candidates under the Triton interpreter, which checks the search, the reference check and the file
it writes (device_name=cpu; no speed meaning). --dtype fp8_w8a8 tunes the block-FP8 experts (e4m3 weights,
128x128 blocks, bf16 activations quantized per token group) and writes `...,dtype=fp8_w8a8,block_shape=[128, 128].json`;
candidates then are checked against the torch w8a8 reference."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
SMOKE = dict(num_experts=4, hidden=32, inter=16, top_k=2, batch_sizes=(1, 8))


def search_space(smoke: bool) -> list[dict]:
    """Upstream's tuning grid (BLOCK_SIZE_M/N/K, GROUP_SIZE_M, warps, stages) in the launch plan's names."""
    if smoke:
        return [dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1),
                dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=1)]
    grid = itertools.product((16, 32, 64, 128), (32, 64, 128, 256), (64, 128, 256), (1, 16, 32, 64), (4, 8), (2, 3, 4, 5))
    return [dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=g, num_warps=w, num_stages=s) for m, n, k, g, w, s in grid]


def fits(cfg: dict, n: int, hidden: int, m: int, elem: int = 2, smem: int = 227 * 1024) -> bool:
    """Prunes what cannot help or cannot compile: tiles past the problem and pipelines past shared memory
    (gate_up keeps two B tiles per stage)."""
    if cfg["BLOCK_K"] > max(16, hidden) * 2 or cfg["BLOCK_N"] > max(16, n) * 2 or cfg["BLOCK_M"] > max(16, m) * 4:
        return False
    per_stage = (cfg["BLOCK_M"] * cfg["BLOCK_K"] + 2 * cfg["BLOCK_K"] * cfg["BLOCK_N"]) * elem
    return per_stage * cfg["num_stages"] <= smem


def _fp8(w13, w2):
    """Per-expert block-FP8 weights at TP 1 granularity (gcd(128, n) rows for gate_up, 128 columns for down)."""
    from math import gcd

    from sgl_kernel.quantization import quantize_weight_block_fp8

    n = w2.shape[2]
    b13, b2 = (gcd(128, n), 128), (128, 128)
    q13, s13 = zip(*(quantize_weight_block_fp8(w.float().cpu(), b13) for w in w13))
    q2, s2 = zip(*(quantize_weight_block_fp8(w.float().cpu(), b2) for w in w2))
    return [torch.stack(t).to(w13.device) for t in (q13, s13, q2, s2)], b13, b2


def _problem(m, e, hidden, n, k, dtype, device, seed=0):
    from sgl_kernel.moe import topk_softmax_torch

    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, hidden, generator=g) * 0.5).to(dtype).to(device)
    w13 = (torch.randn(e, 2 * n, hidden, generator=g) / hidden**0.5).to(dtype).to(device)
    w2 = (torch.randn(e, hidden, n, generator=g) / n**0.5).to(dtype).to(device)
    weights, ids = topk_softmax_torch(torch.randn(m, e, generator=g), k, True)
    return x, w13, w2, weights.to(device), ids.to(device)


def _time(fn, cuda: bool, reps: int) -> float:
    fn()  # compile outside the timing
    if cuda:
        try:
            from triton.testing import do_bench
        except ImportError as e:  # pragma: no cover - a CUDA host without triton has no kernel to tune
            raise SystemExit("tune_fused_moe.py needs triton") from e

        return float(do_bench(fn, warmup=5, rep=reps))
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def tune_one(m, e, hidden, n, k, dtype, device, space, reps=25, fp8=False) -> tuple[dict, float, int]:
    """(fastest config, its ms, candidates that ran) for M tokens; each candidate's output must equal the
    torch reference (a tile config that computes wrong is never written)."""
    from sgl_kernel.moe.fp8 import fused_experts_fp8_torch, fused_experts_fp8_triton
    from sgl_kernel.moe.fused_moe import fused_experts_torch, fused_experts_triton

    x, w13, w2, weights, ids = _problem(m, e, hidden, n, k, dtype, device)
    if fp8:
        (q13, s13, q2, s2), b13, b2 = _fp8(w13, w2)
        ref = fused_experts_fp8_torch(x.float(), q13, s13, q2, s2, weights, ids, b13, b2).float()
        run = lambda cfg: fused_experts_fp8_triton(x, q13, s13, q2, s2, weights, ids, b13, b2, config=cfg,  # noqa: E731
                                                   has_remote=False)
    else:
        ref = fused_experts_torch(x.float(), w13.float(), w2.float(), weights, ids)
        run = lambda cfg: fused_experts_triton(x, w13, w2, weights, ids, config=cfg, has_remote=False)  # noqa: E731
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    best, best_ms, ran = None, float("inf"), 0
    for cfg in space:
        if not fits(cfg, n, hidden, m):
            continue
        try:
            out = run(cfg)
            ms = _time(lambda: run(cfg), x.is_cuda, reps)
        except Exception as exc:  # out of registers / shared memory: this candidate cannot run here
            print(f"  M={m} skip {cfg}: {type(exc).__name__}", file=sys.stderr)
            continue
        err = ((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        if err > tol:
            raise RuntimeError(f"M={m} config {cfg}: relative error {err:.2e} against the torch reference")
        ran += 1
        if ms < best_ms:
            best, best_ms = cfg, ms
    if best is None:
        raise RuntimeError(f"M={m}: no candidate config ran")
    return best, best_ms, ran


def shape_of(args) -> tuple[int, int, int, int]:
    """(E per rank, hidden, N per rank, top_k)."""
    if args.smoke:
        s = SMOKE
        return s["num_experts"], s["hidden"], s["inter"], s["top_k"]
    if args.preset:
        from sglang.testing.presets import PRESETS

        p = PRESETS[args.preset]
        e, k, inter, hidden = p.text.moe.num_experts, p.text.moe.num_experts_per_tok, p.text.moe.moe_intermediate_size, p.text.hidden_size
    else:
        e, k, inter, hidden = args.num_experts, args.top_k, args.intermediate_size, args.hidden_size
    if args.tp_size % args.ep_size or e % args.ep_size or inter % (args.tp_size // args.ep_size):
        raise SystemExit(f"--tp-size {args.tp_size} --ep-size {args.ep_size} does not split {e} experts of width {inter}")
    return e // args.ep_size, hidden, inter // (args.tp_size // args.ep_size), k


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", help="a MoE preset of sglang.testing.presets (qwen3-vl-30b-a3b, qwen3-vl-235b-a22b)")
    ap.add_argument("--num-experts", type=int)
    ap.add_argument("--hidden-size", type=int)
    ap.add_argument("--intermediate-size", type=int, help="moe_intermediate_size (whole, before TP)")
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--ep-size", type=int, default=1)
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "fp8_w8a8"), default="bfloat16",
                    help="fp8_w8a8: block-FP8 experts (bf16 activations)")
    ap.add_argument("--batch-size", type=int, nargs="*", help=f"token counts M to tune (default {BATCH_SIZES})")
    ap.add_argument("--out-dir", help="default: sgl_kernel/moe/configs/triton_<version>/")
    ap.add_argument("--smoke", action="store_true", help="CPU check of the script under the Triton interpreter")
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        ap.error("tuning needs a CUDA GPU and none is visible; tuned numbers come only from the device they "
                 "describe (--smoke checks this script on CPU under the Triton interpreter)")
    if not args.smoke and not args.preset and None in (args.num_experts, args.hidden_size, args.intermediate_size, args.top_k):
        ap.error("give --preset or all of --num-experts --hidden-size --intermediate-size --top-k")
    if args.smoke:
        from sgl_kernel.testing import interpreted

        with interpreted("sgl_kernel.moe._moe_triton"):
            return _run(args, torch.float32, "cpu", SMOKE["batch_sizes"])
    dtype = torch.bfloat16 if args.dtype == "fp8_w8a8" else getattr(torch, args.dtype)
    return _run(args, dtype, "cuda", tuple(args.batch_size or BATCH_SIZES))


def _run(args, dtype, device, batch_sizes) -> Path:
    from sgl_kernel.moe.configs import config_dirs, config_file_name, device_name, dtype_str, to_json

    e, hidden, n, k = shape_of(args)
    fp8 = args.dtype == "fp8_w8a8"
    space = search_space(args.smoke)
    table = {}
    for m in batch_sizes:
        cfg, ms, ran = tune_one(m, e, hidden, n, k, dtype, device, space, reps=25, fp8=fp8)
        table[str(m)] = to_json(cfg)
        print(f"E={e} N={n} H={hidden} k={k} M={m}: {ms:.3f} ms best of {ran}: {table[str(m)]}", flush=True)
    out_dir = Path(args.out_dir) if args.out_dir else config_dirs()[-1]
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = "cpu" if args.smoke else device_name()
    path = out_dir / config_file_name(e, n, dtype_str(dtype, fp8_w8a8=fp8), dev, [128, 128] if fp8 else None)
    path.write_text(json.dumps(table, indent=4) + "\n")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
