"""Timing for the kernel microbenchmarks (sgl-kernel/benchmark/): one definition of a measured step."""

from __future__ import annotations

import time
from typing import Callable


def timed_ms(fn: Callable[[], object], iters: int, cuda: bool = True, warmup: int = 1) -> float:
    """Milliseconds per call of `fn`. CUDA: mean over `iters` calls between two events after `warmup`
    calls. CPU: the fastest of `iters` calls (a shared machine adds noise, never removes time)."""
    for _ in range(warmup):
        fn()
    if cuda:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3
