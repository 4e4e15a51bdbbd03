"""Weight values for ``sglang.testing.make_model``: deterministic, blocked, generated in parallel.

Every tensor is cut into blocks of whole rows (about ``BLOCK_ELEMS`` values each).  Block ``i`` of
tensor ``name`` is drawn from its own ``np.random.Generator(SFC64(SeedSequence(tensor_seed(seed,
name), spawn_key=(i,))))``, so each block is a pure function of ``(seed, name, shape, i)``: blocks
can be filled by any number of threads in any order and the bytes stay the same.  Inside a block
the values are drawn, scaled and encoded in sub-chunks of about ``SUB_ELEMS`` values that stay in
the CPU cache; numpy releases the GIL for the bulk draws and the ufuncs, so a thread pool scales
with the cores.  No float64 intermediates: float32 normals, scaled in place, then rounded to the
target dtype (bfloat16 by round-to-nearest-even on the uint32 view; float16 by numpy's cast).

Distributions (``preset.init``): linear/conv weights N(0, weight_std); biases N(0, bias_std);
vision position embeddings N(0, embed_std); token embedding / lm_head N(0, embed_std) per row, with
rows of ids the tokenizer never produces shrunk by ``unused_vocab_scale``; norm weights
1 + N(0, norm_noise_std).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

from sglang.testing.presets import ModelPreset, get_preset

# Changing any of these changes the bytes: bump make_model.GENERATOR_VERSION with them.
BLOCK_ELEMS = 1 << 22  # values per independently seeded block (16 MB of float32)
SUB_ELEMS = 1 << 16  # values drawn + encoded at a time inside a block (cache-sized)

# Tensor kinds (select the init distribution).
WEIGHT, EMBED, BIAS, NORM = "weight", "embed", "bias", "norm"
VOCAB = "vocab"  # token embedding / lm_head: rows indexed by token id
# Gated DeltaNet `dt_bias`: softplus(dt_bias + a) is the step of the decay, so values around -4 give
# decays of 0.5-5% per token: states that carry information over tens to hundreds of tokens, as the
# releases' do (a bias around 1 would forget everything within a few tokens, and a test could not
# tell a carried state from a zero one).
DECAY_BIAS = "decay_bias"
DECAY_BIAS_MEAN, DECAY_BIAS_STD = -4.0, 1.0

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
_OUT_DTYPE = {"float32": np.float32, "bfloat16": np.uint16, "float16": np.float16}  # bf16 as bit patterns


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    kind: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def row(self) -> int:
        """Values per row (the last dims); a block always holds whole rows."""
        return math.prod(self.shape[1:]) if len(self.shape) > 1 else 1

    def nbytes(self, dtype: str) -> int:
        return self.numel * ITEMSIZE[dtype]


def default_threads() -> int:
    """CPUs this process may use (``os.cpu_count()`` where affinity is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def tensor_seed(seed: int, name: str) -> int:
    """Stable 128-bit seed for one tensor (independent of Python's hash randomization)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:16], "little")


def _bf16_into(x: np.ndarray, tmp: np.ndarray, out: np.ndarray) -> None:
    """Round-to-nearest-even float32 ``x`` (clobbered) -> bfloat16 bit patterns in uint16 ``out``.
    ``tmp``: uint32 scratch of x's size.  Finite input."""
    u = x.view(np.uint32)
    np.right_shift(u, 16, out=tmp)
    np.bitwise_and(tmp, 1, out=tmp)
    np.add(tmp, 0x7FFF, out=tmp)
    np.add(u, tmp, out=u)
    np.right_shift(u, 16, out=u)
    np.copyto(out, u, casting="unsafe")


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16, returned as uint16 bit patterns (finite input)."""
    x = np.array(x, dtype=np.float32, copy=True).reshape(-1)
    out = np.empty(x.size, dtype=np.uint16)
    _bf16_into(x, np.empty(x.size, dtype=np.uint32), out)
    return out


def _scale(spec: TensorSpec, preset: ModelPreset) -> tuple[float, float]:
    """(mean, std) for the tensor's kind."""
    init = preset.init
    if spec.kind == WEIGHT:
        return 0.0, init.weight_std
    if spec.kind in (EMBED, VOCAB):
        return 0.0, init.embed_std
    if spec.kind == BIAS:
        return 0.0, init.bias_std
    if spec.kind == NORM:
        return 1.0, init.norm_noise_std
    if spec.kind == DECAY_BIAS:
        return DECAY_BIAS_MEAN, DECAY_BIAS_STD
    raise ValueError(spec.kind)


def _vocab_row_std(p: ModelPreset, vocab: int, std: float) -> np.ndarray:
    """Per-row std of a vocabulary matrix: ids the tokenizer never produces (reserved fillers and the
    padding past the added tokens) get `unused_vocab_scale` of it, so a random model's greedy output
    is mostly real tokens rather than `<|reserved_N|>` fillers."""
    from sglang.testing.tokenizer_builder import added_tokens, trained_vocab_size

    out = np.full(vocab, std * p.init.unused_vocab_scale, dtype=np.float32)
    out[: trained_vocab_size()] = std
    for tid, _, _ in added_tokens(p.family):
        if tid < vocab:
            out[tid] = std
    return out


class TensorValues:
    """How one tensor's values are drawn; :meth:`block` fills one block (thread-safe)."""

    def __init__(self, spec: TensorSpec, preset: ModelPreset, seed: int, dtype: str):
        if dtype not in _OUT_DTYPE:
            raise ValueError(dtype)
        self.spec, self.dtype = spec, dtype
        mean, std = _scale(spec, preset)
        self.mean = np.float32(mean)
        self.std = np.float32(std)
        self.row_std = _vocab_row_std(preset, spec.shape[0], std) if spec.kind == VOCAB else None
        self.entropy = tensor_seed(seed, spec.name)
        self.rows = spec.numel // spec.row
        self.rows_per_block = max(1, BLOCK_ELEMS // spec.row)

    @property
    def num_blocks(self) -> int:
        return -(-self.rows // self.rows_per_block)

    def block(self, index: int) -> np.ndarray:
        """Block ``index``: flat encoded values of rows [index * rows_per_block, ...)."""
        row = self.spec.row
        r0 = index * self.rows_per_block
        rows = min(self.rows_per_block, self.rows - r0)
        if rows <= 0:
            raise IndexError(index)
        seq = np.random.SeedSequence(self.entropy, spawn_key=(index,))
        rng = np.random.Generator(np.random.SFC64(seq))
        out = np.empty(rows * row, dtype=_OUT_DTYPE[self.dtype])
        sub_rows = max(1, SUB_ELEMS // row)
        scratch = tmp = None
        if self.dtype != "float32":
            scratch = np.empty(min(rows, sub_rows) * row, dtype=np.float32)
        if self.dtype == "bfloat16":
            tmp = np.empty(scratch.size, dtype=np.uint32)
        for r in range(0, rows, sub_rows):
            k = min(sub_rows, rows - r)
            a, m = r * row, k * row
            vals = out[a : a + m] if scratch is None else scratch[:m]
            rng.standard_normal(out=vals, dtype=np.float32)
            if self.row_std is None:
                vals *= self.std
            else:
                v2 = vals.reshape(k, row)
                v2 *= self.row_std[r0 + r : r0 + r + k, None]
            if self.mean:
                vals += self.mean
            if self.dtype == "bfloat16":
                _bf16_into(vals, tmp[:m], out[a : a + m])
            elif self.dtype == "float16":
                np.copyto(out[a : a + m], vals, casting="same_kind")
        return out


def iter_tensor_chunks(spec: TensorSpec, preset: str | ModelPreset, seed: int, dtype: str) -> Iterator[np.ndarray]:
    """Yield the tensor's encoded values (flat, C order) block by block, in this thread.

    float32/float16 chunks have that numpy dtype; bfloat16 chunks are uint16 bit patterns.
    """
    tv = TensorValues(spec, get_preset(preset), seed, dtype)
    for i in range(tv.num_blocks):
        yield tv.block(i)


T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], threads: int, window: int | None = None) -> Iterator[R]:
    """``map(fn, items)`` on ``threads`` worker threads, results yielded in input order, at most
    ``window`` (default 2 * threads + 1) results computed ahead of the consumer (bounded memory).
    ``items`` is consumed lazily in the calling thread.  Closing the iterator early cancels what
    has not started and waits for what has."""
    if threads < 1:
        raise ValueError("threads must be >= 1")
    window = window or 2 * threads + 1
    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="make_model") as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()


def iter_blocks(
    specs: Iterable[TensorSpec], preset: str | ModelPreset, seed: int, dtype: str, threads: int
) -> Iterator[tuple[TensorSpec, np.ndarray]]:
    """``(spec, encoded block)`` for every block of every tensor, in file order, filled by
    ``threads`` worker threads.  The bytes do not depend on ``threads``."""
    p = get_preset(preset)

    def tasks():
        for spec in specs:
            tv = TensorValues(spec, p, seed, dtype)
            for i in range(tv.num_blocks):
                yield tv, i

    return ordered_map(lambda task: (task[0].spec, task[0].block(task[1])), tasks(), threads)
