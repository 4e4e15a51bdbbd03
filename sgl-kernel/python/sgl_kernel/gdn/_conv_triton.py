"""Triton kernels of the causal depthwise conv1d (kernel K) with SiLU fused, over a state pool. Imported lazily
(triton is optional) and after the interpreter choice, see `sgl_kernel.testing`.

    y[t, c] = act(bias[c] + sum_{i<K} w[c, i] * x[t - (K-1) + i, c])

where positions before a sequence's first token read its conv state (the K-1 inputs before it, oldest
first). Prefill (varlen), two launches: `_conv1d_fwd_kernel` computes every output at least K-1 tokens into
its sequence, (token rows x channel columns) tiles in parallel, each row looking its sequence up, from
plain loads of x; `_conv1d_edge_kernel`, one program per (sequence, channel block), computes the sequence's
first K-1 outputs (the ones reading the old state) and then writes the new state (its last K-1 inputs, the
old state's tail for sequences shorter than K-1) back into the pool slot, after every read of the old one.
Decode: `_conv1d_update_kernel`, one token a request, reads the K-1 state inputs and the new one, and writes
the shifted window back in place.

A negative slot means "no state": prefill rows read zeros and no state is written; a decode row (a padded
row of a captured batch) writes zeros and leaves the pool alone.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sgl_kernel.attention._common import LaunchPlan


@triton.jit
def _sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._sum_combine)


@triton.jit
def _tap(wt, col, i: tl.constexpr):
    """Column i of the (BC, KP) weight tile: tap i of every channel."""
    return _sum(tl.where(col[None, :] == i, wt, 0.0), 1)


@triton.jit
def _conv1d_fwd_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, seq_ptr, cu_ptr, T, C, stride_xt, stride_ot,
                       K: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                       BT: tl.constexpr, BC: tl.constexpr):
    """The rows at least K-1 tokens into their sequence (every tap inside it): plain loads of x, no state.
    A sequence's first K-1 rows are `_conv1d_edge_kernel`'s."""
    rows = tl.program_id(0) * BT + tl.arange(0, BT)
    ch = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = ch < C
    seq = tl.load(seq_ptr + rows, mask=rows < T, other=0)
    start = tl.load(cu_ptr + seq, mask=rows < T, other=0).to(tl.int32)
    rmask = (rows < T) & (rows - start >= K - 1)
    mask = rmask[:, None] & cmask[None, :]
    col = tl.arange(0, KP)
    wt = tl.load(w_ptr + ch[:, None] * K + col[None, :], mask=cmask[:, None] & (col < K)[None, :],
                 other=0.0).to(tl.float32)
    acc = tl.full((BT, BC), 0.0, tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ch, mask=cmask, other=0.0).to(tl.float32)[None, :]
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xt + ch[None, :]
    for i in tl.static_range(K):
        xv = tl.load(x_ptrs - (K - 1 - i) * stride_xt, mask=mask, other=0.0)
        acc += _tap(wt, col, i)[None, :] * xv.to(tl.float32)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_ot + ch[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _conv1d_edge_kernel(x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr, cu_ptr, slot_ptr, C, stride_xt, stride_ss,
                        stride_sc, stride_sk, stride_ot,
                        K: tl.constexpr, KP: tl.constexpr, KS: tl.constexpr, HAS_BIAS: tl.constexpr,
                        SILU: tl.constexpr, BC: tl.constexpr):
    """Sequence s: its first min(K-1, n) outputs, whose taps reach into the old conv state, then the new state
    (its last K-1 inputs: position end-(K-1)+m at index m, the old state's entries for positions before the
    sequence). Tiles are (BC channels, KS positions)."""
    s = tl.program_id(0)
    ch = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = ch < C
    start = tl.load(cu_ptr + s).to(tl.int32)
    end = tl.load(cu_ptr + s + 1).to(tl.int32)
    slot = tl.load(slot_ptr + s).to(tl.int64)
    n = end - start
    if n <= 0:
        return
    has_state = slot >= 0
    j = tl.arange(0, KS)  # output row start + j / state index j
    col = tl.arange(0, KP)
    wt = tl.load(w_ptr + ch[:, None] * K + col[None, :], mask=cmask[:, None] & (col < K)[None, :],
                 other=0.0).to(tl.float32)
    base = state_ptr + slot * stride_ss + ch[:, None] * stride_sc
    acc = tl.full((BC, KS), 0.0, tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ch, mask=cmask, other=0.0).to(tl.float32)[:, None]
    for i in tl.static_range(K):
        m = j + i  # position start + j - (K-1) + i: old state index m if m < K-1, else x row start + m - (K-1)
        xv = tl.load(x_ptr + (start + m - (K - 1)).to(tl.int64)[None, :] * stride_xt + ch[:, None],
                     mask=cmask[:, None] & ((m >= K - 1) & (m - (K - 1) < n))[None, :], other=0.0)
        sv = tl.load(base + m[None, :] * stride_sk, mask=cmask[:, None] & ((m < K - 1) & has_state)[None, :],
                     other=0.0)
        acc += _tap(wt, col, i)[:, None] * (xv.to(tl.float32) + sv.to(tl.float32))
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + (start + j).to(tl.int64)[None, :] * stride_ot + ch[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=cmask[:, None] & ((j < K - 1) & (j < n))[None, :])
    if has_state:
        p = end - (K - 1) + j
        in_x = p >= start
        sok = j < K - 1
        new = tl.load(x_ptr + p.to(tl.int64)[None, :] * stride_xt + ch[:, None],
                      mask=cmask[:, None] & (sok & in_x)[None, :], other=0.0).to(tl.float32)
        new += tl.load(base + (j + n)[None, :] * stride_sk, mask=cmask[:, None] & (sok & ~in_x)[None, :],
                       other=0.0).to(tl.float32)
        tl.debug_barrier()  # every old entry read (above and for the outputs) before any thread overwrites one
        tl.store(base + j[None, :] * stride_sk, new.to(state_ptr.dtype.element_ty), mask=cmask[:, None] & sok[None, :])


@triton.jit
def _conv1d_update_kernel(x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr, slot_ptr, C, stride_xb,
                          stride_ss, stride_sc, stride_sk, stride_ob,
                          K: tl.constexpr, KP: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                          BC: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = ch < C
    slot = tl.load(slot_ptr + b).to(tl.int64)
    o_ptrs = out_ptr + b * stride_ob + ch
    if slot < 0:
        tl.store(o_ptrs, tl.full((BC,), 0.0, tl.float32).to(out_ptr.dtype.element_ty), mask=cmask)
        return
    col = tl.arange(0, KP)
    base = state_ptr + slot * stride_ss + ch[:, None] * stride_sc
    win = tl.load(base + col[None, :] * stride_sk, mask=cmask[:, None] & (col < K - 1)[None, :], other=0.0)
    xv = tl.load(x_ptr + b * stride_xb + ch, mask=cmask, other=0.0)
    win = tl.where((col == K - 1)[None, :], xv[:, None], win)  # (BC, KP): the K inputs, oldest first
    wt = tl.load(w_ptr + ch[:, None] * K + col[None, :], mask=cmask[:, None] & (col < K)[None, :],
                 other=0.0).to(tl.float32)
    acc = _sum(win.to(tl.float32) * wt, 1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ch, mask=cmask, other=0.0).to(tl.float32)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=cmask)
    tl.debug_barrier()  # every state entry read before any thread shifts the window over it
    tl.store(base + (col - 1)[None, :] * stride_sk, win.to(state_ptr.dtype.element_ty),
             mask=cmask[:, None] & ((col >= 1) & (col < K))[None, :])


def conv_launch_config(on_cuda: bool = True) -> dict:
    """Tiles: 8 channels a thread along a row (one 128-bit load of bf16 x), 4 warps."""
    return dict(BT=8, BC=512, BC_EDGE=256, BC_UPDATE=1024, num_warps=4) if on_cuda else \
        dict(BT=16, BC=64, BC_EDGE=64, BC_UPDATE=64, num_warps=4)


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))


def plan_conv1d_fwd(x, weight, bias, out, seq_ids, cu_seqlens, silu: bool, on_cuda: bool = True) -> LaunchPlan:
    t, c = x.shape
    kw = weight.shape[1]
    cfg = conv_launch_config(on_cuda)
    return LaunchPlan(
        _conv1d_fwd_kernel, (-(-t // cfg["BT"]), -(-c // cfg["BC"])),
        dict(x_ptr=x, w_ptr=weight, bias_ptr=bias if bias is not None else weight, out_ptr=out, seq_ptr=seq_ids,
             cu_ptr=cu_seqlens, T=t, C=c, stride_xt=x.stride(0), stride_ot=out.stride(0)),
        dict(K=kw, KP=_pow2(kw), HAS_BIAS=bias is not None, SILU=bool(silu), BT=cfg["BT"], BC=cfg["BC"]),
        dict(num_warps=cfg["num_warps"], num_stages=1),
    )


def plan_conv1d_edge(x, weight, bias, state, out, cu_seqlens, slots, silu: bool, on_cuda: bool = True) -> LaunchPlan:
    c = x.shape[1]
    kw = weight.shape[1]
    cfg = conv_launch_config(on_cuda)
    return LaunchPlan(
        _conv1d_edge_kernel, (slots.shape[0], -(-c // cfg["BC_EDGE"])),
        dict(x_ptr=x, w_ptr=weight, bias_ptr=bias if bias is not None else weight, state_ptr=state, out_ptr=out,
             cu_ptr=cu_seqlens, slot_ptr=slots, C=c, stride_xt=x.stride(0), stride_ss=state.stride(0),
             stride_sc=state.stride(1), stride_sk=state.stride(2), stride_ot=out.stride(0)),
        dict(K=kw, KP=_pow2(kw), KS=_pow2(kw - 1), HAS_BIAS=bias is not None, SILU=bool(silu),
             BC=cfg["BC_EDGE"]),
        dict(num_warps=cfg["num_warps"], num_stages=1),
    )


def plan_conv1d_update(x, weight, bias, state, out, slots, silu: bool, on_cuda: bool = True) -> LaunchPlan:
    b, c = x.shape
    kw = weight.shape[1]
    cfg = conv_launch_config(on_cuda)
    return LaunchPlan(
        _conv1d_update_kernel, (b, -(-c // cfg["BC_UPDATE"])),
        dict(x_ptr=x, w_ptr=weight, bias_ptr=bias if bias is not None else weight, state_ptr=state, out_ptr=out,
             slot_ptr=slots, C=c, stride_xb=x.stride(0), stride_ss=state.stride(0),
             stride_sc=state.stride(1), stride_sk=state.stride(2), stride_ob=out.stride(0)),
        dict(K=kw, KP=_pow2(kw), HAS_BIAS=bias is not None, SILU=bool(silu), BC=cfg["BC_UPDATE"]),
        dict(num_warps=cfg["num_warps"], num_stages=1),
    )


def sequence_ids(cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """(T,) int32: the sequence of every token, on the device without a host sync."""
    pos = torch.arange(total_tokens, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return (torch.searchsorted(cu_seqlens[1:].contiguous(), pos, right=True)).to(torch.int32)


def causal_conv1d_fwd_triton(x, weight, bias, state, slots, cu_seqlens, out, silu: bool) -> torch.Tensor:
    t = x.shape[0]
    on_cuda = x.is_cuda
    if t == 0:
        return out
    plan_conv1d_fwd(x, weight, bias, out, sequence_ids(cu_seqlens, t), cu_seqlens, silu, on_cuda).launch()
    if weight.shape[1] > 1:  # K = 1 reads no state and has no edge rows
        plan_conv1d_edge(x, weight, bias, state, out, cu_seqlens, slots, silu, on_cuda).launch()
    return out


def causal_conv1d_update_triton(x, weight, bias, state, slots, out, silu: bool) -> torch.Tensor:
    if x.shape[0]:
        plan_conv1d_update(x, weight, bias, state, out, slots, silu, x.is_cuda).launch()
    return out
