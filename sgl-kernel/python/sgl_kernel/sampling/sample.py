"""Next-token sampling from a batch of logits in one launch: greedy, temperature, top-k, top-p, min-p and a
seeded exponential race.

Arguments (B rows, V tokens):

- logits (B, V) float (any float dtype, any row stride); math in float32.
- temperatures (B,) float: 0 (or less) makes the row greedy: the first argmax of its logits, no filter.
- top_ks (B,) int32/int64: keep the k most likely tokens; k < 1 or k >= V keeps all.
- top_ps (B,) float in (0, 1]: keep the smallest most-likely set whose mass reaches top_p (rank r is kept
  while the mass of ranks < r is below top_p, so the top token always is); >= 1 keeps all.
- min_ps (B,) float in [0, 1]: keep tokens with p >= min_p * p_max; 0 keeps all.
- seeds, steps (B,) int64: the race's noise is a counter-based hash of (seed, step, token id)
  (`hash_uniform_torch`), so a row's draw does not depend on the rest of the batch.

With x = logits * (1 / T) in float32 and m = max x, the filters are thresholds on x: min-p keeps
x >= m + log(min_p); top-k keeps #{x_j > x_i} < k; top-p keeps sum_{x_j > x_i} softmax(x)_j < top_p; a
token must pass all three. The draw is the exponential race in log space: argmax over kept tokens of
x - log(-log u) (equal to argmax of p / E with E = -log u ~ Exp(1)), which needs no normalisation.

`sample_from_logits` runs the Triton kernel (CUDA tensors, or CPU float32 under TRITON_INTERPRET=1) and
reads no tensor value on the host; `sample_from_logits_torch` is the pure-torch reference (sort-based,
float32, runs anywhere) with the same arguments. They keep the same tokens except where two logits tie
exactly, or a cumulative mass equals top_p (or a probability min_p * p_max) to rounding.
"""

from __future__ import annotations

import os

import torch

_NAME = "sample_from_logits"
_M32 = 0xFFFFFFFF
_INT = (torch.int32, torch.int64)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """32-bit xorshift-multiply finalizer on int64 tensors holding values in [0, 2^32), in place."""
    x.bitwise_xor_(x >> 16)
    x.mul_(0x7FEB352D).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x846CA68B).bitwise_and_(_M32)
    return x.bitwise_xor_(x >> 16)


def hash_uniform_torch(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, vocab) float32 uniforms in (0, 1), a pure function of (seed, step, token id):
    u = ((mix32(id * 0x9E3779B1 + row) >> 8) + 0.5) / 2^24 with row a hash of (seed, step), capped at
    1 - 2^-24 (the one value that rounds up to 1). Plain int64 reference of the kernel's uint32 hash."""
    seeds = seeds.long()
    steps = steps.long()
    row = _mix32((seeds & _M32) ^ _mix32(((seeds >> 32) & _M32) ^ 0x9E3779B9))
    row = _mix32(row ^ _mix32((steps & _M32) ^ 0x85EBCA6B))
    h = torch.arange(vocab, device=seeds.device, dtype=torch.int64).mul_(0x9E3779B1)
    h = (h.unsqueeze(0) + row.unsqueeze(1)).bitwise_and_(_M32)
    u = (_mix32(h) >> 8).to(torch.float32).add_(0.5).mul_(1.0 / (1 << 24))
    return u.clamp_max_(1.0 - 2.0**-24)


def _check(logits, temperatures, top_ks, top_ps, min_ps, seeds, steps) -> None:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"{_NAME}: logits must be a (B, V) float tensor, got {tuple(logits.shape)} {logits.dtype}")
    b = logits.shape[0]
    for name, t, kinds in (("temperatures", temperatures, "float"), ("top_ks", top_ks, "int"),
                           ("top_ps", top_ps, "float"), ("min_ps", min_ps, "float"),
                           ("seeds", seeds, "int64"), ("steps", steps, "int64")):
        if t.dim() != 1 or t.shape[0] != b:
            raise ValueError(f"{_NAME}: {name} must have shape ({b},), got {tuple(t.shape)}")
        if t.device != logits.device:
            raise ValueError(f"{_NAME}: {name} is on {t.device}, logits on {logits.device}")
        ok = {"float": t.is_floating_point(), "int": t.dtype in _INT, "int64": t.dtype == torch.int64}[kinds]
        if not ok:
            raise ValueError(f"{_NAME}: {name} must be {kinds.replace('int', 'int32/int64', 1) if kinds == 'int' else kinds}, "
                             f"got {t.dtype}")


def sample_from_logits(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> torch.Tensor:
    """(B,) int64 token ids from the Triton kernel (one program per row, one launch); see the module
    docstring. Runs on CUDA tensors, or CPU tensors under TRITON_INTERPRET=1; raises otherwise."""
    _check(logits, temperatures, top_ks, top_ps, min_ps, seeds, steps)
    if not logits.is_cuda and os.environ.get("TRITON_INTERPRET", "") != "1":
        raise RuntimeError(f"{_NAME} runs the Triton kernel: it needs CUDA tensors, or TRITON_INTERPRET=1 for "
                           "CPU tensors; use sample_from_logits_torch here")
    if logits.shape[1] == 0:
        raise ValueError(f"{_NAME}: empty vocabulary")
    from sgl_kernel.sampling._sample_triton import sample_triton

    if logits.shape[0] and logits.stride(1) != 1:
        logits = logits.contiguous()
    return sample_triton(logits, temperatures.contiguous(), top_ks.contiguous(), top_ps.contiguous(),
                         min_ps.contiguous(), seeds.contiguous(), steps.contiguous())


def sample_from_logits_torch(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> torch.Tensor:
    """Pure-torch reference: sorts every row, applies the three rules on sorted ranks (keep rank r when
    r < k, (cumsum - p)_r < top_p and p_r >= p_max * min_p, in log space x_r >= m + log(min_p)), scatters
    the kept mask back and races x - log(-log u) over it."""
    _check(logits, temperatures, top_ks, top_ps, min_ps, seeds, steps)
    b, v = logits.shape
    if b == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    t = temperatures.float()
    greedy = t <= 0
    inv_t = torch.where(greedy, 1.0, 1.0 / torch.where(greedy, 1.0, t))
    x = logits.float() * inv_t[:, None]
    sorted_x, order = x.sort(dim=-1, descending=True)
    p = torch.softmax(sorted_x, dim=-1)
    k = top_ks.long()
    k = torch.where((k < 1) | (k > v), v, k)
    ranks = torch.arange(v, device=logits.device)
    top_p = top_ps.float()[:, None]
    keep = ranks[None, :] < k[:, None]
    keep &= ((p.cumsum(dim=-1) - p) < top_p) | (top_p >= 1.0)
    min_p = min_ps.float()
    min_x = torch.where(min_p > 0, sorted_x[:, 0] + torch.log(torch.where(min_p > 0, min_p, 1.0)), float("-inf"))
    keep &= sorted_x >= min_x[:, None]
    kept = torch.zeros_like(keep).scatter_(1, order, keep)
    u = hash_uniform_torch(seeds, steps, v)
    race = torch.where(kept, x - u.log().neg().log(), float("-inf"))
    return torch.where(greedy, x.argmax(dim=-1), race.argmax(dim=-1))
