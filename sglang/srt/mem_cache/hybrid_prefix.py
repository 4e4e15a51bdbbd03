"""Prefix caching for hybrid models: where a request's recurrent state is snapshotted, and the journey
of each snapshot slot (captured in a prefill -> held by the request -> given to the radix tree, or freed).

A cached KV prefix is only resumable with the linear-attention layers' state at its end, and that
state cannot be rebuilt from KV. So the tree keeps state snapshots (`RadixCache.attach_snapshot`) at:
- the end of each request's tokens (prompt and output), taken when it is released: a multi-turn chat's
  next turn, and a retracted request, resume there;
- one token before the end of each prompt, captured inside its prefill: the same prompt sent again
  (other sampling, a retry) resumes there (a prompt's last token always runs, for its logits);
- the end of each image and video item's tokens, captured inside the prefill that computes them: the
  same images with a new question resume after the images;
- every `interval` tokens (`--mamba-track-interval`), captured likewise: long shared prefixes
  (system prompts, documents) resume at most `interval` tokens before their end.
All positions are whole pages. A match stops at the deepest snapshot; the rest is recomputed.

Snapshot slots are a bounded part of the state pool (`--max-mamba-cache-size`); when none is free, the
least recently used unlocked tree leaves are evicted (their KV with them); when nothing can be evicted
the capture is skipped, which costs a later hit, never correctness.
"""

from __future__ import annotations

from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.state_pool import GDNStatePool

DEFAULT_TRACK_INTERVAL = 256


def capture_points(req, start: int, end: int, interval: int, page_size: int) -> list[int]:
    """Positions p in (start, end] whose state this prefill step snapshots (p tokens computed): the
    multiples of `interval`, the ends of the request's multimodal items and the prompt's last position,
    rounded down to pages."""
    points = set(range((start // interval + 1) * interval, end + 1, interval)) if interval > 0 else set()
    last = len(req.prompt_key) - 1
    points.add(last - last % page_size)
    mm = getattr(req, "mm_inputs", None)
    for item in (mm.mm_items if mm is not None else ()):
        for _, stop in item.offsets:
            points.add(stop - stop % page_size)
    return sorted(p for p in points if start < p <= end and p % page_size == 0)


class HybridPrefixTracker:
    def __init__(self, pool: GDNStatePool, tree: RadixCache, interval: int = DEFAULT_TRACK_INTERVAL):
        self.pool = pool
        self.tree = tree
        self.interval = interval
        # what happened, counted where it happens (/get_server_info "paths.hybrid_prefix")
        self.counts = {"restored": 0, "captured": 0, "kept_at_release": 0, "given_to_tree": 0, "skipped_no_slot": 0}

    def stats(self) -> dict:
        return {**self.counts, "snapshot_slots": self.pool.snapshot_slots, "in_tree": self.tree.snapshot_count(),
                "free": self.pool.available_snapshots(), "track_interval": self.interval}

    def _alloc(self) -> int | None:
        slot = self.pool.alloc_snapshot()
        if slot is None and not self.tree.disable:
            self.tree.evict(0, snapshots=1)
            slot = self.pool.alloc_snapshot()
        return slot

    def on_admit(self, req) -> None:
        """A request that matched a cached prefix starts from the snapshot at its end."""
        req.state_snapshots = []
        if req.cache_len:
            self.pool.queue_copy(req.last_node.snapshot, req.req_pool_idx)
            self.counts["restored"] += 1

    def plan_captures(self, reqs, prefix_lens, extend_lens) -> list[list[tuple[int, int]]]:
        """Per request of an EXTEND batch: (tokens into this step, snapshot slot) to capture."""
        out = []
        for req, pre, n in zip(reqs, prefix_lens, extend_lens):
            caps = []
            if not self.tree.disable:
                for p in capture_points(req, pre, pre + n, self.interval, self.tree.page_size):
                    slot = self._alloc()
                    if slot is None:
                        self.counts["skipped_no_slot"] += 1
                        break
                    self.counts["captured"] += 1
                    req.state_snapshots.append((p, slot))
                    caps.append((p - pre, slot))
            out.append(caps)
        return out

    def on_release(self, req, key: list[int], cached: bool) -> None:
        """`key`: the request's tokens whose KV the tree now holds (when `cached`). Its captured
        snapshots go to the tree, then the state at the end of `key`; what the tree cannot take is freed."""
        taken = getattr(req, "state_snapshots", [])
        req.state_snapshots = []
        for p, slot in taken:
            if cached and p <= len(key) and self.tree.attach_snapshot(key[:p], slot):
                self.counts["given_to_tree"] += 1
            else:
                self.pool.free_snapshot(slot)
        end = len(key)
        if cached and end > req.cache_len and end % self.tree.page_size == 0:
            slot = self._alloc()
            if slot is None:
                self.counts["skipped_no_slot"] += 1
            elif self.tree.attach_snapshot(key, slot):
                self.pool.queue_copy(req.req_pool_idx, slot)  # before the row can be reused: queued in order
                self.counts["kept_at_release"] += 1
            else:
                self.pool.free_snapshot(slot)
