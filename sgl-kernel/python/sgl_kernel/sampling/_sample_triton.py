"""Triton kernel behind `sample_from_logits`. Imported lazily: triton is optional, and `triton.jit` decides
compiled vs interpreted (TRITON_INTERPRET=1) when this module is imported.

One program per row, grid (B,). The row (V logits) is read in blocks of BLOCK columns:

1. Pass 1 (greedy rows and rows with a filter): running max m of x = logit * inv_t, its first index, and
   the online sum Z = sum exp(x - m). A greedy row stores the argmax and stops there.
2. Search (rows with top-k or top-p): the top-k / top-p rule keeps token i iff
   #{x_j > x_i} < k and sum_{x_j > x_i} exp(x_j - m) < top_p * Z: a predicate Q(c) of a threshold c,
   monotone in c, true at c = key(m). Thresholds are int32 keys of the float bits (order-preserving, so the
   search is exact): the bracket (lo, hi] with Q(lo) false and Q(hi) true holds the smallest kept key, and
   each pass over the row evaluates PIVOTS evenly spaced thresholds at once (counts and masses in a
   (BLOCK, PIVOTS) tile), shrinking the bracket PIVOTS + 1 times. The loop stops when at most one element
   lies in (lo, hi] (it is the smallest kept one) or the bracket is one key wide: the kept set is
   {key > lo}. Typically 4-6 passes (at most 8 for the full int32 range with 15 pivots), from L2.
3. Race pass: over kept tokens (key > lo and x >= m + log(min_p)), argmax of x - log(-log u) with u the
   counter-based uniform of (seed, step, token id), computed in uint32 exactly like `hash_uniform_torch`.

Loop bounds are constexprs (VOCAB, BLOCK) or `while` loops on device values: triton 3.6's interpreter
rejects `range` bounds that are kernel arguments or loaded values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan

# key(-inf) - 1: below every non-NaN float's key
_KEY_FLOOR = tl.constexpr(-2139095042)


# Reductions through tl.reduce (a core builtin) with triton.language.standard's combine functions rather
# than tl.max / tl.sum / tl.argmax (@jit helpers): `sgl_kernel.testing.interpreted` can then run this module
# in a process where those helpers were imported compiled, and the interpreter still takes its numpy fast
# path for these combine functions (it recognises them by identity; a local combine function would run
# element by element in Python, about 70 times slower).
@triton.jit
def _max(x):
    return tl.reduce(x, 0, tl.standard._elementwise_max)


@triton.jit
def _min(x):
    return tl.reduce(x, 0, tl.standard._elementwise_min)


@triton.jit
def _sum(x):
    return tl.reduce(x, 0, tl.standard._sum_combine)


@triton.jit
def _argmax(x, lanes):
    """(max, first lane holding it) of the 1-D block x; `lanes` is tl.arange(0, BLOCK)."""
    return tl.reduce((x, lanes), 0, tl.standard._argmax_combine_tie_break_left)


@triton.jit
def _mix32(x):
    """xorshift-multiply finalizer on uint32 (products wrap mod 2^32, shifts are logical)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _row_key(seed, step):
    """uint32 key of (seed int64, step int64), as `hash_uniform_torch`'s per-row value."""
    s_lo = seed.to(tl.uint32)
    s_hi = (seed >> 32).to(tl.uint32)
    row = _mix32(s_lo ^ _mix32(s_hi ^ 0x9E3779B9))
    return _mix32(row ^ _mix32(step.to(tl.uint32) ^ 0x85EBCA6B))


@triton.jit
def _uniform(cols, row_key):
    """float32 uniforms of token ids `cols` for one row: ((mix32(id * golden + row) >> 8) + 0.5) / 2^24,
    capped below 1."""
    h = _mix32(cols.to(tl.uint32) * 0x9E3779B1 + row_key)
    u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    return tl.minimum(u, 0.99999994)  # 1 - 2^-24: u = 1 (h >> 8 = 2^24 - 1 rounds up) would give E = 0


