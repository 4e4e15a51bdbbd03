"""Tests that need a process group: run one function per rank in spawned processes and collect what
each reports."""

from __future__ import annotations

from typing import Any, Callable

import torch.multiprocessing as mp

from sglang.srt.utils.network import pick_unused_port


def run_ranks(target: Callable[..., None], world_size: int = 2, timeout: float = 120.0) -> dict[int, tuple]:
    """Calls `target(rank, port, queue)` in `world_size` spawned processes that rendezvous on a free
    loopback `port`; each puts one tuple `(rank, *values)` on the queue. Returns {rank: values} once every
    process has reported and exited 0 (a rank that dies or hangs fails the caller within `timeout`)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = pick_unused_port()
    procs = [ctx.Process(target=target, args=(r, port, q)) for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        results: dict[int, Any] = {}
        for _ in procs:
            rank, *values = q.get(timeout=timeout)
            results[rank] = tuple(values)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    codes = [p.exitcode for p in procs]
    assert codes == [0] * world_size, f"rank exit codes {codes}"
    return results
