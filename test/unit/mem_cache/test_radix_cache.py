"""Unit tests for the radix prefix cache."""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache

PAD = 151655 * 1000  # a large image pad value: just another int to the tree


class RecordingAllocator(TokenToKVPoolAllocator):
    """Logs every freed slot, in order (public API only)."""

    def __init__(self, size):
        super().__init__(size)
        self.freed: list[int] = []

    def free(self, indices):
        self.freed.extend(indices.tolist())
        super().free(indices)


def make(size=64, page_size=1, disable=False):
    alloc = RecordingAllocator(size)
    return alloc, RadixCache(alloc, page_size=page_size, disable=disable)


def put(alloc, cache, key):
    """Inserts key with fresh slots and frees the duplicates per the insert contract."""
    slots = alloc.alloc(len(key))
    present = cache.insert(key, slots)
    alloc.free(slots[:present])
    t = len(key) - len(key) % cache.page_size
    alloc.free(slots[t:])
    return slots


def test_empty_tree_matches_nothing():
    _, cache = make()
    m = cache.match_prefix([1, 2, 3])
    assert m.indices.dtype == torch.int64 and m.indices.numel() == 0
    assert m.last_node is cache.root
    assert cache.total_size() == 0


def test_exact_and_longer_match():
    alloc, cache = make()
    slots = put(alloc, cache, [1, 2, 3, PAD, PAD])
    assert cache.match_prefix([1, 2, 3, PAD, PAD]).indices.tolist() == slots.tolist()
    m = cache.match_prefix([1, 2, 3, PAD, PAD, 9, 9])
    assert m.indices.tolist() == slots.tolist()
    assert m.last_node.key == [1, 2, 3, PAD, PAD]
    assert cache.match_prefix([2, 1]).indices.numel() == 0


def test_partial_match_splits_node():
    alloc, cache = make()
    slots = put(alloc, cache, [1, 2, 3, 4, 5])
    m = cache.match_prefix([1, 2, 3, 7])
    assert m.indices.tolist() == slots[:3].tolist()
    assert m.last_node.key == [1, 2, 3]
    (child,) = m.last_node.children.values()
    assert child.key == [4, 5] and child.value.tolist() == slots[3:].tolist()
    assert child.parent is m.last_node and m.last_node.parent is cache.root
    assert cache.total_size() == 5 and cache.evictable_size() == 5
    # the whole key still matches across the split
    assert cache.match_prefix([1, 2, 3, 4, 5]).indices.tolist() == slots.tolist()


def test_insert_returns_already_present_length():
    alloc, cache = make()
    a = put(alloc, cache, [1, 2, 3, 4])
    assert cache.insert([1, 2, 3, 4], torch.tensor([40, 41, 42, 43])) == 4
    b = alloc.alloc(4)
    assert cache.insert([1, 2, 9, 9], b) == 2
    alloc.free(b[:2])
    assert cache.match_prefix([1, 2, 9, 9]).indices.tolist() == a[:2].tolist() + b[2:].tolist()
    assert cache.match_prefix([1, 2, 3, 4]).indices.tolist() == a.tolist()
    assert cache.total_size() == 6
    assert cache.insert([], torch.empty(0, dtype=torch.int64)) == 0


def test_page_size_4_ignores_partial_pages():
    alloc, cache = make(page_size=4)
    slots = alloc.alloc(10)
    assert cache.insert(list(range(10)), slots) == 0
    assert cache.total_size() == 8  # the trailing partial page is not taken
    alloc.free(slots[8:])
    assert cache.match_prefix(list(range(10))).indices.tolist() == slots[:8].tolist()
    assert cache.match_prefix(list(range(7))).indices.tolist() == slots[:4].tolist()
    assert cache.match_prefix([0, 1, 2]).indices.numel() == 0
    # diverging inside the second page: only the first page counts, and the split is page aligned
    m = cache.match_prefix([0, 1, 2, 3, 4, 5, 99, 7])
    assert m.indices.tolist() == slots[:4].tolist()
    assert m.last_node.key == [0, 1, 2, 3]
    # diverging inside the first page: nothing
    assert cache.match_prefix([0, 1, 99, 3, 4, 5, 6, 7]).indices.numel() == 0
    other = alloc.alloc(8)
    assert cache.insert([0, 1, 2, 3, 4, 5, 99, 7], other) == 4
    assert cache.insert([0, 1, 99, 3, 4, 5, 6, 7], alloc.alloc(8)) == 0
    assert len(cache.root.children) == 2  # children keyed by whole first page
    assert all(m.numel() % 4 == 0 for m in [cache.match_prefix(list(range(k))).indices for k in range(12)])


