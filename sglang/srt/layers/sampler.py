"""Next-token sampling for the whole batch on the device: greedy, temperature, top-k, top-p, min-p.

Draws use the exponential race in log space: argmax over kept tokens of x - log(-log u), x = logit / T,
which equals argmax of p / E with E = -log u ~ Exp(1), a draw from p, and needs no normalisation. The
uniform u is a counter-based hash of (seed, output position, token id) computed on the device: a seeded
request gets the same tokens whatever else is batched with it and on any device, and no row ever goes to
the host. The only device-to-host copy is the caller's read of the sampled ids.

Two implementations of the same rule (`sgl_kernel.sampling` documents it): the Triton kernel
`sgl_kernel.sampling.sample_from_logits` (one launch; taken for CUDA logits when triton imports), and the
torch path here (CPU servers): 16 passes over the (B, vocab) block for a plain sampled step (12 of them
the int32 hash), 20 with min-p, 21 with top-k (+ top-p) and 24 with top-p alone (a full sort). SGLANG_SAMPLER_BACKEND
(auto | triton | torch) or `Sampler(backend=...)` overrides the choice."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from itertools import repeat

import torch

from sglang.srt.environ import envs
from sglang.srt.utils.host_tensors import host_float32, host_int64

_M32 = 0xFFFFFFFF
_U_MAX = 1.0 - 2.0**-24  # largest float32 below 1


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finalizer (xorshift-multiply) on int64 tensors holding values in [0, 2^32),
    in place. Products may wrap past 2^63; the low 32 bits kept by the mask are exact either way.
    Used on per-row (B,) values; the (B, vocab) block goes through `_mix32_i32`."""
    x.bitwise_xor_(x >> 16)
    x.mul_(0x7FEB352D).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x846CA68B).bitwise_and_(_M32)
    return x.bitwise_xor_(x >> 16)


def _to_i32(x: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^32) as the int32 with the same bits."""
    return (x - ((x >> 31) << 32)).to(torch.int32)


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(low, high) 16-bit halves of an int32 tensor as int16 views (little-endian only, else None)."""
    if sys.byteorder != "little":
        return None
    halves = x.view(torch.int16).view(*x.shape, 2)
    return halves[..., 0], halves[..., 1]


def _xor_high_into_low(x: torch.Tensor, halves) -> None:
    """x ^= x >>> 16 on an int32 tensor, in place: the low 16-bit half of each element xored with its
    high half, one strided op (torch has no logical right shift on int32: else shift, mask and xor)."""
    if halves is not None:
        halves[0].bitwise_xor_(halves[1])
    else:
        x.bitwise_xor_((x >> 16).bitwise_and_(0xFFFF))


