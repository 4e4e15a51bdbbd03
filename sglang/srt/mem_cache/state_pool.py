"""Recurrent-state pool of hybrid models (Qwen3.5's Gated DeltaNet layers), beside the KV pool.

A linear-attention layer keeps no KV: each request carries a fixed-size state instead (the conv
history and the delta-rule state of every such layer, `mem_cache/gdn_state.py`). The pool holds one
state per request-table row, so a running request's state lives exactly as long as its row: the row
is taken at admission and freed by `KVCacheManager.release`, which the overlap scheduler already
defers until no launched step uses the row. Nothing here can leak that the request table does not.

Behind the rows sit `snapshot_slots` more states: copies the radix tree keeps at the token positions a
later request may resume from (`mem_cache/hybrid_prefix.py`). A snapshot slot is owned by exactly one
of: the free list, a running request (captured, not yet given to the tree), or one tree node.

With decode CUDA graphs (model_executor/cuda_graph_runner.py) one more slot follows the snapshots: the
padding row (`padding_row`), which no request, snapshot or tree node ever owns (`alloc_snapshot` never
hands it out, `free_snapshot` and `queue_copy` refuse it). A captured batch padded to its graph's size points its
padding requests there, as the KV side writes their keys to slot 0; the kernels may let several padding
requests race on it, so it holds garbage: finite (each write is a delta-rule / conv update of finite
values), never read by a real request, never copied anywhere.

Invariants:
- a row's state is the state after the request's first `kv_len` tokens; a prefill that starts at
  position 0 begins from zeros (`states_for` resets those rows);
- state copies the scheduler asks for (restore a snapshot into a row, keep a finished row as a
  snapshot) are queued and applied at the start of the next forward, on the forward thread, in the
  order they were asked: so they land between the steps exactly as the scheduler saw them, whatever
  steps are still in flight when they are asked;
- both are eager host-driven work: they run before a decode CUDA graph replays (the model runner applies
  the queue first), never inside a captured region; a decode batch has no fresh rows to zero.
"""

from __future__ import annotations

import threading
from typing import Sequence

import torch

from sglang.srt.mem_cache.gdn_state import GDNRequestState, GDNStateShape


class PoolStates(list):
    """`GDNStatePool.states_for`'s result: the batch's `GDNRequestState`s in batch order (a plain list to the
    per-request torch path), plus where they live, for the kernel path (layers/attention/fla/pooled.py):
    `pool`, and `rows`, each request's pool row (= its request-table row), in batch order. `slots`: the
    rows as a device tensor the kernels read instead (None: the batch's own `req_pool_indices`); a captured
    decode batch passes its graph-stable buffer (`GDNStatePool.graph_states`)."""

    def __init__(self, states: list[GDNRequestState], pool: "GDNStatePool", rows: Sequence[int],
                 slots: torch.Tensor | None = None):
        super().__init__(states)
        self.pool = pool
        self.rows = list(rows)
        self.slots = slots


class GDNStatePool:
    def __init__(self, shape: GDNStateShape, rows: int, device: str | torch.device = "cpu", snapshot_slots: int = 0,
                 padding_row: bool = False):
        self.shape = shape
        self.rows = rows
        self.snapshot_slots = snapshot_slots
        self.device = torch.device(device)
        blank = shape.new_request(device)
        n = rows + snapshot_slots
        # the slot after the snapshots: captured decode batches' padding requests (module docstring)
        self.padding_row = n if padding_row else None
        n += int(padding_row)
        self.conv = blank.conv.new_zeros((n, *blank.conv.shape))
        self.recurrent = blank.recurrent.new_zeros((n, *blank.recurrent.shape))
        # pop() hands out the lowest first; never the padding row
        self._free_snapshots = list(range(rows + snapshot_slots - 1, rows - 1, -1))
        self._pending: list[tuple[int, int]] = []  # (src, dst) copies for the next forward
        self._lock = threading.Lock()

    def bytes_per_request(self) -> int:
        return self.shape.bytes_per_request()

    def total_bytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.recurrent.numel() * self.recurrent.element_size()

    def state(self, slot: int) -> GDNRequestState:
        """Slot `slot`'s state (a row or a snapshot) as views into the pool."""
        return GDNRequestState(self.conv[slot], self.recurrent[slot])

    # ------------------------------------------------------------------ snapshots (scheduler thread)
    def available_snapshots(self) -> int:
        return len(self._free_snapshots)

    def alloc_snapshot(self) -> int | None:
        return self._free_snapshots.pop() if self._free_snapshots else None

    def free_snapshot(self, slot: int) -> None:
        if not self.rows <= slot < self.rows + self.snapshot_slots or slot in self._free_snapshots:
            raise RuntimeError(f"state snapshot slot {slot} freed twice or not a snapshot slot")
        self._free_snapshots.append(slot)

    def queue_copy(self, src: int, dst: int) -> None:
        """State slot `src` -> `dst`, applied before the next forward reads any state."""
        if self.padding_row is not None and self.padding_row in (src, dst):  # garbage: never copied
            raise RuntimeError(f"state slot {self.padding_row} is the padding row: no copy reads or writes it")
        with self._lock:
            self._pending.append((src, dst))

    # ------------------------------------------------------------------ the forward (forward thread)
    def apply_pending(self) -> None:
        if not self._pending:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        for src, dst in pending:  # in order: a later copy may read what an earlier one wrote
            self.conv[dst].copy_(self.conv[src])
            self.recurrent[dst].copy_(self.recurrent[src])

    def states_for(self, rows: Sequence[int], prefix_lens: Sequence[int] | None = None,
                   views: bool = True) -> PoolStates:
        """The batch's states in batch order, after the queued copies. `prefix_lens` (EXTEND batches): a
        request whose new tokens start at position 0 gets a zeroed state first. `views` False (the kernel
        path, which reads the pool by row): no per-request view is built, the list holds None per request."""
        self.apply_pending()
        if prefix_lens is not None:
            fresh = [r for r, p in zip(rows, prefix_lens) if p == 0]
            if fresh:
                idx = torch.tensor(fresh, dtype=torch.int64, device=self.device)
                self.conv.index_fill_(0, idx, 0)
                self.recurrent.index_fill_(0, idx, 0)
        return PoolStates([self.state(r) for r in rows] if views else [None] * len(rows), self, rows)

    def graph_states(self, slots: torch.Tensor) -> PoolStates:
        """A captured decode batch's states: `slots` (B,) is the graph runner's buffer, which holds each
        request's row (copied in before every replay) and `padding_row` for the padding requests. Only the
        kernel path runs under a graph and it reads nothing but the slots, so the per-request views are
        placeholders (the padding row's); the queued copies are applied before replay, outside the graph."""
        if self.padding_row is None:
            raise RuntimeError("decode CUDA graphs over the state pool need its padding row (padding_row=True)")
        n = slots.shape[0]
        return PoolStates([self.state(self.padding_row)] * n, self, [self.padding_row] * n, slots)
