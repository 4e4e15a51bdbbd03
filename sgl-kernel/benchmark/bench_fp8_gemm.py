"""Block-FP8 linear (per-token-group activation quantization + the w8a8 block-FP8 GEMM, both Triton)
against `torch.matmul` in bf16, at kernel_report.py's text linears (qwen3-vl-8b at TP 1, qwen3-vl-32b at
TP 8) for a decode batch (M 1 and 64) and a prefill chunk (M 4096). Each row is checked against the
torch reference before it is timed; TFLOP/s count 2*M*N*K.

  python sgl-kernel/benchmark/bench_fp8_gemm.py [--iters 50] [--out rows.jsonl]

Needs CUDA (the interpreter would take hours at these shapes); exits with a message otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from kernel_report import fp8_linear_shapes  # beside this script
from sgl_kernel.benchmarking import timed_ms
from sgl_kernel.quantization import (
    per_token_group_quant_fp8,
    quantize_weight_block_fp8,
    w8a8_block_fp8_matmul,
    w8a8_block_fp8_matmul_torch,
)

CASES = [("qwen3-vl-8b", 1), ("qwen3-vl-32b", 8)]
ROWS = (1, 64, 4096)


def bench(m: int, n: int, k: int, iters: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, generator=g, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, generator=g, device="cuda", dtype=torch.bfloat16) * 0.02
    w_q, w_s = quantize_weight_block_fp8(w)

    def fp8():
        x_q, x_s = per_token_group_quant_fp8(x)
        return w8a8_block_fp8_matmul(x_q, x_s, w_q, w_s, out_dtype=torch.bfloat16)

    x_q, x_s = per_token_group_quant_fp8(x)
    ref = w8a8_block_fp8_matmul_torch(x_q, x_s, w_q, w_s)
    diff = ((fp8().float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    fp8_ms = timed_ms(fp8, iters, warmup=3)
    bf16_ms = timed_ms(lambda: x @ w.t(), iters, warmup=3)
    tflop = 2 * m * n * k / 1e12
    return dict(m=m, n=n, k=k, fp8_ms=fp8_ms, bf16_ms=bf16_ms, speedup=bf16_ms / fp8_ms,
                fp8_tflops=tflop / (fp8_ms / 1e3), bf16_tflops=tflop / (bf16_ms / 1e3), max_rel_diff=diff)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", help="append one JSON line per row")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_fp8_gemm.py needs a CUDA device (nothing measured); on CPU the kernels are checked by "
                 "sgl-kernel/tests/test_fp8_block.py under the Triton interpreter")
    rows = []
    for preset, tp in CASES:
        for layer, (n, k, _, _) in fp8_linear_shapes(preset, tp).items():  # 128-blocks at these shapes
            for m in ROWS:
                rows.append(dict(case=f"{preset} {layer} tp{tp}", **bench(m, n, k, args.iters)))
    print(f"{'case':<28} {'M':>5} {'N':>6} {'K':>6} | {'fp8 ms':>8} {'bf16 ms':>8} | speedup | fp8 TFLOP/s | rel diff")
    for r in rows:
        r["device"] = torch.cuda.get_device_name()
        print(f"{r['case']:<28} {r['m']:>5} {r['n']:>6} {r['k']:>6} | {r['fp8_ms']:8.4f} {r['bf16_ms']:8.4f} | "
              f"{r['speedup']:6.2f}x | {r['fp8_tflops']:11.1f} | {r['max_rel_diff']:.1e}")
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    bad = [r["case"] for r in rows if not r["max_rel_diff"] < 2e-2]
    if bad:
        sys.exit(f"kernel and reference disagree (max relative diff >= 2e-2) on: {', '.join(bad)}")


if __name__ == "__main__":
    main()
