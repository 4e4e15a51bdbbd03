"""Property tests: the radix cache against a dict model under random request / match / evict traffic."""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache

POOL = 40
ALPHABET = [1, 2, 10**12 + 7]  # small so prefixes collide; the last stands for an image pad value


class CheckedAllocator(TokenToKVPoolAllocator):
    """Mirrors the free set through the public API; fails on a double free or on handing out a
    slot that is not free; logs what was freed."""

    def __init__(self, size):
        super().__init__(size)
        self.free_set = set(range(1, size + 1))
        self.freed: list[int] = []

    def alloc(self, n):
        out = super().alloc(n)
        if out is not None:
            idx = out.tolist()
            assert len(idx) == n and set(idx) <= self.free_set, "handed out a slot that is not free"
            self.free_set -= set(idx)
        return out

    def free(self, indices):
        idx = indices.tolist()
        assert len(set(idx)) == len(idx), f"duplicate slots in one free: {idx}"
        assert not self.free_set & set(idx), f"double free of {sorted(self.free_set & set(idx))}"
        assert all(1 <= i <= self.size for i in idx)
        self.free_set |= set(idx)
        self.freed.extend(idx)
        super().free(indices)
        assert self.available_size() == len(self.free_set)


keys = st.lists(st.sampled_from(ALPHABET), max_size=12)


@st.composite
def programs(draw):
    """Op lists whose keys are prefixes of a few shared prompts plus a random tail, so that
    requests share prefixes, diverge mid-edge (splits) and lock nodes other requests split."""
    prompts = draw(st.lists(st.lists(st.sampled_from(ALPHABET), min_size=4, max_size=12), min_size=1, max_size=3))

    def key():
        base = draw(st.sampled_from(prompts))
        return base[: draw(st.integers(0, len(base)))] + draw(st.lists(st.sampled_from(ALPHABET), max_size=4))

    out = []
    for _ in range(draw(st.integers(4, 50))):
        op = draw(st.sampled_from(["start", "start", "finish", "finish", "match", "evict"]))
        out.append((op, key() if op in ("start", "match") else draw(st.integers(0, 12))))
    return out


class Harness:
    def __init__(self, page_size):
        self.ps = page_size
        self.alloc = CheckedAllocator(POOL)
        self.cache = RadixCache(self.alloc, page_size=page_size)
        # Model: page-aligned prefix (tuple) -> slots of its last page, set by the insert that first added it.
        self.model: dict[tuple, list[int]] = {}
        self.running: list[tuple] = []  # (key, cached_len, slots, locked_node)

    def expected_len(self, key):
        best = 0
        for n in range(self.ps, len(key) + 1, self.ps):
            if tuple(key[:n]) in self.model:
                best = n
        return best

    def check_match(self, key):
        m = self.cache.match_prefix(key)
        n = m.indices.numel()
        assert m.indices.dtype == torch.int64
        assert n % self.ps == 0 and n <= len(key)
        assert n == self.expected_len(key)
        assert m.indices.tolist() == [s for e in range(self.ps, n + 1, self.ps) for s in self.model[tuple(key[:e])]]
        return m

    def evict(self, n):
        before = len(self.alloc.freed)
        locked = {s for node in self.cache._nodes() if node.lock_ref > 0 for s in node.value.tolist()}
        evictable = self.cache.evictable_size()
        got = self.cache.evict(n)
        freed = self.alloc.freed[before:]
        assert got == len(freed)
        assert not set(freed) & locked, "evict freed a locked slot"
        assert got >= min(n, evictable) and (got >= n or self.cache.evictable_size() == 0)
        gone = set(freed)
        for k in [k for k, v in self.model.items() if set(v) & gone]:
            assert set(self.model.pop(k)) <= gone, "evict freed part of a page"


    def start(self, key):
        m = self.check_match(key)
        self.cache.inc_lock_ref(m.last_node)
        cached = m.indices.numel()
        fresh = self.alloc.alloc(len(key) - cached)
        if fresh is None:
            self.evict(len(key) - cached - self.alloc.available_size())
            fresh = self.alloc.alloc(len(key) - cached)
        if fresh is None:
            self.cache.dec_lock_ref(m.last_node)
            return
        self.running.append((key, cached, torch.cat([m.indices, fresh]), m.last_node))

    def finish(self, i):
        if not self.running:
            return
        key, cached, slots, node = self.running.pop(i % len(self.running))
        present = self.cache.insert(key, slots)
        assert cached <= present <= len(key)
        t = len(key) - len(key) % self.ps
        assert present % self.ps == 0
        for e in range(self.ps, t + 1, self.ps):
            page = slots[e - self.ps : e].tolist()
            if e <= cached:  # came from match_prefix: these are the tree's own slots
                assert self.model[tuple(key[:e])] == page
            elif e <= present:  # already there: the tree keeps its own slots, ours are duplicates
                assert tuple(key[:e]) in self.model
            else:
                assert tuple(key[:e]) not in self.model
                self.model[tuple(key[:e])] = page
        self.alloc.free(slots[cached:present])
        self.alloc.free(slots[t:])
        self.cache.dec_lock_ref(node)

    def check_invariants(self):
        c = self.cache
        nodes = [n for n in c._nodes() if n is not c.root]
        tree = [s for n in nodes for s in n.value.tolist()]
        held = [s for key, cached, slots, _ in self.running for s in slots[cached:].tolist()]
        everything = Counter(tree + held + list(self.alloc.free_set))
        assert everything == Counter(range(1, POOL + 1)), "slot leaked or duplicated"
        assert sorted(tree) == sorted(s for v in self.model.values() for s in v)
        assert c.evictable_size() == sum(len(n.key) for n in nodes if n.lock_ref == 0)
        assert c.protected_size() == sum(len(n.key) for n in nodes if n.lock_ref > 0)
        assert c.evictable_size() + c.protected_size() == c.total_size() == len(tree)
        for n in nodes:
            assert len(n.key) == n.value.numel() and len(n.key) % self.ps == 0 and n.key
            assert n.lock_ref >= sum(ch.lock_ref for ch in n.children.values())
        locks = Counter()
        for *_, node in self.running:
            while node is not c.root:
                locks[node.id] += 1
                node = node.parent
        assert all(n.lock_ref == locks[n.id] for n in nodes)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page_size=st.sampled_from([1, 2, 4]), program=programs())
def test_random_traffic_keeps_invariants(page_size, program):
    h = Harness(page_size)
    for op, arg in program:
        if op == "start":
            h.start(arg)
        elif op == "finish":
            h.finish(arg)
        elif op == "match":
            h.check_match(arg)
        else:
            h.evict(arg)
        h.check_invariants()
    while h.running:
        h.finish(0)
        h.check_invariants()
    assert h.cache.protected_size() == 0
    h.cache.reset()
    assert h.alloc.available_size() == POOL and h.cache.total_size() == 0


@settings(max_examples=100, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4]), entries=st.lists(keys, max_size=8), probe=keys)
def test_first_insert_wins_and_matches_are_page_aligned(page_size, entries, probe):
    h = Harness(page_size)
    for key in entries:
        h.start(key)
        h.finish(0)
        h.check_invariants()
    m = h.check_match(probe)
    # a locked match survives evicting everything else
    h.cache.inc_lock_ref(m.last_node)
    h.evict(POOL)
    assert h.cache.evictable_size() == 0 and h.cache.total_size() == m.indices.numel()
    assert h.check_match(probe).indices.tolist() == m.indices.tolist()
    h.cache.dec_lock_ref(m.last_node)
    h.check_invariants()
