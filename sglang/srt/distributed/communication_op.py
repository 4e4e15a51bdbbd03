"""Collectives over a TP group; identity at tp size 1 so single-rank code pays nothing."""

from __future__ import annotations

import torch
import torch.distributed as dist

from sglang.srt.distributed.parallel_state import TPInfo


def tensor_model_parallel_all_reduce(x: torch.Tensor, tp: TPInfo) -> torch.Tensor:
    if tp.size == 1:
        return x
    dist.all_reduce(x, group=tp.group)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, tp: TPInfo, dim: int = -1) -> torch.Tensor:
    if tp.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x.contiguous(), group=tp.group)
    return torch.cat(parts, dim=dim)
