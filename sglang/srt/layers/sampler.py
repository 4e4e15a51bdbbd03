"""Next-token sampling for the whole batch on the device: greedy, temperature, top-k, top-p, min-p.

Draws use the exponential race (argmax of p / E with E ~ Exp(1) equals a draw from p), with the
uniform noise a counter-based hash of (seed, output position, token id) computed on the device: a
seeded request gets the same tokens whatever else is batched with it and on any device, and no row
ever goes to the host. The only device-to-host copy is the caller's read of the sampled ids."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finalizer (xorshift-multiply) on int64 tensors holding values in [0, 2^32).
    Products may wrap past 2^63; the low 32 bits kept by the mask are exact either way."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def hash_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, vocab) float32 uniforms in (0, 1): a pure function of (seed, step, token id)."""
    row = _mix32((seeds & _M32) ^ _mix32(((seeds >> 32) & _M32) ^ 0x9E3779B9))
    row = _mix32(row ^ _mix32((steps & _M32) ^ 0x85EBCA6B))
    cols = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    h = _mix32((row.unsqueeze(1) + cols.unsqueeze(0) * 0x9E3779B1) & _M32)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # (B, 1) float32; 0 means greedy
    top_ps: torch.Tensor  # (B,)
    top_ks: torch.Tensor  # (B,) int64; vocab size when disabled
    min_ps: torch.Tensor  # (B,)
    seeds: torch.Tensor  # (B,) int64: the request's seed, or a draw from the sampler's host RNG
    steps: torch.Tensor  # (B,) int64: output position of the token being drawn
    all_greedy: bool
    need_filter: bool  # some row uses top-k, top-p or min-p

    @classmethod
    def from_params(cls, params: list, seeds: list[int | None], vocab_size: int, device, steps: list[int],
                    rng: random.Random | None = None) -> "SamplingBatchInfo":
        """Host values packed into one float and one int tensor, each moved with one copy."""
        rng = rng or random.Random(0)
        temps = [0.0 if p.is_greedy else float(p.temperature) for p in params]
        top_ks = [vocab_size if p.top_k < 1 else min(p.top_k, vocab_size) for p in params]
        floats = torch.tensor([temps, [float(p.top_p) for p in params], [float(p.min_p) for p in params]],
                              dtype=torch.float32).to(device, non_blocking=True)
        row_seeds = [s if s is not None else rng.getrandbits(63) for s in seeds]
        ints = torch.tensor([top_ks, row_seeds, list(steps)], dtype=torch.int64).to(device, non_blocking=True)
        return cls(
            temperatures=floats[0].unsqueeze(1), top_ps=floats[1], min_ps=floats[2],
            top_ks=ints[0], seeds=ints[1], steps=ints[2],
            all_greedy=all(t == 0.0 for t in temps),
            need_filter=any(k < vocab_size or p.top_p < 1.0 or p.min_p > 0.0 for k, p in zip(top_ks, params)),
        )


class Sampler:
    def __init__(self, seed: int = 0):
        # draws the seeds of unseeded requests: the server's whole sequence follows --random-seed
        self.rng = random.Random(seed)

    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        if info.all_greedy:
            return greedy
        probs = self._probs(logits.float(), info)
        race = probs / -torch.log(hash_uniform(info.seeds, info.steps, probs.shape[-1]))
        return torch.where(info.temperatures.squeeze(1) == 0.0, greedy, race.argmax(dim=-1))

    @staticmethod
    def _probs(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        temps = torch.where(info.temperatures == 0, torch.ones_like(info.temperatures), info.temperatures)
        probs = torch.softmax(logits / temps, dim=-1)
        if not info.need_filter:
            return probs
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(sorted_p.shape[-1], device=probs.device).unsqueeze(0)
        keep = ranks < info.top_ks.unsqueeze(1)
        keep &= (sorted_p.cumsum(dim=-1) - sorted_p) < info.top_ps.unsqueeze(1)  # always keeps the top token
        keep &= sorted_p >= sorted_p[:, :1] * info.min_ps.unsqueeze(1)
        return torch.zeros_like(probs).scatter_(-1, idx, sorted_p * keep)
