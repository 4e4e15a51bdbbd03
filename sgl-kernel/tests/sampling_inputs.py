"""Inputs for the sampling tests: logits without near-ties, and filter parameters nudged away from the
rounding boundaries of their rules, so the kernel and the references must pick the same ids."""

from __future__ import annotations

import math

import torch


def distinct_logits(b: int, v: int, seed: int, spread: float = 8.0) -> torch.Tensor:
    """(b, v) float32 logits: each row a random permutation of v evenly spaced values over [-spread/2,
    spread/2] plus a row offset: no two logits of a row are closer than spread / v."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.linspace(-spread / 2, spread / 2, max(v, 1))[:v]
    rows = [grid[torch.randperm(v, generator=g)] + float(torch.randn(1, generator=g)) * 3 for _ in range(b)]
    return torch.stack(rows) if rows else torch.empty(0, v)


def safe_top_p(x: torch.Tensor, top_p: float, margin: float = 1e-4) -> float:
    """`top_p`, or a value near it whose distance to every exclusive cumulative mass of the sorted
    softmax(x) (float64) exceeds `margin`; 1.0 when no such value is near."""
    if top_p >= 1.0:
        return 1.0
    p = torch.softmax(x.double(), -1).sort(descending=True).values
    excl = torch.cat([torch.zeros(1, dtype=torch.float64), p.cumsum(0)[:-1]]).tolist() + [1.0]
    for r in range(len(excl) - 1):
        lo, hi = excl[r], excl[r + 1]
        if lo <= top_p < hi:
            if top_p - lo > margin and hi - top_p > margin:
                return top_p
            if hi - lo > 4 * margin:
                return (lo + hi) / 2
            return 1.0
    return 1.0


def safe_min_p(x: torch.Tensor, min_p: float, margin: float = 1e-4) -> float:
    """`min_p`, or a value whose log threshold lies midway between two values of x - max(x) when it
    falls within `margin` of one."""
    if min_p <= 0.0:
        return 0.0
    rel = sorted((x.double() - x.double().max()).tolist(), reverse=True)
    t = math.log(min_p)
    for a, b in zip(rel, rel[1:] + [-math.inf]):
        if b <= t <= a:
            if a - t > margin and t - b > margin or t == a == 0.0:
                return min_p
            return math.exp((a + b) / 2) if b > -math.inf else math.exp(a - 1.0)
    return min_p
