"""Attention kernels against torch SDPA's math backend, on an 8B-class layer (32 query heads, 8 kv heads,
head dim 128, bf16; `--shapes report`: every text shape of kernel_report.py's presets, decode at batch 1
and 32 and the 4 x 2048 extend), KV in a paged pool (page size 16, pages scattered at random):

- decode: batch 1, 8, 32, 64 at context 1024 (decode_attention_fwd, default 8 splits);
- extend: one request of 8192 new tokens without prefix, and 4 requests of 2048 new tokens after a
  1024-token cached prefix (extend_attention_fwd).

The torch column is `scaled_dot_product_attention` under `SDPBackend.MATH` on K/V already gathered into
dense (B, H, L, D) tensors with the KV heads repeated: the gather is NOT timed, which favours torch. Each
row is checked for agreement before it is timed.

  python sgl-kernel/benchmark/bench_attention.py [--shapes report] [--out rows.jsonl]

Needs CUDA (the Triton interpreter would take hours on these shapes); exits with a message otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from sgl_kernel.attention import decode_attention_fwd, extend_attention_fwd
from sgl_kernel.benchmarking import timed_ms as _timed_ms

HQ, HK, D, PAGE = 32, 8, 128, 16  # the default (8b) shape


def timed_ms(fn, iters: int) -> float:
    return _timed_ms(fn, iters, cuda=True, warmup=3)


def paged_pool(kv_lens: list[int], g: torch.Generator, hk: int = HK, d: int = D):
    """K/V pool with each request's tokens on randomly drawn pages; returns buffers, indptr, indices."""
    pages = [-(-n // PAGE) for n in kv_lens]
    order = torch.randperm(sum(pages) + 8, generator=g, device="cuda")
    k_buf = torch.randn((sum(pages) + 8) * PAGE, hk, d, generator=g, device="cuda", dtype=torch.bfloat16)
    v_buf = torch.randn_like(k_buf)
    idx, used = [], 0
    for n, p in zip(kv_lens, pages):
        slots = (order[used:used + p, None] * PAGE + torch.arange(PAGE, device="cuda")).flatten()[:n]
        idx.append(slots)
        used += p
    indptr = torch.tensor([0] + kv_lens, device="cuda").cumsum(0).to(torch.int32)
    return k_buf, v_buf, indptr, torch.cat(idx).to(torch.int32)


def dense_kv(buf: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, kv_lens: list[int],
             group: int = HQ // HK) -> torch.Tensor:
    """(B, HQ, L, D) with the KV heads repeated `group` times (all requests of one row have the same length)."""
    rows = [buf[indices[s:s + n].long()] for s, n in zip(indptr.tolist(), kv_lens)]
    return torch.stack(rows).repeat_interleave(group, dim=2).transpose(1, 2).contiguous()


def sdpa_math(q, k, v, causal_offset: int | None):
    """q (B, HQ, Lq, D); causal_offset None for no mask, else the prefix length (bottom-right causal)."""
    mask = None
    if causal_offset is not None:
        lq, lk = q.shape[2], k.shape[2]
        mask = torch.ones(lq, lk, dtype=torch.bool, device="cuda").tril(diagonal=causal_offset)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def bench_decode(batch: int, ctx: int, iters: int, g: torch.Generator, hq: int = HQ, hk: int = HK, d: int = D) -> dict:
    kv_lens = [ctx] * batch
    k_buf, v_buf, indptr, indices = paged_pool(kv_lens, g, hk, d)
    q = torch.randn(batch, hq, d, generator=g, device="cuda", dtype=torch.bfloat16)
    scale = d ** -0.5
    out = torch.empty_like(q)
    run = lambda: decode_attention_fwd(q, k_buf, v_buf, indptr, indices, ctx, scale, out=out)  # noqa: E731
    k, v = (dense_kv(b, indptr, indices, kv_lens, hq // hk) for b in (k_buf, v_buf))
    qd = q[:, :, None, :]
    ref = lambda: sdpa_math(qd, k, v, None)  # noqa: E731
    diff = (run().float() - ref()[:, :, 0].float()).abs().max().item()
    return dict(case=f"decode B={batch} ctx={ctx}", heads=f"{hq}/{hk}x{d}", kernel_ms=timed_ms(run, iters),
                torch_ms=timed_ms(ref, iters), max_abs_diff=diff)


def bench_extend(batch: int, prefix: int, new: int, iters: int, g: torch.Generator, hq: int = HQ, hk: int = HK,
                 d: int = D) -> dict:
    kv_lens = [prefix + new] * batch
    k_buf, v_buf, kv_indptr, indices = paged_pool(kv_lens, g, hk, d)
    q = torch.randn(batch * new, hq, d, generator=g, device="cuda", dtype=torch.bfloat16)
    qo_indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * new
    scale = d ** -0.5
    out = torch.empty_like(q)
    run = lambda: extend_attention_fwd(  # noqa: E731
        q, k_buf, v_buf, qo_indptr, kv_indptr, indices, new, scale, out=out)
    k, v = (dense_kv(b, kv_indptr, indices, kv_lens, hq // hk) for b in (k_buf, v_buf))
    qd = q.view(batch, new, hq, d).transpose(1, 2)
    ref = lambda: sdpa_math(qd, k, v, prefix)  # noqa: E731
    diff = (run().float() - ref().transpose(1, 2).reshape_as(q).float()).abs().max().item()
    return dict(case=f"extend B={batch} prefix={prefix} new={new}", heads=f"{hq}/{hk}x{d}", kernel_ms=timed_ms(run, iters),
                torch_ms=timed_ms(ref, iters), max_abs_diff=diff)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--shapes", choices=("8b", "report"), default="8b",
                    help="8b: one 32/8 x 128 layer; report: each distinct text shape of kernel_report.py")
    ap.add_argument("--out", help="append one JSON line per row")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA device (nothing measured); on CPU the kernels are checked by "
                 "sgl-kernel/tests/test_attention_*.py under TRITON_INTERPRET=1")
    g = torch.Generator(device="cuda").manual_seed(0)
    few = max(3, args.iters // 4)
    if args.shapes == "8b":
        rows = [bench_decode(b, args.ctx, args.iters, g) for b in (1, 8, 32, 64)]
        rows.append(bench_extend(1, 0, 8192, few, g))
        rows.append(bench_extend(4, 1024, 2048, few, g))
    else:
        from kernel_report import TEXT  # beside this script

        rows = []
        for hq, hk, d in sorted(set(TEXT.values())):
            rows += [bench_decode(b, args.ctx, args.iters, g, hq, hk, d) for b in (1, 32)]
            rows.append(bench_extend(4, 1024, 2048, few, g, hq, hk, d))
    print(f"bf16, page size {PAGE}; torch = SDPA math on pre-gathered K/V")
    print(f"{'case':<34} | {'q/kv x dim':>10} | {'kernel ms':>9} | {'torch ms':>9} | speedup | max |diff|")
    for r in rows:
        r.update(device=torch.cuda.get_device_name(), speedup=r["torch_ms"] / r["kernel_ms"])
        print(f"{r['case']:<34} | {r['heads']:>10} | {r['kernel_ms']:9.3f} | {r['torch_ms']:9.3f} | "
              f"{r['speedup']:6.1f}x | {r['max_abs_diff']:.2e}")
    bad = [r["case"] for r in rows if not r["max_abs_diff"] < 5e-2]
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    if bad:
        sys.exit(f"kernel and torch disagree (max |diff| >= 5e-2) on: {', '.join(bad)}")


if __name__ == "__main__":
    main()
