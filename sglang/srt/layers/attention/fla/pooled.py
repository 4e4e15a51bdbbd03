"""The kernel path of the Gated DeltaNet layer: sgl_kernel.gdn's Triton kernels, one batched call per op over
every request of the batch, states addressed in the state pool by slot.

Which path runs (SGLANG_GDN_BACKEND, resolved once when the model is built and passed down):
- `auto`: the kernels for CUDA activations when triton and sgl_kernel import, else the per-request torch
  path (gated_delta_net.py over ops.py; every CPU run);
- `triton`: always the kernels (CPU tensors only under TRITON_INTERPRET=1; states that are not in a pool are
  an error, never a silent fallback);
- `torch`: always the per-request torch path.

States. A layer's kernels read and write one layer's view of the pool (`pool.conv[:, j]` (slots, C, K-1),
`pool.recurrent[:, j]` (slots, Hv, Dk, Dv)) through a slot per sequence: the request's request-table row,
which is its state-pool row (state_pool.py), so the slot tensor is the batch's device `req_pool_indices`.
Rows of requests starting at position 0 were zeroed, and queued snapshot copies applied, by
`GDNStatePool.states_for` before the forward.

Ops. Decode (every request one new token, no capture): `causal_conv1d_update`, then
`recurrent_gated_delta_rule_update`. Otherwise the varlen forms over cu_seqlens: `causal_conv1d_fwd`, then
`chunk_gated_delta_rule_fwd`.

Snapshot captures (the state after the first k new tokens of a request, copied into a snapshot slot for the
prefix cache): the requests' tokens are cut at their capture points into pieces, and round r runs the two
kernels once over the r-th piece of every request that has one (the pieces' rows gathered, the outputs
scattered back), then copies the captured rows' conv and delta-rule states into their snapshot slots. The
kernels carry no capture table: this is the simplest correct cut, and it costs launches, not FLOPs. A batch
without captures is one round over the rows in place; one whose requests hold at most c captures takes
c + 1 rounds (a prompt usually has one: a page before its end).

`plan_kernel_batch` builds every round's index tensors once per forward on the host and moves them in one
copy; every linear-attention layer reuses them (`GDNKernelBatch.layer(j)`).

Decode CUDA graphs (model_executor/cuda_graph_runner.py). A decode plan given the device `slots` and
`qo_indptr` creates no tensor and reads no device value: each layer is then the two decode launches over
the pool's views and those tensors, so the whole step can be captured. Under a graph the slots are the
runner's static buffer (real rows copied in before each replay, padding requests at the pool's padding
row, state_pool.py). Captures never reach a decode plan (they come only with EXTEND batches), so a
captured step has exactly one round and no snapshot copy.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Sequence

import torch

from sglang.srt.utils.host_tensors import host_int64

GDN_BACKENDS = ("auto", "triton", "torch")


def check_backend(backend: str) -> str:
    if backend not in GDN_BACKENDS:
        raise ValueError(f"unknown Gated DeltaNet backend {backend!r}; use one of {', '.join(GDN_BACKENDS)}")
    return backend


@lru_cache(maxsize=None)
def _kernels_importable() -> bool:
    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec("sgl_kernel") is not None


def uses_kernels(backend: str, device: torch.device) -> bool:
    """Whether a forward on `device` takes the kernel path under `backend` (see the module docstring)."""
    if backend == "auto":
        return device.type == "cuda" and _kernels_importable()
    return check_backend(backend) == "triton"


@dataclass(frozen=True)
class GDNRound:
    """One call of each kernel: S sequences (pieces of requests)."""

    tokens: torch.Tensor | None  # (n,) the batch rows of the pieces, in order; None: every row, in place
    cu_seqlens: torch.Tensor  # (S + 1,) int64: piece s is rows [cu[s], cu[s + 1]) of the (gathered) tokens
    slots: torch.Tensor  # (S,) int64: each piece's state-pool row (distinct)
    capture_src: torch.Tensor | None  # (m,) rows whose state after this round is kept ...
    capture_dst: torch.Tensor | None  # (m,) ... in these snapshot slots


@dataclass(frozen=True)
class GDNPoolLayer:
    """What one linear-attention layer needs on the kernel path: its views of the pool, and the batch plan."""

    conv: torch.Tensor  # (slots, conv_dim, K-1), the activations' dtype
    recurrent: torch.Tensor  # (slots, Hv, Dk, Dv) float32
    batch: "GDNKernelBatch"


@dataclass(frozen=True)
class GDNKernelBatch:
    conv: torch.Tensor  # the pool's (slots, L, conv_dim, K-1)
    recurrent: torch.Tensor  # the pool's (slots, L, Hv, Dk, Dv)
    slots: torch.Tensor  # (B,) int64, each request's row
    decode: bool  # one token per request and no capture: the decode kernels
    rounds: tuple[GDNRound, ...]

    def layer(self, j: int) -> GDNPoolLayer:
        """The views of the j-th linear-attention layer (the pool's layer axis)."""
        return GDNPoolLayer(self.conv[:, j], self.recurrent[:, j], self)


def piece_bounds(n: int, caps: Sequence[tuple[int, int]]) -> list[int]:
    """[0, k1, ..., n]: a request's n new tokens cut at its capture points (0 < k <= n, as the torch path
    keeps them)."""
    cuts = sorted({k for k, _ in caps if 0 < k <= n})
    return [0, *cuts] + ([n] if not cuts or cuts[-1] < n else [])


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """One host->device copy of int64 values (pinned and non-blocking on CUDA, as the forward batch's)."""
    host = host_int64(values)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def plan_kernel_batch(conv: torch.Tensor, recurrent: torch.Tensor, rows: Sequence[int], seq_lens: Sequence[int],
                      captures: Sequence[Sequence[tuple[int, int]]] | None, slots: torch.Tensor | None = None,
                      qo_indptr: torch.Tensor | None = None) -> GDNKernelBatch:
    """conv, recurrent: the state pool's tensors; rows[i]: request i's pool row; seq_lens[i]: its new tokens;
    captures[i]: its (k, snapshot slot) pairs. `slots` and `qo_indptr` ((B,), (B + 1,) int64 on the device),
    when the caller has them (the forward batch's req_pool_indices and qo_indptr), save building them: a batch
    without captures (every decode step) then costs no host loop over its requests and no copy."""
    device = recurrent.device
    if not captures or not any(captures):
        if slots is None or qo_indptr is None:
            ints = _to_device([*rows, 0, *accumulate(seq_lens)], device)
            slots = ints[:len(rows)] if slots is None else slots
            qo_indptr = ints[len(rows):] if qo_indptr is None else qo_indptr
        decode = min(seq_lens, default=0) == 1 and max(seq_lens) == 1
        return GDNKernelBatch(conv, recurrent, slots, decode, (GDNRound(None, qo_indptr, slots, None, None),))
    rounds = _capture_rounds(rows, seq_lens, captures, device)
    if slots is None:
        slots = _to_device(list(rows), device)
    return GDNKernelBatch(conv, recurrent, slots, False, rounds)


def _capture_rounds(rows, seq_lens, captures, device) -> tuple[GDNRound, ...]:
    """The rounds of a batch with captures (module docstring): round r holds the r-th piece of each request
    that has one; every round's tensors from one host buffer in one copy."""
    bounds = [piece_bounds(n, c) for n, c in zip(seq_lens, captures)]
    n_rounds = max(len(b) - 1 for b in bounds)
    starts = [0, *accumulate(seq_lens)]
    host: list[int] = []
    fields = []  # per round: (offset, sizes of tokens, cu, slots, src, dst)
    for r in range(n_rounds):
        tok, cu, sl, src, dst = [], [0], [], [], []
        for i, b in enumerate(bounds):
            if r + 1 >= len(b):
                continue
            lo, hi = b[r], b[r + 1]
            tok.extend(range(starts[i] + lo, starts[i] + hi))
            cu.append(cu[-1] + hi - lo)
            sl.append(rows[i])
            for k, snap in captures[i]:
                if k == hi:
                    src.append(rows[i])
                    dst.append(snap)
        fields.append((len(host), [len(x) for x in (tok, cu, sl, src, dst)]))
        host += tok + cu + sl + src + dst
    dev = _to_device(host, device)
    rounds = []
    for at, sizes in fields:
        tok, cu, sl, src, dst = dev[at:at + sum(sizes)].split(sizes)
        # one round: each request's one piece is all its rows, so the pieces are the batch in order
        rounds.append(GDNRound(tok if n_rounds > 1 else None, cu, sl, src if src.numel() else None,
                               dst if dst.numel() else None))
    return tuple(rounds)


def _heads(net, mixed: torch.Tensor):
    """(T, conv_dim) conv output -> q, k (T, Hk, Dk), v (T, Hv, Dv) as views (the kernels take any token and
    head strides)."""
    t = mixed.shape[0]
    q, k, v = mixed.split([net.key_dim, net.key_dim, net.value_dim], dim=-1)
    return (q.view(t, net.num_k_heads, net.head_k_dim), k.view(t, net.num_k_heads, net.head_k_dim),
            v.view(t, net.num_v_heads, net.head_v_dim))


def mix_pooled(net, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, view: GDNPoolLayer) -> torch.Tensor:
    """The token mixing of GatedDeltaNet `net` on the kernel path: qkv (T, conv_dim) projections, g (T, Hv)
    float32 log decays, beta (T, Hv); returns o (T, Hv, Dv) in qkv's dtype (float32 accumulation, one
    rounding, as the torch path's cast). Updates the pool's rows (and snapshot slots) of this layer in place."""
    from sgl_kernel.gdn import (
        causal_conv1d_fwd,
        causal_conv1d_update,
        chunk_gated_delta_rule_fwd,
        recurrent_gated_delta_rule_update,
    )

    batch, weight = view.batch, net.conv1d.weight
    t = qkv.shape[0]
    out = qkv.new_empty(t, net.num_v_heads, net.head_v_dim)
    if batch.decode:
        mixed = causal_conv1d_update(qkv, weight, None, view.conv, batch.slots, backend="triton")
        q, k, v = _heads(net, mixed)
        return recurrent_gated_delta_rule_update(q, k, v, g, beta, view.recurrent, batch.slots, out=out,
                                                 backend="triton")
    for rnd in batch.rounds:
        if rnd.tokens is None:
            x, gr, br, o = qkv, g, beta, out
        else:
            x, gr, br = qkv.index_select(0, rnd.tokens), g.index_select(0, rnd.tokens), beta.index_select(0, rnd.tokens)
            o = out.new_empty(x.shape[0], *out.shape[1:])
        mixed = causal_conv1d_fwd(x, weight, None, view.conv, rnd.slots, rnd.cu_seqlens, backend="triton")
        q, k, v = _heads(net, mixed)
        chunk_gated_delta_rule_fwd(q, k, v, gr, br, rnd.cu_seqlens, view.recurrent, rnd.slots, out=o,
                                   chunk_size=net.chunk_size, backend="triton")
        if rnd.tokens is not None:
            out.index_copy_(0, rnd.tokens, o)
        if rnd.capture_src is not None:  # the rows' states after this round's pieces, into their snapshots
            for pool in (view.conv, view.recurrent):
                pool.index_copy_(0, rnd.capture_dst, pool.index_select(0, rnd.capture_src))
    return out
