"""The gated delta rule over a state pool: chunked prefill (varlen) and the fused decode step, each with a
pure-torch reference taking the same arguments (also the CPU path of `backend="auto"`).

Per value head the state S (Dk x Dv, float32) follows, for each token t,

    S <- exp(g_t) S                               decay (g_t <= 0: log space)
    S <- S + k_t (beta_t (v_t - S^T k_t))^T       delta rule
    o_t = S^T q_t

with q, k L2-normalised over the head dim (x / sqrt(sum x^2 + 1e-6)) and q scaled by `scale` (default
Dk ** -0.5). These are the semantics of the engine's torch ops (recurrent and chunked forms agree).

Layouts (any token and head strides; the head dim contiguous):
- q, k (T, Hk, Dk); v (T, Hv, Dv); g, beta (T, Hv) (decode: T = B, one token a request). Hv is a multiple
  of Hk; value head h reads key head h // (Hv / Hk).
- state_pool (slots, Hv, Dk, Dv) float32: one layer's view of the state pool (e.g. `pool.recurrent[:, layer]`,
  any slot / head / Dk strides). state_indices (B,) int32/int64: the pool slot of each sequence. Sequence b's
  initial state is read from its slot and its final state written back there, in place. The slots of one
  call must be distinct.
- cu_seqlens (B + 1,) int32/int64 (prefill): sequence b is tokens [cu_seqlens[b], cu_seqlens[b+1]);
  empty sequences are allowed (their state is unchanged).
- Output o (T, Hv, Dv), float32 unless `out` (any float dtype, unit stride along Dv) is given.

The Triton paths read no tensor value on the host (the chunk table is built on the device), so the decode
step can be captured in a CUDA graph with `state_indices` as a graph input; a negative slot there (a padded
row) gives a zero output and touches no state.
"""

from __future__ import annotations

import torch

from sgl_kernel import pick_backend
from sgl_kernel.attention._common import check_fp32_precision, dot_precision, require_kernel

L2_EPS = 1e-6
CHUNK_SIZES = (16, 32, 64)
_INDEX = (torch.int32, torch.int64)


def _check(name, q, k, v, g, beta, state_pool, state_indices, tokens_are_requests: bool):
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[0] != q.shape[0]:
        raise ValueError(f"{name}: q, k (T, Hk, Dk) and v (T, Hv, Dv) expected, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    t, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    if hk == 0 or hv % hk:
        raise ValueError(f"{name}: value heads ({hv}) must be a multiple of key heads ({hk})")
    for what, x in (("g", g), ("beta", beta)):
        if tuple(x.shape) != (t, hv):
            raise ValueError(f"{name}: {what} must be (T, Hv) = {(t, hv)}, got {tuple(x.shape)}")
    if state_pool.dim() != 4 or tuple(state_pool.shape[1:]) != (hv, dk, dv) or state_pool.dtype != torch.float32:
        raise ValueError(f"{name}: state_pool must be float32 (slots, Hv, Dk, Dv) = (*, {hv}, {dk}, {dv}), got "
                         f"{tuple(state_pool.shape)} {state_pool.dtype}")
    if state_indices.dim() != 1 or state_indices.dtype not in _INDEX:
        raise ValueError(f"{name}: state_indices must be 1-D int32/int64, got {tuple(state_indices.shape)} "
                         f"{state_indices.dtype}")
    if tokens_are_requests and state_indices.shape[0] != t:
        raise ValueError(f"{name}: {state_indices.shape[0]} state indices for {t} requests")
    for what, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("state_pool", state_pool),
                    ("state_indices", state_indices)):
        if x.device != q.device:
            raise ValueError(f"{name}: {what} is on {x.device}, q on {q.device}")
    if state_pool.stride(-1) != 1:
        raise ValueError(f"{name}: state_pool needs unit stride along Dv (it is updated in place)")


