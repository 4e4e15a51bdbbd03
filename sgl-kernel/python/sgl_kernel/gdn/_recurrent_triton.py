"""Triton kernel of the gated delta rule's decode step: one token per request, the state updated in place in
the state pool through the request's slot. Imported lazily (triton is optional) and after the interpreter
choice, see `sgl_kernel.testing`.

One program per (request, value head, Dv block of BV columns): it loads the Dk x BV float32 state tile,
    S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
(q, k L2-normalised in the kernel, q scaled), stores o and the tile back. No host value is read and the
grid depends on shapes only, so the launch can be captured in a CUDA graph with the slot table as a graph
input. A negative slot (a padded row of a captured batch) writes a zero output and leaves the pool alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan

L2_EPS = 1e-6


@triton.jit
def _sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._sum_combine)


@triton.jit
def _gdn_recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, state_ptr, slot_ptr,
                          stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_gb, stride_gh,
                          stride_bb, stride_bh, stride_ob, stride_oh, stride_ss, stride_sh, stride_sk,
                          DK, DV, GROUP, scale, eps, BK: tl.constexpr, BV: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    b64 = b.to(tl.int64)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    offs_k = tl.arange(0, BK)
    offs_v = vb * BV + tl.arange(0, BV)
    kok = offs_k < DK
    vok = offs_v < DV
    o_ptrs = o_ptr + b64 * stride_ob + h * stride_oh + offs_v
    if slot < 0:
        tl.store(o_ptrs, tl.full((BV,), 0.0, tl.float32).to(o_ptr.dtype.element_ty), mask=vok)
        return
    hk = h // GROUP
    q = tl.load(q_ptr + b64 * stride_qb + hk * stride_qh + offs_k, mask=kok, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b64 * stride_kb + hk * stride_kh + offs_k, mask=kok, other=0.0).to(tl.float32)
    q = q * (scale / tl.sqrt(_sum(q * q, 0) + eps))
    k = k * (1.0 / tl.sqrt(_sum(k * k, 0) + eps))
    v = tl.load(v_ptr + b64 * stride_vb + h * stride_vh + offs_v, mask=vok, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + b64 * stride_gb + h * stride_gh).to(tl.float32)
    beta = tl.load(beta_ptr + b64 * stride_bb + h * stride_bh).to(tl.float32)
    s_ptrs = state_ptr + slot * stride_ss + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    smask = kok[:, None] & vok[None, :]
    st = tl.load(s_ptrs, mask=smask, other=0.0).to(tl.float32) * tl.exp(g)
    delta = beta * (v - _sum(st * k[:, None], 0))
    st = st + k[:, None] * delta[None, :]
    o = _sum(st * q[:, None], 0)
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=vok)
    tl.store(s_ptrs, st.to(state_ptr.dtype.element_ty), mask=smask)


def recurrent_launch_config(dk: int, dv: int, on_cuda: bool = True) -> dict:
    """BV columns of the state a program (Dk x BV float32 in registers: 32 a thread at Dk 128, BV 32, 4
    warps) and the warps."""
    bk = max(16, triton.next_power_of_2(int(dk)))
    bdv = max(16, triton.next_power_of_2(int(dv)))
    if not on_cuda:
        return dict(BK=bk, BV=bdv, num_warps=4)
    bv = min(bdv, max(16, 4096 // bk))
    return dict(BK=bk, BV=bv, num_warps=4)


def plan_recurrent(q, k, v, g, beta, out, state, slots, scale: float, on_cuda: bool = True) -> LaunchPlan:
    hk, dk = k.shape[1], k.shape[2]
    hv, dv = v.shape[1], v.shape[2]
    cfg = recurrent_launch_config(dk, dv, on_cuda)
    return LaunchPlan(
        _gdn_recurrent_kernel, (slots.shape[0], hv, -(-dv // cfg["BV"])),
        dict(q_ptr=q, k_ptr=k, v_ptr=v, g_ptr=g, beta_ptr=beta, o_ptr=out, state_ptr=state, slot_ptr=slots,
             stride_qb=q.stride(0), stride_qh=q.stride(1), stride_kb=k.stride(0), stride_kh=k.stride(1),
             stride_vb=v.stride(0), stride_vh=v.stride(1), stride_gb=g.stride(0), stride_gh=g.stride(1),
             stride_bb=beta.stride(0), stride_bh=beta.stride(1), stride_ob=out.stride(0), stride_oh=out.stride(1),
             stride_ss=state.stride(0), stride_sh=state.stride(1), stride_sk=state.stride(2),
             DK=dk, DV=dv, GROUP=hv // hk, scale=float(scale), eps=L2_EPS),
        dict(BK=cfg["BK"], BV=cfg["BV"]),
        dict(num_warps=cfg["num_warps"], num_stages=1),
    )


def recurrent_gated_delta_rule_triton(q, k, v, g, beta, state, slots, out, scale: float) -> torch.Tensor:
    if slots.shape[0]:
        plan_recurrent(q, k, v, g, beta, out, state, slots, scale, q.is_cuda).launch()
    return out