@triton.jit
def _float_key(x):
    """int32 key with the order of the float32 values (for non-NaN x)."""
    b = x.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _sample_kernel(
    logits_ptr, stride_row,
    temp_ptr, topk_ptr, topp_ptr, minp_ptr, seed_ptr, step_ptr,
    out_ptr,
    VOCAB: tl.constexpr,
    BLOCK: tl.constexpr,
    PIVOTS: tl.constexpr,
):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride_row
    offs = tl.arange(0, BLOCK)

    t = tl.load(temp_ptr + row).to(tl.float32)
    greedy = t <= 0.0
    inv_t = tl.where(greedy, 1.0, tl.math.div_rn(1.0, tl.where(greedy, 1.0, t)))
    k = tl.load(topk_ptr + row).to(tl.int32)
    k = tl.where((k < 1) | (k > VOCAB), VOCAB, k)
    top_p = tl.load(topp_ptr + row).to(tl.float32)
    min_p = tl.load(minp_ptr + row).to(tl.float32)
    sampled = t > 0.0
    search = sampled & ((k < VOCAB) | (top_p < 1.0))
    use_min_p = sampled & (min_p > 0.0)

    # ---- pass 1: max, first argmax, online sum of exp(x - m)
    m = tl.full((), float("-inf"), tl.float32)
    arg = tl.full((), 0, tl.int32)
    z = tl.full((), 0.0, tl.float32)
    if greedy | search | use_min_p:
        for start in range(0, VOCAB, BLOCK):
            cols = start + offs
            valid = cols < VOCAB
            x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32) * inv_t
            bm, bi = _argmax(x, offs)
            m_new = tl.maximum(m, bm)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            z = z * tl.exp(m - m_safe) + _sum(tl.where(valid, tl.exp(x - m_safe), 0.0))
            arg = tl.where(bm > m, start + bi, arg)
            m = m_new

    if greedy:
        tl.store(out_ptr + row, arg.to(tl.int64))
    else:
        # ---- search: kept set {key > lo}
        lo = tl.full((), _KEY_FLOOR, tl.int64)
        hi = _float_key(m).to(tl.int64)
        c_lo = tl.full((), VOCAB, tl.int32)  # elements with key > lo
        c_hi = tl.full((), 0, tl.int32)  # elements with key > hi
        mass_limit = tl.where(top_p < 1.0, top_p * z, float("inf"))
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        j = tl.arange(0, PIVOTS).to(tl.int64) + 1
        while search & (c_lo - c_hi > 1) & (hi - lo > 1):
            # (PIVOTS,) increasing thresholds in [lo, hi): int64 arithmetic, int32 values (keys fit int32)
            piv = lo + ((hi - lo) * j) // (PIVOTS + 1)
            piv32 = piv.to(tl.int32)
            cnt = tl.full((PIVOTS,), 0, tl.int32)
            mass = tl.full((PIVOTS,), 0.0, tl.float32)
            for start in range(0, VOCAB, BLOCK):
                cols = start + offs
                valid = cols < VOCAB
                x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32) * inv_t
                key = _float_key(x)
                e = tl.exp(x - m_safe)
                gt = (key[:, None] > piv32[None, :]) & valid[:, None]
                cnt += _sum(gt.to(tl.int32))
                mass += _sum(tl.where(gt, e[:, None], 0.0))
            q = (cnt < k) & (mass < mass_limit)  # false ... false true ... true along the pivots
            new_hi = _min(tl.where(q, piv, hi))
            new_c_hi = _max(tl.where(q, cnt, c_hi))
            new_lo = _max(tl.where(q, lo, piv))
            new_c_lo = _min(tl.where(q, c_lo, cnt))
            hi = new_hi
            c_hi = new_c_hi
            lo = new_lo
            c_lo = new_c_lo

        # ---- race over kept tokens
        min_x = tl.where(use_min_p, m + tl.log(tl.where(use_min_p, min_p, 1.0)), float("-inf"))
        lo32 = lo.to(tl.int32)
        rkey = _row_key(tl.load(seed_ptr + row), tl.load(step_ptr + row))
        best = tl.full((), float("-inf"), tl.float32)
        best_i = tl.full((), 0, tl.int32)
        for start in range(0, VOCAB, BLOCK):
            cols = start + offs
            valid = cols < VOCAB
            x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32) * inv_t
            keep = valid & (_float_key(x) > lo32) & (x >= min_x)
            u = _uniform(cols, rkey)
            g = tl.where(keep, x - tl.log(-tl.log(u)), float("-inf"))
            bm, bi = _argmax(g, offs)
            best_i = tl.where(bm > best, start + bi, best_i)
            best = tl.maximum(best, bm)
        tl.store(out_ptr + row, best_i.to(tl.int64))


@triton.jit
def _uniform_kernel(seed_ptr, step_ptr, out_ptr, VOCAB: tl.constexpr, BLOCK: tl.constexpr):
    """(B, VOCAB) uniforms of the race, for testing the hash against the torch one bit for bit."""
    row = tl.program_id(0)
    rkey = _row_key(tl.load(seed_ptr + row), tl.load(step_ptr + row))
    offs = tl.arange(0, BLOCK)
    for start in range(0, VOCAB, BLOCK):
        cols = start + offs
        tl.store(out_ptr + row.to(tl.int64) * VOCAB + cols, _uniform(cols, rkey), mask=cols < VOCAB)


def _block(vocab: int, cuda: bool) -> int:
    return min(1024 if cuda else 256, triton.next_power_of_2(max(vocab, 16)))


def plan_sample(logits, temperatures, top_ks, top_ps, min_ps, seeds, steps, out, on_cuda: bool) -> LaunchPlan:
    """The launch (shapes, strides and dtypes only: meta tensors do, for the machine-code report)."""
    batch, vocab = logits.shape
    return LaunchPlan(
        _sample_kernel, (batch,),
        dict(logits_ptr=logits, stride_row=logits.stride(0), temp_ptr=temperatures, topk_ptr=top_ks,
             topp_ptr=top_ps, minp_ptr=min_ps, seed_ptr=seeds, step_ptr=steps, out_ptr=out),
        dict(VOCAB=vocab, BLOCK=_block(vocab, on_cuda), PIVOTS=16 if on_cuda else 8),
        dict(num_warps=8) if on_cuda else {},
    )


def sample_triton(logits, temperatures, top_ks, top_ps, min_ps, seeds, steps) -> torch.Tensor:
    """Launches the kernel; arguments already checked by `sample_from_logits` (1-D per-row tensors,
    logits with unit column stride)."""
    batch = logits.shape[0]
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch == 0:
        return out
    plan_sample(logits, temperatures, top_ks, top_ps, min_ps, seeds, steps, out, logits.is_cuda).launch()
    return out


def uniforms_triton(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    out = torch.empty(seeds.shape[0], vocab, dtype=torch.float32, device=seeds.device)
    if seeds.shape[0] and vocab:
        _uniform_kernel[(seeds.shape[0],)](seeds, steps, out, VOCAB=vocab, BLOCK=_block(vocab, seeds.is_cuda))
    return out
