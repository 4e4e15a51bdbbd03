"""Triton kernels of the chunked gated delta rule (prefill / extend). Imported lazily (triton is optional)
and after the interpreter choice, see `sgl_kernel.testing`.

Per value head the state S (Dk x Dv, float32) follows, token by token,
    S <- exp(g_t) S;  S <- S + k_t beta_t (v_t - S^T k_t)^T;  o_t = S^T q_t
(q, k L2-normalised, q scaled). Inside a chunk of BT tokens, with G the inclusive cumulative sum of g
over the chunk and D_ij = exp(G_i - G_j) (i >= j), the corrections u_j = beta_j (v_j - S_{j-1}^T k_j)
solve the unit lower-triangular system (I + A) u = beta v - diag(beta e^G) K S0, A_ij = beta_i D_ij k_i.k_j
(i > j). With T = (I + A)^-1 (the UT transform):
    W = T diag(beta e^G) K,  U = T diag(beta) V    (state-independent: one program per chunk, in parallel)
    u = U - W S0,  o = diag(e^G) Q S0 + tril(D * Q K^T) u,  S_end = e^{G_n} S0 + (diag(e^{G_n - G}) K)^T u
                                                   (sequential over a sequence's chunks, state carried)
Two launches: `_gdn_chunk_prepare_kernel` writes W and U (float32 workspaces) for every chunk of every
sequence at once, and the L2-normalised (q scaled) q and k, float32, once per key head;
`_gdn_chunk_fwd_kernel` walks each sequence's chunks with the state tile in registers, reading the initial
state from the pool slot of the sequence and writing the final state back there. The normalisation in the
first kernel makes every tile of the sequential loop a plain load, which the software pipeline copies
straight into shared memory for the tensor cores: no register staging, no spills at Dk = Dv = 128.

T is computed exactly in float32 on the CUDA cores for the 16 x 16 diagonal blocks (forward substitution,
all blocks at once), then merged with tensor-core dots: for blocks of size b, T_2b = T_b - T_b M_2b T_b
with M_2b the part of A coupling the two halves of each 2b block. Every matrix product is a `tl.dot`, in
one precision: float32 operands take tf32 on CUDA (about 1e-3 relative per product; "ieee" on request
and always under the interpreter, which computes exactly).

Reductions and scans go through tl.reduce / tl.associative_scan with triton.language.standard's combine
functions, and no tl.zeros / tl.sum / tl.cdiv (@jit helpers) are used, so `sgl_kernel.testing.interpreted`
can run this module on CPU in a process where triton was imported compiled.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan

L2_EPS = 1e-6
_SUB = 16  # the diagonal blocks of T solved by forward substitution
SUB = tl.constexpr(_SUB)
MAX_TILE = 64  # head-dim columns of one tile (Dk, Dv 128: two)


@triton.jit
def _sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._sum_combine)


@triton.jit
def _l2norm_rows(x, eps):
    """x (R, D) float32, zero past the head dim: each row over sqrt(sum x^2 + eps)."""
    return x * (1.0 / tl.sqrt(_sum(x * x, 1) + eps))[:, None]


@triton.jit
def _rows(ptr, rows64, stride_t, head_off, col0, rmask, DK, BKH: tl.constexpr):
    """(BT, BKH) float32 tile: columns [col0, col0 + BKH) of the given rows of one head, zero outside."""
    cols = col0 + tl.arange(0, BKH)
    x = tl.load(ptr + rows64[:, None] * stride_t + head_off + cols[None, :],
                mask=rmask[:, None] & (cols < DK)[None, :], other=0.0)
    return x.to(tl.float32)


@triton.jit
def _store_rows(ptr, x, rows64, stride_t, head_off, col0, rmask, DK, BKH: tl.constexpr):
    cols = col0 + tl.arange(0, BKH)
    tl.store(ptr + rows64[:, None] * stride_t + head_off + cols[None, :], x,
             mask=rmask[:, None] & (cols < DK)[None, :])


@triton.jit
def _gdn_chunk_prepare_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, qn_ptr, kn_ptr, w_ptr, u_ptr,
                              chunk_lo_ptr, chunk_hi_ptr, stride_qt, stride_qh, stride_kt, stride_kh,
                              stride_vt, stride_vh, stride_gt, stride_gh, stride_bt, stride_bh,
                              stride_nt, stride_nh, stride_wt, stride_wh, stride_ut, stride_uh,
                              DK, DV, GROUP, scale, eps,
                              BT: tl.constexpr, BKH: tl.constexpr, NK: tl.constexpr, BVH: tl.constexpr,
                              NVB: tl.constexpr, NSUB: tl.constexpr, NMERGE: tl.constexpr,
                              DOT_PRECISION: tl.constexpr):
    """One (chunk, value head) a program: W = T diag(beta e^G) K and U = T diag(beta) V, T = (I + A)^-1, and
    (the first value head of each key head) the L2-normalised k and scaled q, float32, for the sequential
    kernel. Chunks come from the (chunk_lo, chunk_hi) token table; an empty entry (lo == hi) is padding.
    Dk and Dv are handled in tiles of BKH / BVH columns and the norms are row scales of raw dots, so no
    64 x 128 float32 tile has to live in registers at Dk = Dv = 128."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    lo = tl.load(chunk_lo_ptr + c)
    hi = tl.load(chunk_hi_ptr + c)
    if hi <= lo:
        return
    hk = h // GROUP
    first = h % GROUP == 0
    rows = lo + tl.arange(0, BT)
    rmask = rows < hi
    rows64 = rows.to(tl.int64)
    g = tl.load(g_ptr + rows64 * stride_gt + h * stride_gh, mask=rmask, other=0.0).to(tl.float32)
    b = tl.load(beta_ptr + rows64 * stride_bt + h * stride_bh, mask=rmask, other=0.0).to(tl.float32)
    cum = tl.associative_scan(g, 0, tl.standard._sum_combine)

    k0 = _rows(k_ptr, rows64, stride_kt, hk * stride_kh, 0, rmask, DK, BKH)
    kk = _sum(k0 * k0, 1)
    kk_dot = tl.dot(k0, tl.trans(k0), input_precision=DOT_PRECISION)
    if NK == 2:
        k1 = _rows(k_ptr, rows64, stride_kt, hk * stride_kh, BKH, rmask, DK, BKH)
        kk += _sum(k1 * k1, 1)
        kk_dot += tl.dot(k1, tl.trans(k1), input_precision=DOT_PRECISION)
    rk = 1.0 / tl.sqrt(kk + eps)
    if first:
        _store_rows(kn_ptr, k0 * rk[:, None], rows64, stride_nt, hk * stride_nh, 0, rmask, DK, BKH)
        q0 = _rows(q_ptr, rows64, stride_qt, hk * stride_qh, 0, rmask, DK, BKH)
        qq = _sum(q0 * q0, 1)
        if NK == 2:
            _store_rows(kn_ptr, k1 * rk[:, None], rows64, stride_nt, hk * stride_nh, BKH, rmask, DK, BKH)
            q1 = _rows(q_ptr, rows64, stride_qt, hk * stride_qh, BKH, rmask, DK, BKH)
            qq += _sum(q1 * q1, 1)
        rq = scale / tl.sqrt(qq + eps)
        _store_rows(qn_ptr, q0 * rq[:, None], rows64, stride_nt, hk * stride_nh, 0, rmask, DK, BKH)
        if NK == 2:
            _store_rows(qn_ptr, q1 * rq[:, None], rows64, stride_nt, hk * stride_nh, BKH, rmask, DK, BKH)

    ii = tl.arange(0, BT)[:, None]
    jj = tl.arange(0, BT)[None, :]
    below = ii > jj
    # mask the exponent first: above the diagonal G_i - G_j >= 0 could overflow
    decay = tl.exp(tl.where(below, cum[:, None] - cum[None, :], 0.0))
    a = tl.where(below, (b * rk)[:, None] * rk[None, :] * decay * kk_dot, 0.0)

    # T on the 16 x 16 diagonal blocks: forward substitution, every block at once, exact float32
    a4 = tl.reshape(a, (NSUB, SUB, NSUB, SUB))
    same4 = tl.arange(0, NSUB)[:, None, None, None] == tl.arange(0, NSUB)[None, None, :, None]
    a3 = _sum(tl.where(same4, a4, 0.0), 2)  # (NSUB, SUB, SUB): block b, row r, column c
    r3 = tl.arange(0, SUB)[None, :, None]
    c3 = tl.arange(0, SUB)[None, None, :]
    t3 = tl.where(r3 == c3, 1.0, 0.0) + tl.full((NSUB, SUB, SUB), 0.0, tl.float32)
    for r in tl.static_range(1, SUB):
        a_r = _sum(tl.where(r3 == r, a3, 0.0), 1)  # (NSUB, SUB): row r of each block (zero at c >= r)
        upd = _sum(a_r[:, :, None] * t3, 1)  # (NSUB, SUB): sum_{c<r} a[r, c] T[c, :]
        t3 = tl.where(r3 == r, t3 - upd[:, None, :], t3)
    t = tl.reshape(tl.where(same4, tl.expand_dims(t3, 2), 0.0), (BT, BT))

    # merge: T_2b = T_b - T_b M_2b T_b, M_2b the part of A coupling the halves of each 2b block
    for m in tl.static_range(NMERGE):
        couple = ((ii // (2 * SUB << m)) == (jj // (2 * SUB << m))) & ((ii // (SUB << m)) != (jj // (SUB << m)))
        tm = tl.dot(t, tl.where(couple, a, 0.0), input_precision=DOT_PRECISION)
        t = t - tl.dot(tm, t, input_precision=DOT_PRECISION)

    # W = (T diag(beta e^G / |k|)) K, tile by tile; U = (T diag(beta)) V
    tw = t * (b * tl.exp(cum) * rk)[None, :]
    _store_rows(w_ptr, tl.dot(tw, k0, input_precision=DOT_PRECISION), rows64, stride_wt, h * stride_wh, 0, rmask,
                DK, BKH)
    if NK == 2:
        _store_rows(w_ptr, tl.dot(tw, k1, input_precision=DOT_PRECISION), rows64, stride_wt, h * stride_wh, BKH,
                    rmask, DK, BKH)
    tu = t * b[None, :]
    for j in tl.static_range(NVB):
        vj = _rows(v_ptr, rows64, stride_vt, h * stride_vh, j * BVH, rmask, DV, BVH)
        _store_rows(u_ptr, tl.dot(tu, vj, input_precision=DOT_PRECISION), rows64, stride_ut, h * stride_uh, j * BVH,
                    rmask, DV, BVH)


@triton.jit
def _gdn_chunk_fwd_kernel(qn_ptr, kn_ptr, g_ptr, w_ptr, u_ptr, o_ptr, state_ptr, cu_ptr, slot_ptr,
                          stride_nt, stride_nh, stride_gt, stride_gh, stride_wt, stride_wh,
                          stride_ut, stride_uh, stride_ot, stride_oh, stride_ss, stride_sh, stride_sk,
                          DK, DV, GROUP,
                          BT: tl.constexpr, BKH: tl.constexpr, NK: tl.constexpr, BV: tl.constexpr,
                          DOT_PRECISION: tl.constexpr):
    """One (sequence, value head, Dv block) a program: the sequence's chunks in order, the state tile
    (Dk x BV, float32, as NK tiles of BKH rows) carried in registers from the pool slot and written back
    there at the end. q and k come normalised from the prepare kernel, so every dot operand but two (the
    masked Q K^T and K^T) is a plain load."""
    s = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    bos = tl.load(cu_ptr + s).to(tl.int32)
    eos = tl.load(cu_ptr + s + 1).to(tl.int32)
    slot = tl.load(slot_ptr + s).to(tl.int64)
    hk = h // GROUP
    offs_v = vb * BV + tl.arange(0, BV)
    vok = offs_v < DV
    offs_k0 = tl.arange(0, BKH)
    s_ptrs0 = state_ptr + slot * stride_ss + h * stride_sh + offs_k0[:, None] * stride_sk + offs_v[None, :]
    s_mask0 = (offs_k0 < DK)[:, None] & vok[None, :]
    st0 = tl.load(s_ptrs0, mask=s_mask0, other=0.0)
    s_ptrs1 = s_ptrs0 + BKH * stride_sk
    s_mask1 = ((offs_k0 + BKH) < DK)[:, None] & vok[None, :]
    if NK == 2:
        st1 = tl.load(s_ptrs1, mask=s_mask1, other=0.0)
    else:
        st1 = st0

    ii = tl.arange(0, BT)[:, None]
    jj = tl.arange(0, BT)[None, :]
    causal = ii >= jj
    last = tl.arange(0, BT) == BT - 1
    n_chunks = (eos - bos + BT - 1) // BT
    for c in range(0, n_chunks):
        rows = bos + c * BT + tl.arange(0, BT)
        rmask = rows < eos
        rows64 = rows.to(tl.int64)
        # padding rows have g = 0: the cumulative sum there stays at the last token's value
        g = tl.load(g_ptr + rows64 * stride_gt + h * stride_gh, mask=rmask, other=0.0).to(tl.float32)
        cum = tl.associative_scan(g, 0, tl.standard._sum_combine)
        g_last = _sum(tl.where(last, cum, 0.0), 0)
        # u = U - W S0
        u = tl.load(u_ptr + rows64[:, None] * stride_ut + h * stride_uh + offs_v[None, :],
                    mask=rmask[:, None] & vok[None, :], other=0.0)
        u = u - tl.dot(_rows(w_ptr, rows64, stride_wt, h * stride_wh, 0, rmask, DK, BKH), st0,
                       input_precision=DOT_PRECISION)
        if NK == 2:
            u = u - tl.dot(_rows(w_ptr, rows64, stride_wt, h * stride_wh, BKH, rmask, DK, BKH), st1,
                           input_precision=DOT_PRECISION)
        # o = diag(e^G) Q S0 + (D * Q K^T) u
        q0 = _rows(qn_ptr, rows64, stride_nt, hk * stride_nh, 0, rmask, DK, BKH)
        k0 = _rows(kn_ptr, rows64, stride_nt, hk * stride_nh, 0, rmask, DK, BKH)
        qk = tl.dot(q0, tl.trans(k0), input_precision=DOT_PRECISION)
        o = tl.dot(q0, st0, input_precision=DOT_PRECISION)
        if NK == 2:
            q1 = _rows(qn_ptr, rows64, stride_nt, hk * stride_nh, BKH, rmask, DK, BKH)
            k1 = _rows(kn_ptr, rows64, stride_nt, hk * stride_nh, BKH, rmask, DK, BKH)
            qk += tl.dot(q1, tl.trans(k1), input_precision=DOT_PRECISION)
            o += tl.dot(q1, st1, input_precision=DOT_PRECISION)
        qk = tl.where(causal, qk * tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)
        o = o * tl.exp(cum)[:, None] + tl.dot(qk, u, input_precision=DOT_PRECISION)
        tl.store(o_ptr + rows64[:, None] * stride_ot + h * stride_oh + offs_v[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=rmask[:, None] & vok[None, :])
        # S_end = e^{G_n} S0 + K^T diag(e^{G_n - G}) u
        uc = u * tl.exp(g_last - cum)[:, None]
        st0 = st0 * tl.exp(g_last) + tl.dot(tl.trans(k0), uc, input_precision=DOT_PRECISION)
        if NK == 2:
            st1 = st1 * tl.exp(g_last) + tl.dot(tl.trans(k1), uc, input_precision=DOT_PRECISION)
    tl.store(s_ptrs0, st0, mask=s_mask0)
    if NK == 2:
        tl.store(s_ptrs1, st1, mask=s_mask1)


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(int(n)))


def chunk_launch_config(dk: int, dv: int, on_cuda: bool = True) -> dict:
    """Tiles and launch options of both kernels (see benchmark/kernel_report.py for what they compile to on
    sm_90a): Dk and Dv in tiles of at most 64 columns (Dk at most 128), BV value columns a sequential
    program."""
    bk, bdv = _pow2(dk), _pow2(dv)
    if bk > 2 * MAX_TILE:
        raise ValueError(f"chunked gated delta rule: key head dim {dk} > {2 * MAX_TILE} is not supported")
    nk = 1 if bk <= MAX_TILE else 2
    bvh = min(bdv, MAX_TILE)
    tiles = dict(BKH=bk // nk, NK=nk, BVH=bvh, NVB=bdv // bvh)
    if not on_cuda:
        return dict(tiles, BV=bdv, prep_warps=4, fwd_warps=4, fwd_stages=1)
    # sm_90a, Dk = Dv = 128 (kernel_report rows): the sequential kernel's loads pipelined into shared memory
    # (2 stages, 205 KB) with 8 warps is the setting without spills; one stage hoists every tile of an
    # iteration into registers and spills
    return dict(tiles, BV=min(bdv, 32), prep_warps=4, fwd_warps=8, fwd_stages=2)


def plan_chunk_prepare(q, k, v, g, beta, qn, kn, w, u, chunk_lo, chunk_hi, chunk: int, scale: float,
                       dot_precision: str, on_cuda: bool = True) -> LaunchPlan:
    hk, dk = k.shape[1], k.shape[2]
    hv, dv = v.shape[1], v.shape[2]
    cfg = chunk_launch_config(dk, dv, on_cuda)
    nsub = chunk // _SUB
    return LaunchPlan(
        _gdn_chunk_prepare_kernel, (chunk_lo.shape[0], hv),
        dict(q_ptr=q, k_ptr=k, v_ptr=v, g_ptr=g, beta_ptr=beta, qn_ptr=qn, kn_ptr=kn, w_ptr=w, u_ptr=u,
             chunk_lo_ptr=chunk_lo, chunk_hi_ptr=chunk_hi, stride_qt=q.stride(0), stride_qh=q.stride(1),
             stride_kt=k.stride(0), stride_kh=k.stride(1), stride_vt=v.stride(0), stride_vh=v.stride(1),
             stride_gt=g.stride(0), stride_gh=g.stride(1), stride_bt=beta.stride(0), stride_bh=beta.stride(1),
             stride_nt=qn.stride(0), stride_nh=qn.stride(1), stride_wt=w.stride(0), stride_wh=w.stride(1),
             stride_ut=u.stride(0), stride_uh=u.stride(1), DK=dk, DV=dv, GROUP=hv // hk, scale=float(scale),
             eps=L2_EPS),
        dict(BT=chunk, BKH=cfg["BKH"], NK=cfg["NK"], BVH=cfg["BVH"], NVB=cfg["NVB"], NSUB=nsub,
             NMERGE=nsub.bit_length() - 1, DOT_PRECISION=dot_precision),
        dict(num_warps=cfg["prep_warps"], num_stages=1),
    )


def plan_chunk_fwd(qn, kn, g, w, u, out, state, cu_seqlens, slots, chunk: int, dot_precision: str,
                   on_cuda: bool = True) -> LaunchPlan:
    hk, dk = kn.shape[1], kn.shape[2]
    hv, dv = out.shape[1], out.shape[2]
    cfg = chunk_launch_config(dk, dv, on_cuda)
    bv = cfg["BV"]
    return LaunchPlan(
        _gdn_chunk_fwd_kernel, (slots.shape[0], hv, -(-dv // bv)),
        dict(qn_ptr=qn, kn_ptr=kn, g_ptr=g, w_ptr=w, u_ptr=u, o_ptr=out, state_ptr=state, cu_ptr=cu_seqlens,
             slot_ptr=slots, stride_nt=qn.stride(0), stride_nh=qn.stride(1), stride_gt=g.stride(0),
             stride_gh=g.stride(1), stride_wt=w.stride(0), stride_wh=w.stride(1), stride_ut=u.stride(0),
             stride_uh=u.stride(1), stride_ot=out.stride(0), stride_oh=out.stride(1), stride_ss=state.stride(0),
             stride_sh=state.stride(1), stride_sk=state.stride(2), DK=dk, DV=dv, GROUP=hv // hk),
        dict(BT=chunk, BKH=cfg["BKH"], NK=cfg["NK"], BV=bv, DOT_PRECISION=dot_precision),
        dict(num_warps=cfg["fwd_warps"], num_stages=cfg["fwd_stages"]),
    )


def chunk_table(cu_seqlens: torch.Tensor, total_tokens: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(chunk_lo, chunk_hi) int32 token ranges of every sequence's chunks, computed on the device without a
    host sync: a fixed number of entries (total_tokens // chunk + B, an upper bound of the chunk count),
    the unused ones empty (lo == hi == 0)."""
    cu = cu_seqlens.to(torch.int64)
    b = cu.shape[0] - 1
    dev = cu.device
    bound = total_tokens // chunk + b
    if b == 0 or bound == 0:
        z = torch.zeros(0, dtype=torch.int32, device=dev)
        return z, z
    lens = cu[1:] - cu[:-1]
    counts = (lens + chunk - 1) // chunk
    ends = torch.cumsum(counts, 0)
    idx = torch.arange(bound, device=dev)
    seq = torch.searchsorted(ends, idx, right=True)
    ok = seq < b
    seq_c = seq.clamp(max=b - 1)
    lo = cu[seq_c] + (idx - (ends - counts)[seq_c]) * chunk
    hi = torch.minimum(lo + chunk, cu[seq_c + 1])
    return torch.where(ok, lo, 0).to(torch.int32), torch.where(ok, hi, 0).to(torch.int32)


def chunk_gated_delta_rule_triton(q, k, v, g, beta, cu_seqlens, state, slots, out, chunk: int, scale: float,
                                  dot_precision: str) -> torch.Tensor:
    t = q.shape[0]
    hv, dk, dv = v.shape[1], k.shape[2], v.shape[2]
    on_cuda = q.is_cuda
    if t == 0 or slots.shape[0] == 0:
        return out
    hk = k.shape[1]
    f32 = dict(dtype=torch.float32, device=q.device)
    qn, kn = torch.empty(t, hk, dk, **f32), torch.empty(t, hk, dk, **f32)
    w, u = torch.empty(t, hv, dk, **f32), torch.empty(t, hv, dv, **f32)
    lo, hi = chunk_table(cu_seqlens, t, chunk)
    plan_chunk_prepare(q, k, v, g, beta, qn, kn, w, u, lo, hi, chunk, scale, dot_precision, on_cuda).launch()
    plan_chunk_fwd(qn, kn, g, w, u, out, state, cu_seqlens, slots, chunk, dot_precision, on_cuda).launch()
    return out
