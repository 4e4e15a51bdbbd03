"""Recurrent-state pool of hybrid models (Qwen3.5's Gated DeltaNet layers), beside the KV pool.

A linear-attention layer keeps no KV: each request carries a fixed-size state instead (the conv
history and the delta-rule state of every such layer, `mem_cache/gdn_state.py`). The pool
holds one state per request-table row, so a state lives exactly as long as its request's row: the
row is taken at admission and freed by `KVCacheManager.release`, which the overlap scheduler already
defers until no launched step uses the row. Nothing here can leak that the request table does not.

Invariant: a row's state is the state after the request's first `kv_len` tokens. A prefill that starts
at position 0 therefore begins from zeros (`states_for` resets those rows, on the forward thread, in
step order, so a row reused by a new request never sees its previous owner's state).
"""

from __future__ import annotations

from typing import Sequence

import torch

from sglang.srt.mem_cache.gdn_state import GDNRequestState, GDNStateShape


class GDNStatePool:
    def __init__(self, shape: GDNStateShape, rows: int, device: str | torch.device = "cpu"):
        self.shape = shape
        self.rows = rows
        self.device = torch.device(device)
        blank = shape.new_request(device)
        self.conv = blank.conv.new_zeros((rows, *blank.conv.shape))
        self.recurrent = blank.recurrent.new_zeros((rows, *blank.recurrent.shape))

    def bytes_per_request(self) -> int:
        return self.shape.bytes_per_request()

    def total_bytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.recurrent.numel() * self.recurrent.element_size()

    def state(self, row: int) -> GDNRequestState:
        """Row `row`'s state as views into the pool (the model updates it in place)."""
        return GDNRequestState(self.conv[row], self.recurrent[row])

    def states_for(self, rows: Sequence[int], prefix_lens: Sequence[int] | None = None) -> list[GDNRequestState]:
        """The batch's states in batch order. `prefix_lens` (EXTEND batches): a request whose new tokens
        start at position 0 gets a zeroed state first."""
        if prefix_lens is not None:
            fresh = [r for r, p in zip(rows, prefix_lens) if p == 0]
            if fresh:
                idx = torch.tensor(fresh, dtype=torch.int64, device=self.device)
                self.conv.index_fill_(0, idx, 0)
                self.recurrent.index_fill_(0, idx, 0)
        return [self.state(r) for r in rows]
