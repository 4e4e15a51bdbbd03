"""Free-slot allocator over the token KV pool, in pages of `page_size` slots.

Slot s belongs to page s // page_size; page 0 is never handed out (slot 0 is the padding sink).
Each page has one owner at a time (a request's tail or the radix tree), so freeing any slot of a
page returns the whole page."""

from __future__ import annotations

import torch


class TokenToKVPoolAllocator:
    """Pages are handed out from the front of the free list; freed pages join its back. A free only
    records the pages: they are appended in one concatenation when an allocation reaches them, so
    freeing costs the freed pages, not a copy of the whole free list (at batch 128 the step where
    requests finish had spent up to 370 ms copying it once per request). The order pages are handed
    out in is the same either way."""

    def __init__(self, size: int, device: str | torch.device = "cpu", page_size: int = 1):
        self.page_size = page_size
        self.num_pages = size // page_size
        self.size = self.num_pages * page_size
        self.device = device
        self.clear()

    def clear(self) -> None:
        self._free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)
        self._freed: list[torch.Tensor] = []  # freed since the last merge, in order
        self._num_freed = 0

    def available_size(self) -> int:
        return (int(self._free_pages.numel()) + self._num_freed) * self.page_size

    def _merge_freed(self) -> None:
        if self._freed:
            self._free_pages = torch.cat([self._free_pages, *self._freed])
            self._freed, self._num_freed = [], 0

    def alloc(self, n: int) -> torch.Tensor | None:
        """`n` slots filling whole fresh pages from their start (the last page may be partly used)."""
        pages = -(-n // self.page_size)
        if pages > self._free_pages.numel():
            if pages > self._free_pages.numel() + self._num_freed:
                return None
            self._merge_freed()
        taken, self._free_pages = self._free_pages[:pages], self._free_pages[pages:]
        slots = (taken[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)
        return slots[:n]

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel():
            pages = torch.unique(indices.cpu() // self.page_size)
            self._freed.append(pages)
            self._num_freed += int(pages.numel())
