"""Causal depthwise conv1d with SiLU fused, over a conv-state pool: the varlen prefill form and the decode
update, each with a pure-torch reference taking the same arguments (also the CPU path of `backend="auto"`).

    y[t, c] = silu(bias[c] + sum_{i<K} weight[c, i] * x[t - (K-1) + i, c])

where the K-1 positions before a sequence's first token are its conv state (the K-1 inputs before it,
oldest first: zeros for a new sequence, which is a one-shot conv's zero padding). After the call each
sequence's state is its last K-1 inputs (x included), written back in place.

Layouts:
- x (T, C): the new inputs (any row stride, channels contiguous); decode: (B, C), one token a request.
- weight (C, K) or the checkpoint's (C, 1, K); bias (C,) or None.
- conv_state_pool (slots, C, K-1): one layer's view of the pool (e.g. `pool.conv[:, layer]`, any strides),
  in the activations' dtype. state_indices (B,) int32/int64: each sequence's slot (distinct). A negative
  slot: prefill reads a zero state and writes none; decode gives a zero output and touches no state.
- cu_seqlens (B + 1,) int32/int64 (prefill): sequence b is rows [cu_seqlens[b], cu_seqlens[b+1]).
- Output (T, C) in x's dtype unless `out` is given. Arithmetic in float32.
`activation` is "silu" or None (the bare conv).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_kernel import pick_backend
from sgl_kernel.attention._common import require_kernel

_INDEX = (torch.int32, torch.int64)


def _weight2d(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() == 3 and weight.shape[1] == 1:
        weight = weight[:, 0]
    if weight.dim() != 2:
        raise ValueError(f"conv1d: weight must be (C, K) or (C, 1, K), got {tuple(weight.shape)}")
    return weight.contiguous()  # the kernels read row c at c * K (a no-op for the checkpoint's layout)


def _check(name, x, weight, bias, state, state_indices, activation):
    if activation not in ("silu", None):
        raise ValueError(f"{name}: activation must be 'silu' or None, got {activation!r}")
    c, kw = weight.shape
    if x.dim() != 2 or x.shape[1] != c:
        raise ValueError(f"{name}: x must be (T, C) with C = {c} (the weight's channels), got {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (c,):
        raise ValueError(f"{name}: bias must be ({c},), got {tuple(bias.shape)}")
    if state.dim() != 3 or tuple(state.shape[1:]) != (c, kw - 1):
        raise ValueError(f"{name}: conv_state_pool must be (slots, C, K-1) = (*, {c}, {kw - 1}), got "
                         f"{tuple(state.shape)}")
    if state_indices.dim() != 1 or state_indices.dtype not in _INDEX:
        raise ValueError(f"{name}: state_indices must be 1-D int32/int64, got {tuple(state_indices.shape)} "
                         f"{state_indices.dtype}")
    for what, t in (("weight", weight), ("conv_state_pool", state), ("state_indices", state_indices)):
        if t.device != x.device:
            raise ValueError(f"{name}: {what} is on {t.device}, x on {x.device}")


def _out(name, x, out):
    if out is None:
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.shape != x.shape or out.device != x.device or (out.numel() and out.stride(-1) != 1):
        raise ValueError(f"{name}: out must be like x {tuple(x.shape)} with unit channel stride")
    return out


def _unit(x):
    return x if x.numel() == 0 or x.stride(-1) == 1 else x.contiguous()


def _act(y, activation):
    return F.silu(y) if activation == "silu" else y


# ----------------------------------------------------------------------------- prefill
def causal_conv1d_fwd_torch(x, weight, bias, conv_state_pool, state_indices, cu_seqlens, *, activation="silu",
                            out=None) -> torch.Tensor:
    """Reference of `causal_conv1d_fwd`: one sequence at a time (reads cu_seqlens and the slots on the host)."""
    name = "causal_conv1d_fwd_torch"
    weight = _weight2d(weight)
    _check(name, x, weight, bias, conv_state_pool, state_indices, activation)
    out = _out(name, x, out)
    c, kw = weight.shape
    cu = cu_seqlens.tolist()
    for b, slot in enumerate(state_indices.tolist()):
        lo, hi = cu[b], cu[b + 1]
        if hi == lo:
            continue
        old = conv_state_pool[slot].float() if slot >= 0 else x.new_zeros(c, kw - 1, dtype=torch.float32)
        window = torch.cat([old, x[lo:hi].float().t()], dim=1)  # (C, K-1+n)
        y = F.conv1d(window[None], weight.float()[:, None], None if bias is None else bias.float(), groups=c)[0]
        out[lo:hi] = _act(y, activation).t().to(out.dtype)
        if slot >= 0 and kw > 1:
            conv_state_pool[slot] = window[:, window.shape[1] - (kw - 1):].to(conv_state_pool.dtype)
    return out


def causal_conv1d_fwd(x, weight, bias, conv_state_pool, state_indices, cu_seqlens, *, activation="silu", out=None,
                      backend: str = "auto") -> torch.Tensor:
    """Varlen prefill conv (see the module docstring). The Triton path: one launch over (token, channel) tiles,
    each token looking its sequence up (a device-side table, no host sync), then one launch writing every
    sequence's new state into its slot."""
    name = "causal_conv1d_fwd"
    weight = _weight2d(weight)
    _check(name, x, weight, bias, conv_state_pool, state_indices, activation)
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in _INDEX or cu_seqlens.shape[0] != state_indices.shape[0] + 1:
        raise ValueError(f"{name}: cu_seqlens must be 1-D int32/int64 of B + 1 = {state_indices.shape[0] + 1} entries")
    if pick_backend(backend, x) == "torch":
        return causal_conv1d_fwd_torch(x, weight, bias, conv_state_pool, state_indices, cu_seqlens,
                                       activation=activation, out=out)
    out = _out(name, x, out)
    require_kernel(name, x)
    from sgl_kernel.gdn._conv_triton import causal_conv1d_fwd_triton

    return causal_conv1d_fwd_triton(_unit(x), weight, bias, conv_state_pool, state_indices, cu_seqlens, out,
                                    activation == "silu")