def _mix32_i32(x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """`_mix32` on int32 bit patterns, in place: int32 products wrap mod 2^32 like the uint32 ones; right
    shifts are made logical by masking. `scratch` is an int32 tensor of x's shape. 7 passes."""
    halves = _halves(x)
    _xor_high_into_low(x, halves)
    x.mul_(0x7FEB352D)
    x.bitwise_xor_(torch.bitwise_right_shift(x, 15, out=scratch).bitwise_and_(0x1FFFF))
    x.mul_(0x846CA68B - (1 << 32))
    _xor_high_into_low(x, halves)
    return x


def _uniform_into(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, vocab) float32 uniforms; see `hash_uniform`."""
    row = _mix32((seeds & _M32) ^ _mix32(((seeds >> 32) & _M32) ^ 0x9E3779B9))
    row = _mix32(row ^ _mix32((steps & _M32) ^ 0x85EBCA6B))
    col = torch.arange(vocab, device=seeds.device, dtype=torch.int64).mul_(0x9E3779B1).bitwise_and_(_M32)
    h = torch.add(_to_i32(col).unsqueeze(0), _to_i32(row).unsqueeze(1))  # int32, wraps mod 2^32
    scratch = torch.empty_like(h)
    _mix32_i32(h, scratch)
    h24 = torch.bitwise_right_shift(h, 8, out=scratch).bitwise_and_(0xFFFFFF)
    del h
    # (h24 + 0.5) / 2^24 in one op, written over h24's memory: 2^-25 + 2^-24 * h24, one rounding
    u = torch.add(torch.tensor(2.0**-25, device=seeds.device), h24, alpha=2.0**-24,
                  out=h24.view(torch.float32))
    return u.clamp_max_(_U_MAX)


def hash_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, vocab) float32 uniforms in (0, 1): a pure function of (seed, step, token id),
    u = ((mix32(id * 0x9E3779B1 + row) >> 8) + 0.5) / 2^24 with row a hash of (seed, step), capped at
    1 - 2^-24: the top hash value used to round up to exactly 1 (E = -log u = 0 made that token win the
    race whatever its probability, about once per 110 rows at a 152k vocabulary); every other value is
    unchanged. Bit-identical to `sgl_kernel.sampling.hash_uniform_torch` and to the Triton kernel's hash.
    Computed on int32 (two (B, vocab) buffers, the second reused for the result)."""
    return _uniform_into(seeds.long(), steps.long(), vocab)


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
    # (rows, token ids) whose logits are -inf this step: stop tokens of rows below min_new_tokens
    banned: tuple[torch.Tensor, torch.Tensor] | None = None
    # (rows, token ids, biases) added to the logits: the requests' logit_bias
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # some sampled row uses top-k or top-p (the torch path sorts only then; min-p needs no sort)
    need_sort: bool = True
    # the largest k among those rows (vocab size where one uses top-p alone): the torch path takes that
    # many top values per row instead of a full sort; None: full sort
    max_top_k: int | None = None

    @classmethod
    def from_params(cls, params: list, seeds: list[int | None], vocab_size: int, device, steps: list[int],
                    rng: random.Random | None = None) -> "SamplingBatchInfo":
        """Host values packed into one float and one int tensor, each moved with one copy."""
        return cls.from_columns(row_columns([sampling_row(p, vocab_size) for p in params]), device, steps, rng,
                                seeds)

    @classmethod
    def from_columns(cls, cols: tuple[tuple, ...], device, steps: list[int], rng: random.Random | None = None,
                     seeds: list[int | None] | None = None) -> "SamplingBatchInfo":
        """`from_params` from the requests' `sampling_row`s as columns (`row_columns`; a caller may keep the
        rows across steps: they depend on the params alone); `seeds` default to the rows' own. Only C-level
        passes over the rows: no Python runs per request here."""
        rng = rng or random.Random(0)
        temps, top_ps, min_ps, top_ks, row_seeds, filters, sort_ks = cols[:7]
        floats = host_float32([*temps, *top_ps, *min_ps]).view(3, -1).to(device, non_blocking=True)
        row_seeds = _draw_seeds(row_seeds if seeds is None else seeds, rng)
        ints = host_int64([*top_ks, *row_seeds, *steps]).view(3, -1).to(device, non_blocking=True)
        need_sort = any(sort_ks)  # a sorting row's k is >= 1; 0 marks a row that does not sort
        return cls(
            temperatures=floats[0].unsqueeze(1), top_ps=floats[1], min_ps=floats[2],
            top_ks=ints[0], seeds=ints[1], steps=ints[2],
            all_greedy=not any(temps),  # temperatures are >= 0 (validated); 0.0 marks a greedy row
            need_filter=any(filters),
            need_sort=need_sort,
            max_top_k=max(sort_ks) if need_sort else None,
        )


# A sampling_row: (temperature (0.0: greedy), top_p, min_p, top_k (vocab when off), seed or None, filters,
# sort k, then the flags the worker reads at its index below)
ROW_HAS_PENALTY, ROW_BANS, ROW_LOGIT_BIAS, ROW_LOGPROBS = 7, 8, 9, 10
_ROW_LEN = 11


def sampling_row(p, vocab_size: int) -> tuple:
    """One request's share of a SamplingBatchInfo, from its sampling params alone: `filters` when it uses
    top-k, top-p or min-p; `sort k` its k when it is sampled with top-k or top-p (the torch path's sort),
    else 0; and whether it has a penalty, min_new_tokens (its stop ids banned while below), a logit_bias
    (non-empty), logprobs (return_logprob or top_logprobs_num)."""
    temp = 0.0 if p.is_greedy else float(p.temperature)
    top_k = vocab_size if p.top_k < 1 else min(p.top_k, vocab_size)
    filters = top_k < vocab_size or p.top_p < 1.0 or p.min_p > 0.0
    sort_k = top_k if temp > 0.0 and (top_k < vocab_size or p.top_p < 1.0) else 0
    return (temp, float(p.top_p), float(p.min_p), top_k, p.seed, filters, sort_k, p.has_penalty,
            p.min_new_tokens > 0, bool(p.logit_bias), bool(p.return_logprob or p.top_logprobs_num))


def row_columns(rows: list[tuple]) -> tuple[tuple, ...]:
    """The rows' fields as columns, one tuple per field (in C)."""
    return tuple(zip(*rows)) if rows else ((),) * _ROW_LEN


def _draw_seeds(seeds, rng: random.Random) -> list[int]:
    """Each row's seed, or for a row without one the next `rng.getrandbits(63)`, drawn in row order (the
    server's sequence of draws follows --random-seed); the draws of an all-unseeded batch run in C."""
    unseeded = seeds.count(None)
    if unseeded == len(seeds):
        return list(map(rng.getrandbits, repeat(63, unseeded)))
    if not unseeded:
        return list(seeds)
    draws = map(rng.getrandbits, repeat(63, unseeded))
    return [s if s is not None else next(draws) for s in seeds]


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
    """Logit biases and min-token masks (penalties are applied before, by the worker's
    `sampling.penalties.PenaltyState`): what the distribution is sampled (and logprobs taken) from."""
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


def _kernel_importable() -> bool:
    try:
        import triton  # noqa: F401

        import sgl_kernel.sampling  # noqa: F401
    except ImportError:
        return False
    return True


_BACKENDS = ("auto", "triton", "torch")


class Sampler:
    def __init__(self, seed: int = 0, backend: str | None = None):
        # draws the seeds of unseeded requests: the server's whole sequence follows --random-seed
        self.rng = random.Random(seed)
        # auto: the Triton kernel for CUDA logits when triton and sgl_kernel import, else torch; triton:
        # always the kernel (CPU tensors only under TRITON_INTERPRET=1); torch: always the torch path
        self.backend = backend if backend is not None else envs.SGLANG_SAMPLER_BACKEND.get()
        if self.backend not in _BACKENDS:
            raise ValueError(f"unknown sampler backend {self.backend!r}; use one of {', '.join(_BACKENDS)}")
        self._kernel_ok: bool | None = None

    def uses_kernel(self, logits: torch.Tensor) -> bool:
        if self.backend == "auto":
            if not logits.is_cuda:
                return False
            if self._kernel_ok is None:
                self._kernel_ok = _kernel_importable()
            return self._kernel_ok
        return self.backend == "triton"

    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        """`logits` as adjusted by `adjust_logits` (penalties and bans are the caller's step)."""
        if info.all_greedy:
            return logits.argmax(dim=-1)
        if self.uses_kernel(logits):
            from sgl_kernel.sampling import sample_from_logits

            return sample_from_logits(logits, info.temperatures.view(-1), info.top_ks, info.top_ps, info.min_ps,
                                      info.seeds, info.steps)
        return sample_torch(logits, info)


def sample_torch(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """The torch path: x = logits * (1 / T) (T = 1 for greedy rows, whose noise is zeroed), a threshold per
    row (the smallest kept x: `_thresholds`), and argmax of x - log(-log u) over kept tokens. Passes over
    the (B, V) block (aten ops reading or writing it; views and allocations aside): 16 for a plain sampled
    step (12 of them the int32 hash), 20 with min-p, 21 with top-k (+ top-p), 24 with top-p alone."""
    t = info.temperatures.view(-1, 1).float()
    sampled = t > 0
    inv_t = torch.where(sampled, 1.0 / torch.where(sampled, t, 1.0), 1.0)
    noise = hash_uniform(info.seeds, info.steps, logits.shape[-1])
    noise = torch.xlogy(-1.0, noise, out=noise)  # E = -log u ~ Exp(1)
    noise = torch.xlogy(-sampled.float(), noise, out=noise)  # -log E for sampled rows, 0 for greedy ones
    if not info.need_filter:
        return noise.addcmul_(logits.float(), inv_t).argmax(dim=-1)
    x = logits.float() * inv_t
    noise.masked_fill_(x < _thresholds(x, info), float("-inf"))
    return noise.add_(x).argmax(dim=-1)


def _thresholds(x: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """(B, 1): the smallest kept value of x per row; every rule keeps each row's max. min-p alone: the
    row max (no sort). top-k / top-p: the `max_top_k` largest values per row (topk, masses from the row's
    log-sum-exp), or a full sort when a row uses top-p without top-k; the kept count is min(k, 1 + #ranks
    whose cumulative mass is below top_p)."""
    v = x.shape[-1]
    min_p = info.min_ps.view(-1, 1).float()
    log_min_p = torch.where(min_p > 0, torch.log(torch.where(min_p > 0, min_p, 1.0)), float("-inf"))
    if not info.need_sort:
        return x.amax(dim=-1, keepdim=True) + log_min_p
    k = info.top_ks.view(-1, 1).long()
    k = torch.where((k < 1) | (k > v), v, k)
    kk = v if info.max_top_k is None else min(int(info.max_top_k), v)
    top_p = info.top_ps.view(-1, 1).float()
    if kk < v:
        # every row that filters keeps at most kk tokens: its kk largest values suffice, and their masses
        # come from the row's log-sum-exp (top-p's cumulative mass is only needed over kept ranks)
        sorted_x = x.topk(kk, dim=-1, sorted=True).values
        cum = (sorted_x - torch.logsumexp(x, dim=-1, keepdim=True)).exp_().cumsum_(dim=-1)
    else:
        sorted_x = x.sort(dim=-1, descending=True).values
        cum = torch.softmax(sorted_x, dim=-1).cumsum_(dim=-1)
    # top-p: rank r is kept while the mass of ranks < r is below top_p, i.e. r <= #(cumsum < top_p)
    n_p = torch.searchsorted(cum, top_p.contiguous()) + 1
    n_p = torch.where(top_p >= 1.0, v, n_p)
    n = torch.minimum(n_p, k).clamp_(1, kk)
    kept_k_p = torch.where((k < v) | (top_p < 1.0), sorted_x.gather(1, n - 1), float("-inf"))
    return torch.maximum(kept_k_p, sorted_x[:, :1] + log_min_p)
