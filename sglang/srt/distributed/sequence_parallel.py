"""Ulysses sequence parallelism for the vision towers (switch `--enable-vit-ulysses-sp`).

Every rank of the TP group holds the whole vision tower and a contiguous shard of the packed patch
sequence. Per-token work (patch embedding, norms, MLPs, mergers) runs on the shard alone; attention
needs every token of a segment, so before it one all-to-all turns "my tokens, all heads" into "all
tokens, my 1/P of the heads" and after it a second all-to-all turns the result back. The global
`cu_seqlens` therefore stay valid for the attention kernel whatever the cut points are. At the end the
merged rows of every shard are gathered so each rank holds the full embeddings.

This module holds the split plan, the collectives (with single-process references for the tests) and
the byte model the benchmark and docs use. It imports nothing from the layers.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo

# A cut moves to the nearest segment (image, frame or window) boundary when that costs at most this
# fraction of one rank's share; otherwise it falls on a token (merge-unit) boundary inside a segment.
DEFAULT_BOUNDARY_TOLERANCE = 0.125


@dataclass(frozen=True)
class SequenceSplit:
    """bounds[r]:bounds[r+1] is rank r's shard; token_split[k] tells whether the k-th inner cut lies
    inside a segment (it always lies on a multiple of the merge unit)."""

    bounds: tuple[int, ...]
    token_split: tuple[bool, ...]

    @property
    def sizes(self) -> list[int]:
        return [e - s for s, e in zip(self.bounds[:-1], self.bounds[1:])]

    def shard(self, rank: int) -> slice:
        return slice(self.bounds[rank], self.bounds[rank + 1])


def plan_sequence_split(
    cu_seqlens: list[int], world: int, unit: int = 1, tolerance: float = DEFAULT_BOUNDARY_TOLERANCE
) -> SequenceSplit:
    """Cuts the packed sequence [0, cu_seqlens[-1]) into `world` contiguous shards.

    Cut k aims at k/world of the tokens (rounded to a multiple of `unit`, the merge window, so no merged
    token is split). It snaps to the nearest segment boundary at or after the previous cut when that is
    within `tolerance` of one share; otherwise it stays on the unit boundary and is a token split. Each
    shard then differs from an equal share by at most 2 * tolerance * share + unit tokens."""
    total = cu_seqlens[-1]
    if world < 1 or unit < 1:
        raise ValueError(f"world {world} and unit {unit} must be >= 1")
    if total % unit:
        raise ValueError(f"{total} tokens are not a multiple of the merge unit {unit}")
    units = total // unit
    slack = tolerance * total / world
    boundaries = sorted(set(cu_seqlens))
    bounds, splits = [0], []
    for k in range(1, world):
        prev = bounds[-1]
        ideal = max(prev, round(k * units / world) * unit)
        j = bisect.bisect_left(boundaries, ideal)
        near = [b for b in boundaries[max(j - 1, 0) : j + 1] if b >= prev and b % unit == 0]
        best = min(near, key=lambda b: abs(b - ideal), default=None)
        if best is not None and abs(best - ideal) <= slack:
            bounds.append(best)
            splits.append(False)
        else:
            bounds.append(ideal)
            splits.append(ideal not in boundaries)
    bounds.append(total)
    return SequenceSplit(tuple(bounds), tuple(splits))


def vision_tower_parallelism(
    tp: TPInfo, ulysses: bool, num_heads: int, dp_encoder: bool = False
) -> tuple[TPInfo, TPInfo | None]:
    """(TPInfo the tower's linears are built with, sequence-parallel group or None).

    Off, or at TP size 1: the TP group itself and no sequence parallelism (today's sharded tower). On:
    single-rank linears (whole weights on every rank, the loader reads full tensors) and the TP group
    for the all-to-alls. Heads must divide over the ranks; otherwise start-up stops with one line.
    `dp_encoder` (`--mm-enable-dp-encoder`) alone: single-rank linears and no sequence parallelism (the
    model splits whole images over the ranks, see dp_encoder.py); with `ulysses` it is refused."""
    if dp_encoder and not ulysses and tp.size > 1:
        return SINGLE_RANK, None
    if not ulysses or tp.size == 1:
        return tp, None
    if dp_encoder:
        raise ValueError("--enable-vit-ulysses-sp and --mm-enable-dp-encoder both replicate the vision tower "
                         "and split its work over the ranks; choose one")
    if num_heads % tp.size:
        raise ValueError(
            f"--enable-vit-ulysses-sp: the vision tower's {num_heads} attention heads do not divide over "
            f"--tp-size {tp.size}; use a TP size that divides {num_heads} or drop the flag"
        )
    return SINGLE_RANK, tp


class UlyssesShards:
    """One tower forward's view of the split: this rank's slice and the three collectives."""

    def __init__(self, group: TPInfo, split: SequenceSplit):
        if len(split.bounds) != group.size + 1:
            raise ValueError(f"split has {len(split.bounds) - 1} shards for {group.size} ranks")
        self.group = group
        self.split = split
        self.sizes = split.sizes
        self.local = split.shard(group.rank)

    @property
    def local_size(self) -> int:
        return self.sizes[self.group.rank]

    def seq_to_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(n_local, ..., H, D) -> (N, ..., H / P, D): every token of the batch, this rank's heads
        (rank r takes heads [r*H/P, (r+1)*H/P)), rows in global sequence order."""
        p, n = self.group.size, x.shape[0]
        heads = x.shape[-2]
        send = x.unflatten(-2, (p, heads // p)).movedim(-3, 0).contiguous()  # (P, n, ..., H/P, D)
        out = send.new_empty((sum(self.sizes), *send.shape[2:]))
        dist.all_to_all_single(
            out, send.flatten(0, 1), output_split_sizes=self.sizes, input_split_sizes=[n] * p, group=self.group.group
        )
        return out

    def heads_to_seq(self, y: torch.Tensor) -> torch.Tensor:
        """(N, ..., H / P, D) -> (n_local, ..., H, D): the inverse of `seq_to_heads`."""
        p, n = self.group.size, self.local_size
        out = y.new_empty((p * n, *y.shape[1:]))
        dist.all_to_all_single(
            out, y.contiguous(), output_split_sizes=[n] * p, input_split_sizes=self.sizes, group=self.group.group
        )
        return out.unflatten(0, (p, n)).movedim(0, -3).flatten(-3, -2)

    def gather(self, rows: torch.Tensor, unit: int = 1) -> torch.Tensor:
        """Concatenates every rank's `rows` (rank r holds sizes[r] // unit of them) in rank order.
        Shards may differ in length: each is padded to the longest for one all_gather."""
        counts = [s // unit for s in self.sizes]
        longest = max(counts)
        padded = rows.new_zeros((longest, *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded, group=self.group.group)
        return torch.cat([part[:c] for part, c in zip(parts, counts)], dim=0)


# ---------------------------------------------------------------------------- references (one process)
def reference_seq_to_heads(shards: list[torch.Tensor], rank: int) -> torch.Tensor:
    """What `seq_to_heads` returns on `rank`, given every rank's input: the whole sequence, that rank's
    contiguous block of heads."""
    full = torch.cat(shards, dim=0)
    h = full.shape[-2] // len(shards)
    return full[..., rank * h : (rank + 1) * h, :]


def reference_heads_to_seq(per_rank_heads: list[torch.Tensor], sizes: list[int], rank: int) -> torch.Tensor:
    """What `heads_to_seq` returns on `rank`, given every rank's (N, ..., H/P, D) input."""
    full = torch.cat(per_rank_heads, dim=-2)
    start = sum(sizes[:rank])
    return full[start : start + sizes[rank]]


# ---------------------------------------------------------------------------- byte model
def bytes_per_layer(tokens: int, hidden: int, ranks: int, itemsize: int = 2) -> dict[str, float]:
    """Bytes one rank sends per transformer layer of the vision tower (receives the same).

    TP: two all-reduces of the (tokens, hidden) activations (attention output and MLP output); a ring
    all-reduce sends 2 (P - 1) / P of the tensor per rank. Ulysses: the q/k/v all-to-all (3 tensors)
    and the output all-to-all (1 tensor) each send (P - 1) / P of the rank's (tokens / P, hidden) shard."""
    act = tokens * hidden * itemsize
    p = ranks
    tp = 2 * (2 * (p - 1) / p) * act
    ulysses = 4 * ((p - 1) / p) * act / p
    return {"tp": tp, "ulysses": ulysses, "ratio": tp / ulysses if ulysses else float("inf")}
