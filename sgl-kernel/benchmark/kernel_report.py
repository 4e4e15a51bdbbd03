"""Machine-code report of every sgl-kernel Triton kernel at the real shapes of every model preset.

    python sgl-kernel/benchmark/kernel_report.py --target sm_90a [--json FILE] [--kernels varlen,decode]

Needs triton, not a GPU: each launch plan is built from meta tensors exactly as the launcher builds it
on CUDA (same blocks, warps, stages, dot precision, stride specialization), compiled for the target,
and read back (see sgl_kernel.codegen_report). One row per kernel and shape: registers, spill bytes,
shared memory, tensor-core instruction, narrowest / widest global load in bits.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass

import torch

# Text and vision shapes of the real checkpoints (docs: MISSION section 6), at TP 1.
TEXT = {  # preset: (q heads, kv heads, head_dim)
    "qwen3-vl-2b": (16, 8, 128),
    "qwen3-vl-4b": (32, 8, 128),
    "qwen3-vl-8b": (32, 8, 128),
    "qwen2.5-vl-3b": (16, 2, 128),
    "qwen2.5-vl-7b": (28, 4, 128),
    # Qwen3.5's full-attention layers (every fourth layer; the DeltaNet layers are GDN below): head_dim 256, as
    # the engine's presets (sglang/testing/presets.py) and the released 4B config (16 q / 4 kv heads, head_dim 256)
    "qwen3.5-4b": (16, 4, 256),
    "qwen3.5-35b-a3b": (16, 2, 256),
}
VISION = {  # preset: (heads, head_dim, longest segment of a 960x1280 image, windowed layers' longest)
    "qwen3-vl-2b": (16, 64, 4800, None),
    "qwen3-vl-4b": (16, 64, 4800, None),
    "qwen3-vl-8b": (16, 72, 4800, None),
    "qwen2.5-vl-3b": (16, 80, 6256, 64),
    "qwen2.5-vl-7b": (16, 80, 6256, 64),
}
POS_EMBED_DIMS = {"qwen3-vl-2b": 1024, "qwen3-vl-4b": 1024, "qwen3-vl-8b": 1152}

_TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                 torch.int32: "i32", torch.int64: "i64", torch.float8_e4m3fn: "fp8e4nv"}


def meta(*shape, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@dataclass
class Case:
    name: str
    head_dim: int | None
    dtype: torch.dtype
    plans: list  # LaunchPlans (decode has two)


def text_cases(presets, dtype) -> list[Case]:
    from sgl_kernel.attention._decode_triton import decode_workspace, plan_decode
    from sgl_kernel.attention._prefill_triton import plan_prefill

    out = []
    for p in presets:
        if p not in TEXT:
            continue
        hq, hk, d = TEXT[p]
        tokens, slots, batch = 8192, 65536, 64
        # --kv-cache-dtype fp8_e4m3: the same kernels over an e4m3 pool (bf16 models only)
        kv_dtypes = [(dtype, "")] + ([(torch.float8_e4m3fn, " kv-fp8")] if dtype == torch.bfloat16 else [])
        for kv_dtype, tag in kv_dtypes:
            q, kv = meta(tokens, hq, d, dtype=dtype), meta(slots, hk, d, dtype=kv_dtype)
            ind = meta(batch + 1, dtype=torch.int64)
            idx = meta(tokens, dtype=torch.int64)
            out.append(Case(f"extend {p} 8192 tok{tag}", d, dtype, [
                plan_prefill(q, kv, kv, q, ind, ind, idx, tokens, d ** -0.5, causal=True, on_cuda=True)]))
            qd = meta(batch, hq, d, dtype=dtype)
            mid_o, mid_lse = decode_workspace(batch, hq, d, 8, "meta")
            out.append(Case(f"decode {p} bs{batch}{tag}", d, dtype, list(
                plan_decode(qd, kv, kv, qd, ind, idx, 8, d ** -0.5, mid_o, mid_lse, on_cuda=True))))
    return out


def vision_cases(presets, dtype) -> list[Case]:
    from sgl_kernel.attention._prefill_triton import plan_prefill

    out, seen = [], set()
    for p in presets:
        if p not in VISION:
            continue
        h, d, longest, window = VISION[p]
        for label, seg in (("full", longest), ("window", window)):
            if seg is None or (d, seg, dtype) in seen:
                continue
            seen.add((d, seg, dtype))
            rows = 16384
            q = meta(rows, h, d, dtype=dtype)
            cu = meta(rows // seg + 2, dtype=torch.int32)
            plan = plan_prefill(q, q, q, q, cu, cu, None, seg, d ** -0.5, causal=False, on_cuda=True)
            out.append(Case(f"varlen {p} {label} seg {seg}", d, dtype, [plan]))
    return out


def pos_embed_cases(presets, dtype) -> list[Case]:
    from sgl_kernel.vision._pos_embed_triton import plan_gather_blend

    out = []
    for dim in sorted({POS_EMBED_DIMS[p] for p in presets if p in POS_EMBED_DIMS}):
        n = 20 * 4800
        plan = plan_gather_blend(meta(2304, dim, dtype=dtype), meta(n, 4, dtype=torch.int64),
                                 meta(n, 4, dtype=torch.float32), meta(n, dim, dtype=dtype))
        out.append(Case(f"pos-embed gather dim {dim}", None, dtype, [plan]))
    return out


VOCABS = {"qwen3-vl-2b": 151936, "qwen3-vl-4b": 151936, "qwen3-vl-8b": 151936, "qwen2.5-vl-3b": 151936,
          "qwen2.5-vl-7b": 152064}


def sampling_cases(presets, dtype) -> list[Case]:
    """The one-pass sampler over a batch of 160 rows of float32 logits (the logits processor's dtype;
    one row per case and vocabulary, whatever `dtype`)."""
    from sgl_kernel.sampling._sample_triton import plan_sample

    if dtype != torch.float32:
        return []
    out = []
    for vocab in sorted({VOCABS[p] for p in presets if p in VOCABS}):
        b = 160
        f, i = meta(b, dtype=torch.float32), meta(b, dtype=torch.int64)
        plan = plan_sample(meta(b, vocab, dtype=torch.float32), f, i, f, f, i, i, meta(b, dtype=torch.int64),
                           on_cuda=True)
        out.append(Case(f"sample vocab {vocab} bs{b}", None, torch.float32, [plan]))
    return out


def bitmask_cases(presets, dtype) -> list[Case]:
    """Constrained decoding's token bitmask on 64 of 160 float32 logits rows (the logits processor's dtype;
    one row per vocabulary, whatever `dtype`), the bitmask rows padded as the engine pads them. Pure data
    movement: no tensor cores."""
    from sgl_kernel.sampling import padded_words
    from sgl_kernel.sampling._bitmask_triton import plan_bitmask

    if dtype != torch.float32:
        return []
    out = []
    for vocab in sorted({VOCABS[p] for p in presets if p in VOCABS}):
        rows = 64
        plan = plan_bitmask(meta(160, vocab, dtype=torch.float32), meta(rows, padded_words(vocab), dtype=torch.int32),
                            meta(rows, dtype=torch.int64), vocab, on_cuda=True)
        out.append(Case(f"bitmask vocab {vocab} rows{rows}", None, torch.float32, [plan]))
    return out


# Text linears of the -FP8 releases: preset -> (hidden, intermediate, q heads, kv heads), head dim 128
FP8_LINEARS = {
    "qwen3-vl-2b": (2048, 6144, 16, 8),
    "qwen3-vl-4b": (2560, 9728, 32, 8),
    "qwen3-vl-8b": (4096, 12288, 32, 8),
    "qwen3-vl-32b": (5120, 25600, 64, 8),
}
FP8_TPS = (1, 2, 4, 8)
FP8_ROWS = (64, 4096)  # a decode batch and a prefill chunk: the two tile shapes the launch picks


def fp8_linear_shapes(preset: str, tp: int) -> dict[str, tuple[int, int, int, int]]:
    """{layer: (N, K, rows per scale, columns per scale)} of one TP rank's block-FP8 GEMMs. A shard or fused
    part that starts inside a 128-block keeps its scales at the finer granularity every part starts on
    (the loader's rule, sglang/srt/layers/quantization/base.py); below 16 columns the loader refuses."""
    from math import gcd

    hidden, inter, hq, hk = FP8_LINEARS[preset]
    q, kv, mlp = hq * 128 // tp, hk * 128 // tp, inter // tp
    rows = lambda *starts: gcd(128, *starts)  # noqa: E731
    layers = {"qkv": (q + 2 * kv, hidden, rows(q, kv), 128), "o": (hidden, q, 128, rows(q)),
              "gate_up": (2 * mlp, hidden, rows(mlp), 128), "down": (hidden, mlp, 128, rows(mlp))}
    return {k: v for k, v in layers.items() if v[3] >= 16}


def fp8_gemm_cases(presets, dtype, tps=FP8_TPS, rows=FP8_ROWS) -> list[Case]:
    """The w8a8 block-FP8 GEMM (e4m3 operands, bf16 out) at every preset's text linears and TP size."""
    from sgl_kernel.quantization._fp8_triton import plan_block_fp8_matmul

    if dtype != torch.bfloat16:
        return []
    out = []
    for p in presets:
        if p not in FP8_LINEARS:
            continue
        for tp in tps:
            for layer, (n, k, gn, gk) in fp8_linear_shapes(p, tp).items():
                for m in rows:
                    f8 = torch.float8_e4m3fn
                    plan = plan_block_fp8_matmul(
                        meta(m, k, dtype=f8), meta(m, -(-k // gk), dtype=torch.float32), meta(n, k, dtype=f8),
                        meta(-(-n // gn), -(-k // gk), dtype=torch.float32), meta(m, n, dtype=torch.bfloat16), (gn, gk))
                    out.append(Case(f"fp8-gemm {p} {layer} tp{tp} M{m} N{n} K{k}", None, f8, [plan]))
    return out


MOE = {  # preset: (experts, active, text hidden, moe intermediate)
    "qwen3-vl-30b-a3b": (128, 8, 2048, 768),
    "qwen3-vl-235b-a22b": (128, 8, 4096, 1536),
}
MOE_TPS = (1, 2, 4, 8)
MOE_TOKENS = (64, 4096)  # a decode batch (a few rows an expert: 16-row tiles) and a prefill chunk (64-row tiles)


def moe_cases(presets, dtype, tps=MOE_TPS, tokens=MOE_TOKENS) -> list[Case]:
    """The router (one per preset) and both grouped expert GEMMs at every TP size (each rank holds every
    expert with 1/tp of its intermediate dim), bf16 only: the served dtype."""
    from sgl_kernel.moe._moe_triton import moe_block_config, plan_fused_moe, plan_topk_softmax

    if dtype != torch.bfloat16:
        return []
    out = []
    i32 = torch.int32
    for p in presets:
        if p not in MOE:
            continue
        e, k, hidden, inter = MOE[p]
        for t in tokens:
            plan = plan_topk_softmax(meta(t, e), meta(t, k, dtype=torch.float32), meta(t, k, dtype=i32), True)
            out.append(Case(f"moe-topk {p} E{e} k{k} T{t}", None, dtype, [plan]))
        for tp in tps:
            n = inter // tp
            for t in tokens:
                cfg = moe_block_config(t, k, e)
                bm = cfg["BLOCK_M"]
                cap = -(-(t * k + e * (bm - 1)) // bm) * bm
                ids, experts, post = meta(cap, dtype=i32), meta(cap // bm, dtype=i32), meta(1, dtype=i32)
                up = plan_fused_moe(meta(t, hidden), meta(e, 2 * n, hidden), meta(t * k, n), None, ids, experts, post,
                                    t * k, k, True, cfg)
                down = plan_fused_moe(meta(t * k, n), meta(e, hidden, n), meta(t * k, hidden),
                                      meta(t * k, dtype=torch.float32), ids, experts, post, t * k, 1, False, cfg)
                out.append(Case(f"moe-gemm {p} gate_up tp{tp} T{t} N{n} K{hidden}", None, dtype, [up]))
                out.append(Case(f"moe-gemm {p} down tp{tp} T{t} N{hidden} K{n}", None, dtype, [down]))
    return out


def moe_fp8_cases(presets, dtype, tps=MOE_TPS, tokens=MOE_TOKENS) -> list[Case]:
    """Both grouped expert GEMMs with block-FP8 experts (e4m3 operands, bf16 out, 128x128 checkpoint
    blocks): gate_up keeps a scale per gcd(128, n) rows, down's activations and weights a group of
    gcd(128, n) columns (TP rank 1's grid, the narrower one); per rank n = inter / tp."""
    from math import gcd

    from sgl_kernel.moe._moe_triton import moe_block_config, plan_fused_moe

    if dtype != torch.bfloat16:
        return []
    out = []
    f8, f32, i32 = torch.float8_e4m3fn, torch.float32, torch.int32
    for p in presets:
        if p not in MOE:
            continue
        e, k, hidden, inter = MOE[p]
        for tp in tps:
            n = inter // tp
            b13, b2 = (gcd(128, n), 128), (128, 128 if tp == 1 else gcd(128, n))
            for t in tokens:
                cfg = moe_block_config(t, k, e)
                bm = cfg["BLOCK_M"]
                cap = -(-(t * k + e * (bm - 1)) // bm) * bm
                ids, experts, post = meta(cap, dtype=i32), meta(cap // bm, dtype=i32), meta(1, dtype=i32)
                up = plan_fused_moe(meta(t, hidden, dtype=f8), meta(e, 2 * n, hidden, dtype=f8), meta(t * k, n), None,
                                    ids, experts, post, t * k, k, True, cfg, meta(t, -(-hidden // 128), dtype=f32),
                                    meta(e, 2 * n // b13[0], -(-hidden // 128), dtype=f32), b13)
                down = plan_fused_moe(meta(t * k, n, dtype=f8), meta(e, hidden, n, dtype=f8), meta(t * k, hidden),
                                      meta(t * k, dtype=f32), ids, experts, post, t * k, 1, False, cfg,
                                      meta(t * k, -(-n // b2[1]), dtype=f32),
                                      meta(e, -(-hidden // 128), -(-n // b2[1]), dtype=f32), b2)
                out.append(Case(f"moe-fp8 {p} gate_up tp{tp} T{t} N{n} K{hidden}", None, f8, [up]))
                out.append(Case(f"moe-fp8 {p} down tp{tp} T{t} N{hidden} K{n} group{b2[1]}", None, f8, [down]))
    return out


# Gated DeltaNet geometry (TP 1): preset -> (key heads, value heads, key dim, value dim, conv kernel). Sources:
# qwen3.5-4b and qwen3.5-35b-a3b as the engine's presets cite them (sglang/testing/presets.py: 16 key / 32
# value heads of 128, conv 4); qwen3.5-27b from the Qwen3.6-27B(-FP8) model card ("Linear Attention Heads:
# 48 for V and 16 for QK, Head Dimension 128", the same Qwen3_5ForConditionalGeneration architecture) and
# transformers-format qwen3_5 configs of the 27B quoted publicly (linear_num_key_heads 16,
# linear_num_value_heads 48, linear_key/value_head_dim 128, linear_conv_kernel_dim 4): a GQA ratio of 3.
GDN = {
    "qwen3.5-4b": (16, 32, 128, 128, 4),
    "qwen3.5-27b": (16, 48, 128, 128, 4),
    "qwen3.5-35b-a3b": (16, 32, 128, 128, 4),
}
GDN_TPS = (1, 2, 4, 8)
GDN_TOKENS, GDN_SEQS, GDN_BATCH, GDN_SLOTS, GDN_LAYERS = 8192, 8, 64, 256, 24


def gdn_cases(presets, dtype, tps=GDN_TPS) -> list[Case]:
    """The Gated DeltaNet kernels at every preset's linear-attention shapes and TP size (each rank holds 1/tp of
    the key and value heads and of the conv channels), bf16 activations, float32 recurrent state, views as the
    engine passes them: q, k, v split out of the conv output (T, conv_dim), one layer of the state pools
    (slots, layers, ...). Prefill rows: 8192 tokens in 8 sequences; decode rows: a batch of 64."""
    from sgl_kernel.gdn._chunk_triton import plan_chunk_fwd, plan_chunk_prepare
    from sgl_kernel.gdn._conv_triton import plan_conv1d_edge, plan_conv1d_fwd, plan_conv1d_update
    from sgl_kernel.gdn._recurrent_triton import plan_recurrent

    if dtype != torch.bfloat16:
        return []
    f32, i32 = torch.float32, torch.int32
    t, nseq, bs, slots, layers = GDN_TOKENS, GDN_SEQS, GDN_BATCH, GDN_SLOTS, GDN_LAYERS
    out = []
    for p in presets:
        if p not in GDN:
            continue
        hk0, hv0, dk, dv, kw = GDN[p]
        for tp in tps:
            hk, hv = hk0 // tp, hv0 // tp
            key, val = hk * dk, hv * dv
            conv_dim = 2 * key + val
            tag = f"{p} tp{tp} Hk{hk} Hv{hv}"

            def split(rows):
                mixed = meta(rows, conv_dim, dtype=dtype)
                return (mixed[:, :key].view(rows, hk, dk), mixed[:, key:2 * key].view(rows, hk, dk),
                        mixed[:, 2 * key:].view(rows, hv, dv))

            state = meta(slots, layers, hv, dk, dv, dtype=f32)[:, 0]
            q, k, v = split(t)
            g, beta = meta(t, hv, dtype=f32), meta(t, hv, dtype=dtype)
            qn, kn = meta(t, hk, dk, dtype=f32), meta(t, hk, dk, dtype=f32)  # float32 workspaces
            w, u, o = meta(t, hv, dk, dtype=f32), meta(t, hv, dv, dtype=f32), meta(t, hv, dv, dtype=f32)
            cu, idx = meta(nseq + 1, dtype=i32), meta(nseq, dtype=i32)
            lo = meta(t // 64 + nseq, dtype=i32)
            out.append(Case(f"gdn-chunk {tag} T{t}", dk, dtype, [
                plan_chunk_prepare(q, k, v, g, beta, qn, kn, w, u, lo, lo, 64, dk ** -0.5, "tf32"),
                plan_chunk_fwd(qn, kn, g, w, u, o, state, cu, idx, 64, "tf32")]))
            qd, kd, vd = split(bs)
            out.append(Case(f"gdn-recurrent {tag} bs{bs}", dk, dtype, [
                plan_recurrent(qd, kd, vd, meta(bs, hv, dtype=f32), meta(bs, hv, dtype=dtype),
                               meta(bs, hv, dv, dtype=f32), state, meta(bs, dtype=i32), dk ** -0.5)]))
            conv_state = meta(slots, layers, conv_dim, kw - 1, dtype=dtype)[:, 0]
            weight = meta(conv_dim, 1, kw, dtype=dtype)[:, 0]
            x, y = meta(t, conv_dim, dtype=dtype), meta(t, conv_dim, dtype=dtype)
            out.append(Case(f"conv1d {tag} C{conv_dim} K{kw} T{t}", None, dtype, [
                plan_conv1d_fwd(x, weight, None, y, meta(t, dtype=i32), cu, True),
                plan_conv1d_edge(x, weight, None, conv_state, y, cu, idx, True)]))
            xb = meta(bs, conv_dim, dtype=dtype)
            out.append(Case(f"conv1d-update {tag} C{conv_dim} K{kw} bs{bs}", None, dtype, [
                plan_conv1d_update(xb, weight, None, conv_state, meta(bs, conv_dim, dtype=dtype), meta(bs, dtype=i32),
                                   True)]))
    return out


CASE_BUILDERS = {"extend": text_cases, "decode": text_cases, "varlen": vision_cases, "pos_embed": pos_embed_cases,
                 "sample": sampling_cases, "bitmask": bitmask_cases, "fp8_gemm": fp8_gemm_cases, "moe_topk": moe_cases,
                 "moe_gemm": moe_cases, "moe_fp8": moe_fp8_cases,
                 "gdn_chunk": gdn_cases, "gdn_recurrent": gdn_cases, "conv1d": gdn_cases, "conv1d_update": gdn_cases}


def build_cases(kernels: list[str], presets: list[str], dtypes: list[torch.dtype]) -> list[Case]:
    """Cases of the named kernels; a case's kind is the first word of its name (pos-embed: pos_embed)."""
    cases = []
    for dtype in dtypes:
        for builder in dict.fromkeys(CASE_BUILDERS[k] for k in kernels):
            cases += [c for c in builder(presets, dtype) if c.name.split()[0].replace("-", "_") in kernels]
    return cases


def plan_args(plan) -> dict:
    from sgl_kernel.codegen_report import Ptr

    return {k: Ptr(_TRITON_DTYPE[v.dtype]) if isinstance(v, torch.Tensor) else v for k, v in plan.args.items()}


def report(cases: list[Case], target: str, progress: bool = True) -> list:
    """One row per (case, plan). Plans that specialize alike (same kernel, argument types and divisibility,
    constexprs and options: e.g. one shape at several TP sizes whose strides stay multiples of 16) compile to
    the same machine code: compiled and read once, the row repeated under each case's name."""
    from dataclasses import replace

    from sgl_kernel.codegen_report import _signature, report_kernel

    rows, seen = [], {}
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a convenience
        tqdm = None
    it = [(c, plan) for c in cases for plan in c.plans]
    bar = tqdm(it, desc="compiling", disable=not progress, file=sys.stderr) if tqdm else it
    for case, plan in bar:
        args = plan_args(plan)
        note = " ".join(f"{k}={v}" for k, v in plan.constexprs.items() if k.startswith("BLOCK"))
        key = (plan.kernel, repr(_signature(plan.kernel, args, plan.constexprs)), repr(sorted(plan.options.items())))
        if key in seen:
            rows.append(replace(seen[key], case=case.name, head_dim=case.head_dim, dtype=_TRITON_DTYPE[case.dtype],
                                note=note))
            continue
        seen[key] = report_kernel(plan.kernel, case.name, args, plan.constexprs, plan.options,
                                  head_dim=case.head_dim, dtype=_TRITON_DTYPE[case.dtype], target=target, note=note)
        rows.append(seen[key])
    return rows


def print_table(rows) -> None:
    head = f"{'kernel':<22} {'case':<36} {'dtype':<5} {'regs':>4} {'spill':>6} {'smem':>7} {'mma':<18} {'ld min/max':>10}  blocks"
    print(head)
    print("-" * len(head))
    for r in rows:
        regs = "?" if r.registers is None else r.registers
        spill = "?" if r.spill_bytes is None else r.spill_bytes
        loads = f"{r.min_load_bits}/{r.max_load_bits}"
        mma = f"{r.mma} {r.mma_operands}".strip()
        print(f"{r.kernel:<22} {r.case:<36} {r.dtype:<5} {regs:>4} {spill:>6} {r.shared_bytes:>7} {mma:<18} "
              f"{loads:>10}  {r.note} w{r.num_warps} s{r.num_stages}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="sm_90a", help="GPU architecture to compile for (default sm_90a: H100/H200)")
    ap.add_argument("--json", default=None, help="write the rows as a JSON list to this file")
    ap.add_argument("--kernels", default=",".join(CASE_BUILDERS), help=f"comma list of {sorted(CASE_BUILDERS)}")
    ap.add_argument("--presets", default=",".join(dict.fromkeys([*TEXT, *FP8_LINEARS, *MOE, *GDN])),
                    help="comma list of model presets")
    ap.add_argument("--dtypes", default="bfloat16,float32", help="comma list: bfloat16, float16, float32")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1" and argv is None:
        # kernels imported under the interpreter cannot be compiled: run again without it
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    if importlib.util.find_spec("triton") is None:
        print("kernel_report: triton is not installed (pip install 'triton>=3.0'; no GPU needed)", file=sys.stderr)
        return 2
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = [k for k in kernels if k not in CASE_BUILDERS]
    if unknown:
        ap.error(f"unknown kernels {unknown}; choose from {sorted(CASE_BUILDERS)}")
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    dtypes = [getattr(torch, d.strip()) for d in args.dtypes.split(",") if d.strip()]
    t0 = time.perf_counter()
    rows = report(build_cases(kernels, presets, dtypes), args.target, progress=not args.no_progress)
    print_table(rows)
    from importlib.metadata import version

    print(f"{len(rows)} kernels compiled for {args.target} with triton {version('triton')} "
          f"in {time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.as_dict() for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
