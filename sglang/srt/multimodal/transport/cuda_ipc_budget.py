"""Device memory that `--mm-feature-transport cuda_ipc` takes on a GPU after the schedulers fixed their KV
budgets, so that the rank sharing that GPU leaves room for it.

The tokenizer process allocates the feature pool (SGLANG_MM_FEATURE_CACHE_MB) on its device, cuda:0 of the
node, and makes a CUDA context there to do so; every TP rank whose own device is another GPU opens the
pool's IPC handle on the pool's device, and the driver makes that rank a second context on cuda:0 to map
it. All of this happens after the schedulers sized their KV caches from the free memory they saw, so
without a reservation rank 0's KV pool is sized into memory the pool and contexts take later (about
4 + 0.5 + 7 x 0.5 GB at TP 8).
"""

from __future__ import annotations

# A CUDA context with torch's kernels loaded: ~0.5 GiB on Hopper with CUDA 12/13 (driver + module images).
CUDA_CONTEXT_BYTES = 512 << 20


def cuda_ipc_reserved_bytes(transport: str, pool_bytes: int, local_rank: int, num_local_ranks: int,
                            context_bytes: int = CUDA_CONTEXT_BYTES) -> dict[str, int]:
    """What the rank at `local_rank` (its GPU is cuda:local_rank) must leave free for the transport:
    {"pool": ..., "tokenizer_context": ..., "peer_contexts": ...}; empty when nothing lands on its GPU."""
    if transport != "cuda_ipc" or local_rank != 0:
        return {}
    return {
        "pool": int(pool_bytes),
        "tokenizer_context": context_bytes,
        "peer_contexts": context_bytes * max(0, num_local_ranks - 1),
    }
