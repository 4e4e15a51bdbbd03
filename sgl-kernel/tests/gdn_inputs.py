"""Inputs and independent oracles of the Gated DeltaNet kernel tests: the gated delta rule and the causal conv
written as plain per-token loops from their definitions (nothing shared with sgl_kernel.gdn's references),
and generators of varlen batches over a state pool."""

from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-6


def cu_of(lens, dtype=torch.int32) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=dtype)


def delta_rule_oracle(q, k, v, g, beta, cu, pool, slots, scale=None):
    """Token by token, head by head, float64: S <- e^g S; S <- S + k (beta (v - S^T k))^T; o = S^T q with q, k
    L2-normalised (eps 1e-6 inside the root) and q scaled. Updates `pool` in place, returns o (T, Hv, Dv)."""
    t, hk, dk = q.shape
    hv = v.shape[1]
    group = hv // hk
    scale = dk ** -0.5 if scale is None else scale
    out = torch.zeros(t, hv, v.shape[2], dtype=torch.float64)
    cu = [int(x) for x in cu]
    for b, slot in enumerate(int(s) for s in slots):
        if slot < 0:
            continue
        s = pool[slot].double().clone()
        for i in range(cu[b], cu[b + 1]):
            for h in range(hv):
                qi, ki = q[i, h // group].double(), k[i, h // group].double()
                qi = qi / torch.sqrt((qi * qi).sum() + EPS) * scale
                ki = ki / torch.sqrt((ki * ki).sum() + EPS)
                s[h] = s[h] * torch.exp(g[i, h].double())
                s[h] = s[h] + torch.outer(ki, beta[i, h].double() * (v[i, h].double() - s[h].t() @ ki))
                out[i, h] = s[h].t() @ qi
        pool[slot] = s.to(pool.dtype)
    return out


def conv_oracle(x, weight, bias, cu, pool, slots, activation="silu"):
    """Per sequence and channel: y[t] = act(bias + sum_i w[i] x[t-(K-1)+i]) with positions before the sequence
    taken from its state (zeros for slot < 0), float64; the state becomes the last K-1 inputs. In place."""
    w = weight.reshape(weight.shape[0], -1).double()
    c, kw = w.shape
    out = torch.zeros(x.shape, dtype=torch.float64)
    cu = [int(v) for v in cu]
    for b, slot in enumerate(int(s) for s in slots):
        lo, hi = cu[b], cu[b + 1]
        hist = pool[slot].double() if slot >= 0 else torch.zeros(c, kw - 1, dtype=torch.float64)
        seq = torch.cat([hist, x[lo:hi].double().t()], dim=1)  # (C, K-1+n)
        for t in range(hi - lo):
            y = (seq[:, t:t + kw] * w).sum(-1)
            if bias is not None:
                y = y + bias.double()
            out[lo + t] = F.silu(y) if activation == "silu" else y
        if slot >= 0 and hi > lo and kw > 1:
            pool[slot] = seq[:, seq.shape[1] - (kw - 1):].to(pool.dtype)
    return out


def delta_rule_case(lens, hk, group, dk, dv, seed, slots=None, num_slots=None, decay=1.0, strided=False):
    """q, k, v, g, beta for a varlen batch, a state pool and distinct slots. `strided`: q, k, v are head views of
    one (T, 2 Hk Dk + Hv Dv) tensor (the conv output's layout) and the pool a layer view of (slots, 2, ...)."""
    gen = torch.Generator().manual_seed(seed)
    t, hv = sum(lens), hk * group
    if strided:
        mixed = torch.randn(t, 2 * hk * dk + hv * dv, generator=gen)
        q = mixed[:, :hk * dk].view(t, hk, dk)
        k = mixed[:, hk * dk:2 * hk * dk].view(t, hk, dk)
        v = mixed[:, 2 * hk * dk:].view(t, hv, dv)
    else:
        q, k, v = torch.randn(t, hk, dk, generator=gen), torch.randn(t, hk, dk, generator=gen), \
            torch.randn(t, hv, dv, generator=gen)
    g = -torch.rand(t, hv, generator=gen) * decay  # log decays in (-decay, 0]
    beta = torch.rand(t, hv, generator=gen)
    n_slots = num_slots or len(lens) + 2
    if strided:
        pool = (torch.randn(n_slots, 2, hv, dk, dv, generator=gen) * 0.5)[:, 1]
    else:
        pool = torch.randn(n_slots, hv, dk, dv, generator=gen) * 0.5
    if slots is None:
        slots = torch.randperm(n_slots, generator=gen)[:len(lens)]
    return q, k, v, g, beta, cu_of(lens), pool, torch.as_tensor(slots, dtype=torch.int32)


def conv_case(lens, c, kw, seed, bias=True, num_slots=None, slots=None, strided=False):
    gen = torch.Generator().manual_seed(seed)
    t = sum(lens)
    x = torch.randn(t, c + (5 if strided else 0), generator=gen)[:, :c] if strided else torch.randn(t, c, generator=gen)
    weight = torch.randn(c, 1, kw, generator=gen) * 0.5
    b = torch.randn(c, generator=gen) if bias else None
    n_slots = num_slots or len(lens) + 2
    pool = torch.randn(n_slots, 3, c, kw - 1, generator=gen)[:, 2] if strided else \
        torch.randn(n_slots, c, kw - 1, generator=gen)
    if slots is None:
        slots = torch.randperm(n_slots, generator=gen)[:len(lens)]
    return x, weight, b, cu_of(lens), pool, torch.as_tensor(slots, dtype=torch.int32)


def close(got, want, rel=1e-5):
    """Equal up to `rel` of the largest magnitude (outputs of the delta rule are O(Dk^-1/2))."""
    want = want.to(torch.float64)
    tol = rel * max(1.0, float(want.abs().max())) if want.numel() else rel
    torch.testing.assert_close(got.to(torch.float64), want, rtol=0, atol=tol)