def _out(name, v, out):
    if out is None:
        return torch.empty(v.shape, dtype=torch.float32, device=v.device)
    if out.shape != v.shape or out.device != v.device or not out.is_floating_point() or \
            (out.numel() and out.stride(-1) != 1):
        raise ValueError(f"{name}: out must be a float tensor of v's shape {tuple(v.shape)} on {v.device} with unit "
                         f"stride along Dv; got {tuple(out.shape)} {out.dtype}")
    return out


def _unit(x):
    return x if x.numel() == 0 or x.stride(-1) == 1 else x.contiguous()


def _scale(scale, dk):
    return float(dk ** -0.5 if scale is None else scale)


# ----------------------------------------------------------------------------- the math, heads first
def _normalize(q, k, group, scale):
    """(T, Hk, Dk) q, k -> float32 (Hv, T, Dk), L2-normalised, q scaled, key heads repeated over their
    value heads."""
    def norm(x):
        x = x.float()
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)

    q, k = norm(q) * scale, norm(k)
    return (x.repeat_interleave(group, dim=1).transpose(0, 1) for x in (q, k))


def _chunk_math(q, k, v, g, beta, s):
    """One chunk, heads first (H, n, D), from state s (H, Dk, Dv): (o (H, n, Dv), new state). The UT form:
    u = (I + A)^-1 (beta v - beta e^G K s), A_ij = beta_i e^{G_i - G_j} k_i.k_j below the diagonal."""
    n = v.shape[1]
    cum = g.cumsum(-1)
    tril = torch.ones(n, n, dtype=torch.bool, device=v.device).tril()
    decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(~tril, float("-inf")).exp()
    a = (beta[:, :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    system = a + torch.eye(n, dtype=a.dtype, device=a.device)
    rhs = beta[..., None] * v - (beta * cum.exp())[..., None] * (k @ s)
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    o = (q * cum.exp()[..., None]) @ s + ((q @ k.transpose(-1, -2)) * decay) @ u
    last = cum[:, -1]
    s = last.exp()[:, None, None] * s + (k * (last[:, None] - cum).exp()[..., None]).transpose(-1, -2) @ u
    return o, s


# ----------------------------------------------------------------------------- prefill
def chunk_gated_delta_rule_torch(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, *, out=None, scale=None,
                                 chunk_size: int = 64) -> torch.Tensor:
    """Reference of `chunk_gated_delta_rule_fwd`: one sequence at a time (reads cu_seqlens and the slots on the
    host), float32 math in chunks of `chunk_size`, the state pool updated in place."""
    name = "chunk_gated_delta_rule_torch"
    _check(name, q, k, v, g, beta, state_pool, state_indices, False)
    out = _out(name, v, out)
    group = v.shape[1] // q.shape[1]
    sc = _scale(scale, q.shape[2])
    cu = cu_seqlens.tolist()
    for b, slot in enumerate(state_indices.tolist()):
        lo, hi = cu[b], cu[b + 1]
        if hi == lo:
            continue
        qh, kh = _normalize(q[lo:hi], k[lo:hi], group, sc)
        vh, gh, bh = v[lo:hi].float().transpose(0, 1), g[lo:hi].float().t(), beta[lo:hi].float().t()
        s = state_pool[slot].float()
        o = torch.empty_like(vh)
        for c in range(0, hi - lo, chunk_size):
            e = min(c + chunk_size, hi - lo)
            o[:, c:e], s = _chunk_math(qh[:, c:e], kh[:, c:e], vh[:, c:e], gh[:, c:e], bh[:, c:e], s)
        out[lo:hi] = o.transpose(0, 1).to(out.dtype)
        state_pool[slot] = s
    return out


def chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, *, out=None, scale=None,
                               chunk_size: int = 64, backend: str = "auto",
                               fp32_precision: str = "tf32") -> torch.Tensor:
    """Chunked gated delta rule over a varlen batch (see the module docstring for layouts); returns o
    (T, Hv, Dv). The Triton path: two launches (the UT transform of every chunk in parallel, then each
    sequence's chunks in order with the state carried), tensor-core dots (tf32 for float32 operands on CUDA
    unless `fp32_precision="ieee"`; the triangular inverse's merges in 3xTF32), no host sync."""
    name = "chunk_gated_delta_rule_fwd"
    check_fp32_precision(name, fp32_precision)
    _check(name, q, k, v, g, beta, state_pool, state_indices, False)
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in _INDEX or cu_seqlens.shape[0] != state_indices.shape[0] + 1:
        raise ValueError(f"{name}: cu_seqlens must be 1-D int32/int64 of B + 1 = {state_indices.shape[0] + 1} entries, "
                         f"got {tuple(cu_seqlens.shape)} {cu_seqlens.dtype}")
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"{name}: chunk_size must be one of {CHUNK_SIZES}, got {chunk_size}")
    if pick_backend(backend, q) == "torch":
        return chunk_gated_delta_rule_torch(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, out=out,
                                            scale=scale, chunk_size=chunk_size)
    out = _out(name, v, out)
    require_kernel(name, q)
    from sgl_kernel.gdn._chunk_triton import chunk_gated_delta_rule_triton

    prec = dot_precision(torch.float32, q.is_cuda, fp32_precision)
    return chunk_gated_delta_rule_triton(_unit(q), _unit(k), _unit(v), g, beta, cu_seqlens, state_pool,
                                         state_indices, out, chunk_size, _scale(scale, q.shape[2]), prec)


