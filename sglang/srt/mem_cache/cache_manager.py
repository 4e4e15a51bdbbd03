"""KV bookkeeping for scheduler requests: request slots, token slots (evicting from the prefix
cache when short), and handing finished prefixes to the radix tree.

Invariant: every KV slot is owned by exactly one of: the allocator's free list, the radix tree,
or one request's private tail `req.kv_indices[req.cache_len:]`."""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.hybrid_prefix import HybridPrefixTracker
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache


class OutOfKVSlots(RuntimeError):
    pass


class KVCacheManager:
    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: TokenToKVPoolAllocator, tree: RadixCache,
                 hybrid: HybridPrefixTracker | None = None):
        """hybrid: a hybrid model's recurrent-state snapshots (restored at admission, kept at release)."""
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree = tree
        self.hybrid = hybrid

    def available_tokens(self) -> int:
        """Slots obtainable now: free ones plus unlocked cached ones that can be evicted."""
        return self.allocator.available_size() + self.tree.evictable_size()

    def alloc_tokens(self, n: int) -> torch.Tensor:
        ps = self.allocator.page_size
        short = -(-n // ps) * ps - self.allocator.available_size()
        if short > 0:
            self.tree.evict(short)
        loc = self.allocator.alloc(n)
        if loc is None:
            raise OutOfKVSlots(f"need {n} KV slots, {self.allocator.available_size()} free")
        return loc

    def peek_prefix_len(self, req) -> int:
        if req.admitted:
            return req.kv_len
        return int(self.tree.match_prefix(req.prefix_key()).indices.numel())

    def admit(self, req) -> bool:
        """Takes a request slot and the cached prefix of its key; False when no slot is free."""
        idx = self.req_to_token_pool.alloc()
        if idx is None:
            return False
        match = self.tree.match_prefix(req.prefix_key())
        req.req_pool_idx = idx
        req.kv_indices = match.indices.to(torch.int64)
        req.cache_len = req.kv_len
        if not req.output_ids:
            req.cached_tokens = req.cache_len  # what the client is told was served from cache
        req.last_node = match.last_node
        self.tree.inc_lock_ref(req.last_node)
        self.req_to_token_pool.write(idx, 0, req.kv_indices)
        if self.hybrid is not None:
            self.hybrid.on_admit(req)
        req.admitted = True
        return True

    def extend(self, req, n: int) -> torch.Tensor:
        """Allocates `n` slots after the request's current KV and records them in its row. With
        pages, the request first fills the rest of its own last page."""
        start = req.kv_len
        ps = self.allocator.page_size
        in_page = min(n, (ps - start % ps) % ps) if start > req.cache_len else 0
        tail = req.kv_indices[-1] + 1 + torch.arange(in_page) if in_page else torch.empty(0, dtype=torch.int64)
        loc = torch.cat([tail, self.alloc_tokens(n - in_page)]) if n > in_page else tail
        self.req_to_token_pool.write(req.req_pool_idx, start, loc)
        req.kv_indices = torch.cat([req.kv_indices, loc.cpu()])
        return loc

    def extend_decode(self, reqs: list) -> torch.Tensor:
        """One new slot per request (a decode step with pages; the caller made sure they are available), in
        the requests' order: each request first fills its own last page. Page size 1: `alloc_decode`."""
        return torch.cat([self.extend(r, 1) for r in reqs])

    def alloc_decode(self, rows: list[int], starts: list[int]) -> torch.Tensor:
        """Page size 1, a decode step: one slot for each request, at column starts[i] of its request-table row
        rows[i] (its kv_len), from one allocation and recorded in one queued table write, in the requests'
        order. The caller appends slot i to request i's KV (what `extend(req, 1)` does with a dozen tensor
        ops per request)."""
        if self.allocator.page_size != 1:
            raise ValueError(f"alloc_decode needs one-token pages (page size {self.allocator.page_size})")
        locs = self.alloc_tokens(len(rows))
        self.req_to_token_pool.write_cells(rows, starts, locs)
        return locs

    def release(self, req) -> None:
        """Gives the request's KV prefix to the radix tree (duplicates and the unaligned tail are
        freed), unlocks its cached prefix and frees its request slot. Safe to call once per admission. A
        request whose KV is not `kv_cacheable` frees its own slots and gives the tree nothing."""
        if not req.admitted:
            return
        kv = req.kv_indices
        if getattr(req, "kv_cacheable", True):
            key = req.fill_ids[: kv.numel()]
            already = self.tree.insert(key, kv)
            inserted = 0 if self.tree.disable else (len(key) // self.tree.page_size) * self.tree.page_size
            # positions [cache_len, already) duplicate the tree's own slots; [inserted, end) were not taken
            if already > req.cache_len:
                self.allocator.free(kv[req.cache_len : already])
            if inserted < kv.numel():
                self.allocator.free(kv[max(inserted, req.cache_len) :])
            if self.hybrid is not None:
                self.hybrid.on_release(req, key[:inserted], cached=not self.tree.disable)
        else:
            self.allocator.free(kv[req.cache_len :])
            if self.hybrid is not None:
                self.hybrid.on_release(req, [], cached=False)
        self.tree.dec_lock_ref(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = -1
        req.kv_indices = torch.empty(0, dtype=torch.int64)
        req.cache_len = 0
        req.last_node = None
        req.admitted = False