def test_lock_protects_from_eviction():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [1, 2, 4, 5])
    m = cache.match_prefix([1, 2, 3])
    assert cache.inc_lock_ref(m.last_node) == 3  # [1,2] and [3]
    assert cache.protected_size() == 3 and cache.evictable_size() == 2
    assert cache.inc_lock_ref(m.last_node) == 0
    free_before = alloc.available_size()
    assert cache.evict(100) == 2
    assert alloc.available_size() == free_before + 2
    assert cache.match_prefix([1, 2, 3]).indices.numel() == 3
    assert cache.evict(100) == 0
    assert cache.dec_lock_ref(m.last_node) == 0
    assert cache.dec_lock_ref(m.last_node) == 3
    assert cache.protected_size() == 0 and cache.evictable_size() == 3
    assert cache.evict(1) == 1 and cache.evict(1) == 2  # leaf [3] first, then parent [1,2]
    assert cache.total_size() == 0


def test_lock_survives_split():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3, 4])
    m = cache.match_prefix([1, 2, 3, 4])
    cache.inc_lock_ref(m.last_node)
    cache.match_prefix([1, 2, 9])  # splits the locked node
    assert cache.protected_size() == 4 and cache.evict(10) == 0
    assert cache.dec_lock_ref(m.last_node) == 4
    assert cache.evictable_size() == 4


def test_eviction_is_lru():
    alloc, cache = make()
    a = put(alloc, cache, [1, 1])
    b = put(alloc, cache, [2, 2])
    c = put(alloc, cache, [3, 3])
    cache.match_prefix([1, 1])  # a is now the most recent
    alloc.freed.clear()
    assert cache.evict(2) == 2
    assert alloc.freed == b.tolist()
    assert cache.match_prefix([2, 2]).indices.numel() == 0
    assert cache.evict(1) == 2
    assert alloc.freed == b.tolist() + c.tolist()
    assert cache.match_prefix([1, 1]).indices.tolist() == a.tolist()


def test_eviction_cascades_to_parents():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [1, 2, 4])
    put(alloc, cache, [7])
    cache.match_prefix([7])  # [7] is newest; [1,2]'s leaves are older
    assert cache.evict(3) == 4  # both leaves [3], [4], then the emptied parent [1,2]
    assert cache.match_prefix([1, 2]).indices.numel() == 0
    assert cache.match_prefix([7]).indices.numel() == 1
    assert cache.total_size() == 1


def test_evict_stops_when_nothing_left():
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    assert cache.evict(0) == 0
    assert cache.evict(50) == 3
    assert cache.evict(50) == 0
    assert alloc.available_size() == 64


def test_reset_frees_all_slots():
    alloc, cache = make(size=32)
    for key in ([1, 2, 3], [1, 2, 4, 5], [9, 9, 9, 9], [PAD, PAD, 1]):
        put(alloc, cache, key)
    cache.match_prefix([1, 2, 4])
    assert alloc.available_size() < 32
    cache.reset()
    assert alloc.available_size() == 32
    assert sorted(alloc.alloc(32).tolist()) == list(range(1, 33))
    assert cache.total_size() == 0 and not cache.root.children
    assert cache.match_prefix([1, 2, 3]).indices.numel() == 0


def test_disable_mode():
    alloc, cache = make(disable=True)
    slots = alloc.alloc(3)
    assert cache.insert([1, 2, 3], slots) == 0
    assert cache.insert([1, 2, 3], slots) == 0
    m = cache.match_prefix([1, 2, 3])
    assert m.indices.numel() == 0 and m.last_node is cache.root
    assert cache.total_size() == 0 and cache.evict(10) == 0
    cache.reset()
    assert alloc.available_size() == 61  # the tree never took the caller's slots


def test_pretty_print(capsys):
    alloc, cache = make()
    put(alloc, cache, [1, 2, 3])
    put(alloc, cache, [1, 2, 4])
    text = cache.pretty_print()
    assert "key=[1, 2]" in text and "key=[3]" in text and "key=[4]" in text
    assert capsys.readouterr().out.strip() == text
