"""Torch reference ops of the Gated DeltaNet, one sequence at a time (heads batched).

The gated delta rule keeps, per value head, a state S (key_dim x value_dim) and for each token t:

    S <- exp(g_t) * S                              decay (g_t <= 0, log space)
    S <- S + k_t (beta_t (v_t - S^T k_t))^T        delta rule: write only what S mispredicts for k_t
    o_t = S^T q_t

with q, k L2-normalized and q scaled by key_dim ** -0.5. `recurrent_gated_delta_rule` runs this loop
(the decode step); `chunk_gated_delta_rule` computes the same in chunks for prefill: inside a chunk
the per-token corrections u solve a unit lower-triangular system, and the state is carried between
chunks. Both take and return the state explicitly, so a caller can carry it across prefill chunks
and decode steps.

Layouts: q, k (T, Hk, Dk); v (T, Hv, Dv); g, beta (T, Hv); state (Hv, Dk, Dv) float32. Hv is a
multiple of Hk and key head i serves value heads [i * Hv/Hk, (i+1) * Hv/Hk). All arithmetic is float32;
outputs are float32 and the caller casts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6  # flash-linear-attention's (and transformers') l2norm epsilon
DEFAULT_CHUNK = 64


def l2_normalize(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                  bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv over time, then SiLU.

    x: (T, C) new inputs; weight: (C, 1, K); conv_state: (C, K-1), the K-1 inputs before x, oldest
    first (zeros for a new sequence, which is the zero padding of a one-shot conv). Returns
    (silu(conv) (T, C) in x's dtype, the new state (C, K-1): the last K-1 inputs, x included)."""
    k = weight.shape[-1]
    window = torch.cat([conv_state.to(x.dtype), x.t()], dim=1)  # (C, K-1+T)
    y = F.conv1d(window.unsqueeze(0).to(weight.dtype), weight, bias, groups=weight.shape[0]).squeeze(0)
    return F.silu(y).t().to(x.dtype), window[:, window.shape[1] - (k - 1):].clone()


def causal_conv1d_update(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                         bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step of `causal_conv1d` (x: (1, C)) as a per-channel dot product."""
    window = torch.cat([conv_state.to(weight.dtype), x.t().to(weight.dtype)], dim=1)  # (C, K)
    y = (window * weight[:, 0, :]).sum(-1)
    if bias is not None:
        y = y + bias
    return F.silu(y).unsqueeze(0).to(x.dtype), window[:, 1:].to(conv_state.dtype)


def _heads_first(q, k, v, g, beta):
    """-> float32 (Hv, T, D) q, k (normalized, key heads repeated over their value heads, q scaled),
    v, and (Hv, T) g, beta."""
    group = v.shape[1] // k.shape[1]
    q = l2_normalize(q.float()) * q.shape[-1] ** -0.5
    k = l2_normalize(k.float())
    q, k = (x.repeat_interleave(group, dim=1).transpose(0, 1) for x in (q, k))
    return q, k, v.float().transpose(0, 1), g.float().t(), beta.float().t()


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token (the decode step; the reference for `chunk_gated_delta_rule`).
    Returns (o (T, Hv, Dv) float32, new state (Hv, Dk, Dv) float32); `state` is not modified."""
    q, k, v, g, beta = _heads_first(q, k, v, g, beta)
    s = state.float().clone()
    out = torch.empty_like(v)
    for t in range(v.shape[1]):
        s = s * g[:, t].exp()[:, None, None]
        predicted = torch.einsum("hkv,hk->hv", s, k[:, t])
        delta = beta[:, t, None] * (v[:, t] - predicted)
        s = s + k[:, t, :, None] * delta[:, None, :]
        out[:, t] = torch.einsum("hkv,hk->hv", s, q[:, t])
    return out.transpose(0, 1), s


def _chunk(q, k, v, g, beta, s):
    """One chunk (n tokens, heads first) from state s: returns (o (H, n, Dv), state after the chunk).

    With G_i the cumulative log decay inside the chunk and D_ij = exp(G_i - G_j) (i >= j), the
    corrections u_j = beta_j (v_j - (decayed state before j)^T k_j) satisfy
        u_j + beta_j sum_{m<j} D_jm (k_j . k_m) u_m = beta_j v_j - beta_j exp(G_j) S0^T k_j,
    a unit lower-triangular system. Then o_i = exp(G_i) S0^T q_i + sum_{j<=i} D_ij (q_i . k_j) u_j and
    S_end = exp(G_n) S0 + sum_j exp(G_n - G_j) k_j u_j^T."""
    n = v.shape[1]
    cum = g.cumsum(dim=-1)  # (H, n)
    lower = torch.ones(n, n, dtype=torch.bool, device=v.device).tril()
    # mask before exp: above the diagonal G_i - G_j > 0 could overflow
    decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(~lower, float("-inf")).exp()  # (H, n, n)
    system = (beta[:, :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    system = system + torch.eye(n, dtype=system.dtype, device=system.device)
    rhs = torch.cat([beta[..., None] * v, (beta * cum.exp())[..., None] * k], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u_free, k_read = solved.split([v.shape[-1], k.shape[-1]], dim=-1)
    u = u_free - k_read @ s  # (H, n, Dv)
    o = (q * cum.exp()[..., None]) @ s + ((q @ k.transpose(-1, -2)) * decay) @ u
    last = cum[:, -1]
    s = last.exp()[:, None, None] * s + (k * (last[:, None] - cum).exp()[..., None]).transpose(-1, -2) @ u
    return o, s


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           state: torch.Tensor, chunk_size: int = DEFAULT_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill form: same result as `recurrent_gated_delta_rule` (up to rounding), chunk by chunk.
    Returns (o (T, Hv, Dv) float32, new state (Hv, Dk, Dv) float32); `state` is not modified."""
    q, k, v, g, beta = _heads_first(q, k, v, g, beta)
    s = state.float()
    out = torch.empty_like(v)
    for lo in range(0, v.shape[1], chunk_size):
        hi = min(lo + chunk_size, v.shape[1])
        out[:, lo:hi], s = _chunk(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi], beta[:, lo:hi], s)
    return out.transpose(0, 1), s
