"""The KV slot allocator: deferred merging of freed pages hands out exactly the pages, in exactly the
order, that appending every free at once did, and never more than exist."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator


class _EagerReference:
    """Appends every freed page to the free list at once (the allocator before deferred merging)."""

    def __init__(self, size, page):
        self.page = page
        self.free_pages = list(range(1, size // page + 1))

    def alloc(self, n):
        pages = -(-n // self.page)
        if pages > len(self.free_pages):
            return None
        taken, self.free_pages = self.free_pages[:pages], self.free_pages[pages:]
        return [p * self.page + i for p in taken for i in range(self.page)][:n]

    def free(self, slots):
        self.free_pages += sorted({s // self.page for s in slots})


@settings(max_examples=60, deadline=None)
@given(page=st.sampled_from([1, 4]), ops=st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=60))
def test_same_pages_in_the_same_order_as_eager_appending(page, ops):
    size = 256
    alloc, ref = TokenToKVPoolAllocator(size, page_size=page), _EagerReference(size, page)
    held: list[list[int]] = []
    for is_alloc, n in ops:
        if is_alloc or not held:
            got, want = alloc.alloc(n), ref.alloc(n)
            assert (got is None) == (want is None)
            if got is not None:
                assert got.tolist() == want
                held.append(want)
        else:
            slots = held.pop(n % len(held))
            alloc.free(torch.tensor(slots))
            ref.free(slots)
        assert alloc.available_size() == len(ref.free_pages) * page


def test_a_free_costs_the_freed_pages_not_the_free_list():
    alloc = TokenToKVPoolAllocator(1 << 20)
    before = alloc._free_pages
    alloc.free(alloc.alloc(8))
    assert alloc._free_pages.data_ptr() == before[8:].data_ptr()  # the free list was not copied
    assert alloc.available_size() == 1 << 20
