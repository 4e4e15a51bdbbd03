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


def broadcast_pyobj(obj, tp: TPInfo, src: int = 0, timing: dict | None = None):
    """Rank `src` pickles `obj` into a byte tensor and broadcasts its size, then its bytes, over the
    CPU group; every rank returns the unpickled object. Identity at tp size 1.

    With `timing`, `timing["wall_ms"]` is this rank's own share of the transfer: on `src` pickling and
    sending, elsewhere receiving the bytes and unpickling, counted from the size message on, which
    only arrives once `src` has the payload ready. A receiver's wait for `src` to reach the call
    (it may still be polling its socket) is therefore not part of it."""
    import pickle
    import time

    if tp.size == 1:
        if timing is not None:
            timing["wall_ms"] = 0.0
        return obj
    if tp.rank == src:
        start = time.perf_counter()
        data = pickle.dumps(obj)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        dist.broadcast(size, src=src, group=tp.cpu_group)
        dist.broadcast(payload, src=src, group=tp.cpu_group)
        if timing is not None:
            timing["wall_ms"] = (time.perf_counter() - start) * 1e3
        return obj
    size = torch.empty(1, dtype=torch.int64)
    dist.broadcast(size, src=src, group=tp.cpu_group)
    start = time.perf_counter()
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(payload, src=src, group=tp.cpu_group)
    out = pickle.loads(payload.numpy().tobytes())
    if timing is not None:
        timing["wall_ms"] = (time.perf_counter() - start) * 1e3
    return out


def all_gather_pyobj(obj, tp: TPInfo) -> list:
    """Every rank's `obj` (small, picklable: counters for /get_server_info), in rank order, on every rank,
    over the CPU group. [obj] at tp size 1."""
    if tp.size == 1:
        return [obj]
    out: list = [None] * tp.size
    dist.all_gather_object(out, obj, group=tp.cpu_group)
    return out
