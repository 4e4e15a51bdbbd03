"""Data-parallel vision encoder (switch `--mm-enable-dp-encoder`).

At TP size N every rank holds the whole vision tower (replicated, unsharded weights). The images and
video frame groups of one encode call are dealt out over the N ranks, balanced by patch count; each
rank runs the tower over its own items only, with no collective inside the tower, and one all-gather at
the end hands every rank all the embeddings back in the call's order.

Every rank of the TP group calls `dp_encode` with the same list of items (the embedder's ViT cache and
chunk bookkeeping are identical on all ranks), so every rank computes the same plan. A rank dealt no
item still joins the all-gather with an empty (zero-row, padded) part: skipping it would hang the others.

This module holds the plan and the gather; it imports nothing from the layers or models.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable

import torch
import torch.distributed as dist

from sglang.srt.distributed.parallel_state import TPInfo


def frame_groups(grids: list[tuple[int, int, int]], world: int) -> list[tuple[int, int, int]]:
    """Units of work, (item, first temporal patch, temporal patches), in item and frame order. An image is
    one unit; a video whose patches exceed one rank's share (total / world) is cut into
    min(t, ceil(patches / share)) contiguous frame groups of near-equal length, so one long video does not
    leave the other ranks idle. Frames are separate attention segments in both towers (position tables,
    rotary indices and Qwen2.5-VL's windows repeat per frame), so a frame group encodes to exactly the
    rows of those frames."""
    total = sum(t * h * w for t, h, w in grids)
    share = total / world if world > 0 else 0
    units = []
    for i, (t, h, w) in enumerate(grids):
        k = min(t, max(1, math.ceil(t * h * w / share))) if share > 0 else 1
        cuts = [round(j * t / k) for j in range(k + 1)]
        units += [(i, cuts[j], cuts[j + 1] - cuts[j]) for j in range(k)]
    return units


def balanced_split(costs: list[int], world: int) -> list[list[int]]:
    """Deals item indices to `world` ranks, largest cost first, each to the rank with the least total so far
    (ties: the rank with fewer items, then the lower rank). Returns each rank's indices in ascending order; a rank may get none. The plan
    depends only on `costs` and `world`, so every rank computes the same one. The heaviest rank carries at
    most the mean plus the largest single cost."""
    if world < 1:
        raise ValueError(f"world {world} must be >= 1")
    if any(c < 0 for c in costs):
        raise ValueError(f"costs must be >= 0, got {costs}")
    heap = [(0, 0, r) for r in range(world)]
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, n, r = heapq.heappop(heap)
        out[r].append(i)
        heapq.heappush(heap, (load + costs[i], n + 1, r))
    return [sorted(idx) for idx in out]


def dp_encode(
    group: TPInfo,
    costs: list[int],
    rows: list[int],
    encode: Callable[[list[int]], torch.Tensor],
    width: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[torch.Tensor]:
    """Encodes items split over `group` and returns every item's (rows[i], width) embedding on every rank.

    `encode(indices)` runs the tower over those items (packed, in the given order) and returns their rows
    concatenated; it is called only with a non-empty list. `costs` balance the split (patch counts)."""
    plan = balanced_split(costs, group.size)
    mine = plan[group.rank]
    local = encode(mine) if mine else torch.empty((0, width), dtype=dtype, device=device)
    counts = [sum(rows[i] for i in idx) for idx in plan]
    if local.shape[0] != counts[group.rank]:
        raise RuntimeError(f"dp encoder: rank {group.rank} encoded {local.shape[0]} rows, expected {counts[group.rank]}")
    longest = max(counts) if counts else 0
    padded = local.new_zeros((longest, width))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(group.size)]
    dist.all_gather(parts, padded, group=group.group)
    out: list[torch.Tensor | None] = [None] * len(costs)
    for part, idx, n in zip(parts, plan, counts):
        for i, emb in zip(idx, part[:n].split([rows[i] for i in idx], dim=0)):
            out[i] = emb
    return out  # type: ignore[return-value]