# ----------------------------------------------------------------------------- decode
def causal_conv1d_update_torch(x, weight, bias, conv_state_pool, state_indices, *, activation="silu",
                               out=None) -> torch.Tensor:
    """Reference of `causal_conv1d_update`."""
    name = "causal_conv1d_update_torch"
    weight = _weight2d(weight)
    _check(name, x, weight, bias, conv_state_pool, state_indices, activation)
    if state_indices.shape[0] != x.shape[0]:
        raise ValueError(f"{name}: {state_indices.shape[0]} state indices for {x.shape[0]} requests")
    out = _out(name, x, out)
    for b, slot in enumerate(state_indices.tolist()):
        if slot < 0:
            out[b] = 0
            continue
        window = torch.cat([conv_state_pool[slot].float(), x[b].float()[:, None]], dim=1)  # (C, K)
        y = (window * weight.float()).sum(-1)
        if bias is not None:
            y = y + bias.float()
        out[b] = _act(y, activation).to(out.dtype)
        conv_state_pool[slot] = window[:, 1:].to(conv_state_pool.dtype)
    return out


def causal_conv1d_update(x, weight, bias, conv_state_pool, state_indices, *, activation="silu", out=None,
                         backend: str = "auto") -> torch.Tensor:
    """The decode step: x (B, C), one token per request; each request's state shifted in place. The Triton
    path is one launch of grid (B, C / 256) reading nothing on the host: CUDA-graph capturable."""
    name = "causal_conv1d_update"
    weight = _weight2d(weight)
    _check(name, x, weight, bias, conv_state_pool, state_indices, activation)
    if state_indices.shape[0] != x.shape[0]:
        raise ValueError(f"{name}: {state_indices.shape[0]} state indices for {x.shape[0]} requests")
    if pick_backend(backend, x) == "torch":
        return causal_conv1d_update_torch(x, weight, bias, conv_state_pool, state_indices, activation=activation,
                                          out=out)
    out = _out(name, x, out)
    require_kernel(name, x)
    from sgl_kernel.gdn._conv_triton import causal_conv1d_update_triton

    return causal_conv1d_update_triton(_unit(x), weight, bias, conv_state_pool, state_indices, out,
                                       activation == "silu")