# ----------------------------------------------------------------------------- decode
def recurrent_gated_delta_rule_update_torch(q, k, v, g, beta, state_pool, state_indices, *, out=None,
                                            scale=None) -> torch.Tensor:
    """Reference of `recurrent_gated_delta_rule_update`: one token per request, the pool updated in place;
    negative slots give zeros."""
    name = "recurrent_gated_delta_rule_update_torch"
    _check(name, q, k, v, g, beta, state_pool, state_indices, True)
    out = _out(name, v, out)
    group = v.shape[1] // q.shape[1]
    qh, kh = _normalize(q, k, group, _scale(scale, q.shape[2]))  # (Hv, B, Dk)
    for b, slot in enumerate(state_indices.tolist()):
        if slot < 0:
            out[b] = 0
            continue
        s = state_pool[slot].float() * g[b].float().exp()[:, None, None]
        kb, qb = kh[:, b], qh[:, b]
        delta = beta[b].float()[:, None] * (v[b].float() - torch.einsum("hkv,hk->hv", s, kb))
        s = s + kb[:, :, None] * delta[:, None, :]
        out[b] = torch.einsum("hkv,hk->hv", s, qb).to(out.dtype)
        state_pool[slot] = s
    return out


def recurrent_gated_delta_rule_update(q, k, v, g, beta, state_pool, state_indices, *, out=None, scale=None,
                                      backend: str = "auto") -> torch.Tensor:
    """The decode step: q, k (B, Hk, Dk), v (B, Hv, Dv), g, beta (B, Hv), one token per request; the state of
    request b (pool slot state_indices[b]) updated in place; returns o (B, Hv, Dv). The Triton path is one
    launch of fixed grid (B, Hv, Dv / BV) and reads nothing on the host: CUDA-graph capturable."""
    name = "recurrent_gated_delta_rule_update"
    _check(name, q, k, v, g, beta, state_pool, state_indices, True)
    if pick_backend(backend, q) == "torch":
        return recurrent_gated_delta_rule_update_torch(q, k, v, g, beta, state_pool, state_indices, out=out,
                                                       scale=scale)
    out = _out(name, v, out)
    require_kernel(name, q)
    from sgl_kernel.gdn._recurrent_triton import recurrent_gated_delta_rule_triton

    return recurrent_gated_delta_rule_triton(_unit(q), _unit(k), _unit(v), g, beta, state_pool, state_indices, out,
                                             _scale(scale, q.shape[2]))
