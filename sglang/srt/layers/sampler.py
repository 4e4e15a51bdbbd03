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
    """A 32-bit integer finalizer (xorshift-multiply) on int64 tensors holding values in [0, 2^32),
    in place. Products may wrap past 2^63; the low 32 bits kept by the mask are exact either way."""
    x.bitwise_xor_(x >> 16)
    x.mul_(0x7FEB352D).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x846CA68B).bitwise_and_(_M32)
    return x.bitwise_xor_(x >> 16)


def hash_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, vocab) float32 uniforms in (0, 1): a pure function of (seed, step, token id). Built in place:
    the (B, vocab) work costs one int64 buffer and one temporary, whatever the batch."""
    row = _mix32((seeds & _M32) ^ _mix32(((seeds >> 32) & _M32) ^ 0x9E3779B9))
    row = _mix32(row ^ _mix32((steps & _M32) ^ 0x85EBCA6B))
    h = torch.arange(vocab, device=seeds.device, dtype=torch.int64).mul_(0x9E3779B1)
    h = (h.unsqueeze(0) + row.unsqueeze(1)).bitwise_and_(_M32)
    u = _mix32(h).bitwise_right_shift_(8).to(torch.float32)
    del h
    return u.add_(0.5).mul_(1.0 / (1 << 24))


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
    penalties: "Penalties | None" = None
    # (rows, token ids) whose logits are -inf this step: stop tokens of rows below min_new_tokens
    banned: tuple[torch.Tensor, torch.Tensor] | None = None
    # (rows, token ids, biases) added to the logits: the requests' logit_bias
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

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


@dataclass
class Penalties:
    """Repetition (HF: divide positive logits, multiply negative ones, for every token seen in the
    prompt or output), frequency and presence (OpenAI: subtract per output occurrence / once)."""

    repetition: torch.Tensor  # (B, 1)
    frequency: torch.Tensor  # (B, 1)
    presence: torch.Tensor  # (B, 1)
    output_counts: torch.Tensor  # (B, V) float32 occurrences in the output so far
    seen: torch.Tensor  # (B, V) bool: in the prompt or the output

    @classmethod
    def build(cls, params: list, prompts: list[list[int]], outputs: list[list[int]], vocab: int, device) -> "Penalties":
        """Counts built from flat (row, id) lists: one copy of the ids, then scatters on the device."""
        def flat(seqs):
            rows = [i for i, seq in enumerate(seqs) for t in seq if 0 <= t < vocab]
            ids = [t for seq in seqs for t in seq if 0 <= t < vocab]
            return torch.tensor([rows, ids], dtype=torch.int64).to(device, non_blocking=True)

        b = len(params)
        out_idx = flat(outputs)
        counts = torch.zeros(b, vocab, dtype=torch.float32, device=device)
        counts.index_put_((out_idx[0], out_idx[1]), torch.ones(out_idx.shape[1], device=device), accumulate=True)
        seen = counts > 0
        rep_rows = [p.repetition_penalty != 1.0 for p in params]
        prompt_idx = flat([seq if want else [] for seq, want in zip(prompts, rep_rows)])
        seen[prompt_idx[0], prompt_idx[1]] = True
        vals = torch.tensor([[p.repetition_penalty, p.frequency_penalty, p.presence_penalty] for p in params],
                            dtype=torch.float32).to(device, non_blocking=True)
        return cls(vals[:, 0:1], vals[:, 1:2], vals[:, 2:3], counts, seen)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        rep = torch.where(self.seen, self.repetition, torch.ones_like(self.repetition))
        logits = torch.where(logits > 0, logits / rep, logits * rep)
        return logits - self.frequency * self.output_counts - self.presence * (self.output_counts > 0).float()


def banned_tokens(params: list, outputs: list[list[int]], eos_ids: list[int], device):
    """(rows, ids) of stop tokens to mask for rows still below min_new_tokens; None when none are."""
    rows, ids = [], []
    for i, (p, out) in enumerate(zip(params, outputs)):
        if len(out) < p.min_new_tokens:
            stops = ([] if p.ignore_eos else list(eos_ids)) + list(p.stop_token_ids)
            rows += [i] * len(stops)
            ids += stops
    if not rows:
        return None
    t = torch.tensor([rows, ids], dtype=torch.int64).to(device, non_blocking=True)
    return t[0], t[1]


def logit_bias_entries(params: list, device):
    """(rows, ids, biases) of every request's logit_bias, moved with one copy; None when none has one."""
    rows, ids, vals = [], [], []
    for i, p in enumerate(params):
        for tok, bias in (p.logit_bias or {}).items():
            rows.append(i)
            ids.append(tok)
            vals.append(bias)
    if not rows:
        return None
    t = torch.tensor([rows, ids], dtype=torch.int64).to(device, non_blocking=True)
    return t[0], t[1], torch.tensor(vals, dtype=torch.float32).to(device, non_blocking=True)


def adjust_logits(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Penalties, logit biases and min-token masks: what the distribution is sampled (and logprobs
    taken) from."""
    if info.penalties is not None:
        logits = info.penalties.apply(logits)
    if info.logit_bias is not None:
        rows, ids, vals = info.logit_bias
        logits = logits.index_put((rows, ids), vals.to(logits.dtype), accumulate=True)
    if info.banned is not None:
        logits = logits.index_put(info.banned, torch.tensor(float("-inf"), device=logits.device))
    return logits


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top_n: int):
    """(log p of each sampled token (B,), top-n (values, ids) or None) from the adjusted logits."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return chosen, (logp.topk(top_n, dim=-1) if top_n > 0 else None)


class Sampler:
    def __init__(self, seed: int = 0):
        # draws the seeds of unseeded requests: the server's whole sequence follows --random-seed
        self.rng = random.Random(seed)

    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """`logits` as adjusted by `adjust_logits` (penalties and bans are the caller's step)."""
        greedy = logits.argmax(dim=-1)
        if info.all_greedy:
            return greedy
        probs = self._probs(logits.float(), info)
        exp_noise = hash_uniform(info.seeds, info.steps, probs.shape[-1]).log_().neg_()  # Exp(1) draws
        race = probs.div_(exp_noise)
        del exp_noise
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
