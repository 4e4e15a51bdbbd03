"""Gated DeltaNet kernels (sgl_kernel.gdn) at Qwen3.5's linear-attention shapes (kernel_report.py's GDN table,
heads divided by TP): the chunked prefill's TFLOP/s and the decode step's GB/s against the bandwidth floor.

  python sgl-kernel/benchmark/bench_gdn.py [--presets qwen3.5-4b,qwen3.5-27b] [--tps 1,8] [--iters 20] [--out F]
  python sgl-kernel/benchmark/bench_gdn.py --interpret     # CPU: tiny shapes under the Triton interpreter

Every row is checked against the torch reference (`*_torch`, float32 math on the same bf16 inputs) before it is
timed (max difference relative to the largest magnitude, < 2e-2).

- gdn-chunk: bf16 q, k, v, beta, float32 g and state pool; T tokens in `--seqs` equal sequences. TFLOP/s count
  the matrix products of the chunked algorithm once per chunk and value head (BT = 64, D = Dk = Dv):
  2 * (BT^2 (3 Dk + 2 Dv) + 4 BT^3 + 3 BT Dk Dv) (K K^T, the inverse's two merge levels, W, U, W S, Q K^T,
  Q S, (Q K^T) u, K^T u), i.e. what a tensor core must execute, not the kernels' recomputation per Dv block.
- gdn-recurrent: one token for each of B requests; GB/s count the state read and written in place
  (2 B Hv Dk Dv 4 bytes) plus q, k, v, g, beta and o. The floor is a device-to-device copy of the state's bytes
  (reads and writes the same amount); `% floor` = copy time / kernel time.
- conv1d / conv1d-update: bf16 x (T or B, conv_dim), kernel 4: GB/s of x in + y out (+ states).

Needs CUDA for meaningful figures; without it the script says so and exits, unless `--interpret`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="qwen3.5-4b,qwen3.5-27b")
    ap.add_argument("--tps", default="1,8")
    ap.add_argument("--tokens", type=int, default=8192, help="prefill tokens per step")
    ap.add_argument("--seqs", default="1,8", help="comma list: sequences the prefill tokens are split into")
    ap.add_argument("--batches", default="1,64,256", help="comma list: decode batch sizes")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", help="append one JSON line per row")
    ap.add_argument("--interpret", action="store_true",
                    help="CPU: run tiny float32 shapes under TRITON_INTERPRET=1 (proves the script, measures nothing)")
    return ap.parse_args(argv)


def chunk_flops(lens, hv: int, dk: int, dv: int, bt: int = 64) -> int:
    chunks = sum(-(-n // bt) for n in lens)
    return 2 * chunks * hv * (bt * bt * (3 * dk + 2 * dv) + 4 * bt ** 3 + 3 * bt * dk * dv)


def _rel(a, b) -> float:
    b = b.float()
    return float((a.float() - b).abs().max() / b.abs().max().clamp_min(1e-6))


def _inputs(torch, t, hk, hv, dk, dv, dev, dtype, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    mixed = torch.randn(t, 2 * hk * dk + hv * dv, generator=g, device=dev).to(dtype)  # the conv output's layout
    q = mixed[:, :hk * dk].view(t, hk, dk)
    k = mixed[:, hk * dk:2 * hk * dk].view(t, hk, dk)
    v = mixed[:, 2 * hk * dk:].view(t, hv, dv)
    gate = -torch.rand(t, hv, generator=g, device=dev) * 0.5
    beta = torch.rand(t, hv, generator=g, device=dev).to(dtype)
    return q, k, v, gate, beta


def bench_chunk(torch, gdn, timed_ms, hk, hv, dk, dv, lens, iters, dev, dtype, cuda):
    t = sum(lens)
    q, k, v, gate, beta = _inputs(torch, t, hk, hv, dk, dv, dev, dtype, t)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device=dev)
    slots = torch.arange(len(lens), dtype=torch.int32, device=dev) * 2  # every other slot of the pool
    pool = torch.randn(2 * len(lens), 2, hv, dk, dv, device=dev)[:, 1] * 0.1  # one layer's view
    ref_pool, out_pool = pool.clone(), pool.clone()
    ref = gdn.chunk_gated_delta_rule_torch(q, k, v, gate, beta, cu, ref_pool, slots)
    out = gdn.chunk_gated_delta_rule_fwd(q, k, v, gate, beta, cu, out_pool, slots, backend="triton")
    diff = max(_rel(out, ref), _rel(out_pool, ref_pool))
    ms = timed_ms(lambda: gdn.chunk_gated_delta_rule_fwd(q, k, v, gate, beta, cu, pool, slots, backend="triton"),
                  iters, cuda=cuda, warmup=2)
    return dict(ms=ms, tflops=chunk_flops(lens, hv, dk, dv) / (ms / 1e3) / 1e12, max_rel_diff=diff)


def bench_recurrent(torch, gdn, timed_ms, hk, hv, dk, dv, b, iters, dev, dtype, cuda):
    q, k, v, gate, beta = _inputs(torch, b, hk, hv, dk, dv, dev, dtype, b)
    pool = torch.randn(2 * b, 2, hv, dk, dv, device=dev)[:, 1] * 0.1
    slots = torch.randperm(2 * b, device=dev)[:b].to(torch.int32)
    ref_pool, out_pool = pool.clone(), pool.clone()
    ref = gdn.recurrent_gated_delta_rule_update_torch(q, k, v, gate, beta, ref_pool, slots)
    out = gdn.recurrent_gated_delta_rule_update(q, k, v, gate, beta, out_pool, slots, backend="triton")
    diff = max(_rel(out, ref), _rel(out_pool, ref_pool))
    o = torch.empty(b, hv, dv, device=dev)
    ms = timed_ms(lambda: gdn.recurrent_gated_delta_rule_update(q, k, v, gate, beta, pool, slots, out=o,
                                                                backend="triton"), iters, cuda=cuda, warmup=2)
    state_bytes = b * hv * dk * dv * 4
    moved = 2 * state_bytes + q.element_size() * b * (2 * hk * dk + hv * dv + hv) + 4 * b * hv * (1 + dv)
    src, dst = torch.empty(state_bytes // 4, device=dev), torch.empty(state_bytes // 4, device=dev)
    floor_ms = timed_ms(lambda: dst.copy_(src), iters, cuda=cuda, warmup=2)
    return dict(ms=ms, gbps=moved / (ms / 1e3) / 1e9, floor_ms=floor_ms, pct_floor=100 * floor_ms / ms,
                max_rel_diff=diff)


def bench_conv(torch, gdn, timed_ms, conv_dim, kw, lens, iters, dev, dtype, cuda, decode):
    t = sum(lens)
    g = torch.Generator(device=dev).manual_seed(t)
    x = torch.randn(t, conv_dim, generator=g, device=dev).to(dtype)
    w = (torch.randn(conv_dim, 1, kw, generator=g, device=dev) * 0.5).to(dtype)
    pool = torch.randn(2 * len(lens), 2, conv_dim, kw - 1, generator=g, device=dev).to(dtype)[:, 0]
    slots = torch.arange(len(lens), dtype=torch.int32, device=dev) * 2
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device=dev)
    ref_pool, out_pool = pool.clone(), pool.clone()
    if decode:
        ref = gdn.causal_conv1d_update_torch(x, w, None, ref_pool, slots)
        out = gdn.causal_conv1d_update(x, w, None, out_pool, slots, backend="triton")
        fn = lambda: gdn.causal_conv1d_update(x, w, None, pool, slots, backend="triton")  # noqa: E731
    else:
        ref = gdn.causal_conv1d_fwd_torch(x, w, None, ref_pool, slots, cu)
        out = gdn.causal_conv1d_fwd(x, w, None, out_pool, slots, cu, backend="triton")
        fn = lambda: gdn.causal_conv1d_fwd(x, w, None, pool, slots, cu, backend="triton")  # noqa: E731
    diff = max(_rel(out, ref), _rel(out_pool, ref_pool))
    ms = timed_ms(fn, iters, cuda=cuda, warmup=2)
    moved = 2 * x.numel() * x.element_size() + 2 * len(lens) * conv_dim * (kw - 1) * x.element_size()
    return dict(ms=ms, gbps=moved / (ms / 1e3) / 1e9, max_rel_diff=diff)


def main(argv=None) -> int:
    args = _args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    import torch

    if not args.interpret and not torch.cuda.is_available():
        print("bench_gdn.py needs a CUDA device (nothing measured). On CPU the kernels are checked by "
              "sgl-kernel/tests/test_gdn_*.py under the Triton interpreter; `--interpret` runs this script on tiny "
              "shapes to prove it works.", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernel_report import GDN  # beside this script

    import sgl_kernel.gdn as gdn
    from sgl_kernel.benchmarking import timed_ms

    cuda = not args.interpret
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    if args.interpret:  # the interpreter takes seconds per program: a toy layer
        shapes = [("toy", 1, 2, 4, 32, 32, 4)]
        tokens, seqs, batches, iters = 80, [1, 2], [2], 1
    else:
        presets = [p.strip() for p in args.presets.split(",") if p.strip()]
        unknown = [p for p in presets if p not in GDN]
        if unknown:
            print(f"unknown presets {unknown}; choose from {sorted(GDN)}", file=sys.stderr)
            return 2
        shapes = []
        for p in presets:
            hk, hv, dk, dv, kw = GDN[p]
            shapes += [(p, tp, hk // tp, hv // tp, dk, dv, kw) for tp in (int(x) for x in args.tps.split(","))]
        tokens, iters = args.tokens, args.iters
        seqs = [int(x) for x in args.seqs.split(",")]
        batches = [int(x) for x in args.batches.split(",")]
    rows = []
    for p, tp, hk, hv, dk, dv, kw in shapes:
        tag = f"{p} tp{tp} Hk{hk} Hv{hv}"
        conv_dim = 2 * hk * dk + hv * dv
        for n in seqs:
            lens = [tokens // n] * n
            rows.append(dict(kind="gdn-chunk", case=f"{tag} T{tokens} seqs{n}",
                             **bench_chunk(torch, gdn, timed_ms, hk, hv, dk, dv, lens, iters, dev, dtype, cuda)))
            rows.append(dict(kind="conv1d", case=f"{tag} C{conv_dim} T{tokens} seqs{n}",
                             **bench_conv(torch, gdn, timed_ms, conv_dim, kw, lens, iters, dev, dtype, cuda, False)))
        for b in batches:
            rows.append(dict(kind="gdn-recurrent", case=f"{tag} bs{b}",
                             **bench_recurrent(torch, gdn, timed_ms, hk, hv, dk, dv, b, iters, dev, dtype, cuda)))
            rows.append(dict(kind="conv1d-update", case=f"{tag} C{conv_dim} bs{b}",
                             **bench_conv(torch, gdn, timed_ms, conv_dim, kw, [1] * b, iters, dev, dtype, cuda, True)))
    device = torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter: not a measurement)"
    print(f"{'kind':<14} {'case':<42} {'ms':>9} {'TFLOP/s':>8} {'GB/s':>8} {'% floor':>8} {'rel diff':>9}   [{device}]")
    for r in rows:
        r["device"] = device
        tf = f"{r['tflops']:8.1f}" if "tflops" in r else f"{'':>8}"
        gb = f"{r['gbps']:8.0f}" if "gbps" in r else f"{'':>8}"
        fl = f"{r['pct_floor']:7.0f}%" if "pct_floor" in r else f"{'':>8}"
        print(f"{r['kind']:<14} {r['case']:<42} {r['ms']:9.4f} {tf} {gb} {fl} {r['max_rel_diff']:9.1e}")
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    bad = [f"{r['kind']} {r['case']}" for r in rows if not r["max_rel_diff"] < 2e-2]
    if bad:
        print(f"kernel and reference disagree (max relative diff >= 2e-2) on: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
