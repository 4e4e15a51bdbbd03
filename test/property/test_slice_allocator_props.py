"""SliceAllocator under random alloc/free sequences: slices never overlap, stay aligned, bytes are
never lost, and freeing everything coalesces back to one block spanning the buffer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.multimodal.transport.slice_allocator import SliceAllocator

ALIGNMENTS = st.sampled_from([1, 8, 64, 512, 4096])
# an op: ("alloc", nbytes) or ("free", index into the live slices)
OPS = st.lists(st.one_of(st.tuples(st.just("alloc"), st.integers(0, 20_000)),
                         st.tuples(st.just("free"), st.integers(0, 10_000))), max_size=120)


def _overlaps(live: dict[int, int]) -> bool:
    spans = sorted(live.items())
    return any(a + n > b for (a, n), (b, _) in zip(spans, spans[1:]))


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 200_000), alignment=ALIGNMENTS, ops=OPS, data=st.data())
def test_random_sequences_keep_invariants(capacity, alignment, ops, data):
    a = SliceAllocator(capacity, alignment)
    live: dict[int, int] = {}  # offset -> rounded size
    for op, arg in ops:
        if op == "alloc":
            off = a.alloc(arg)
            if off is None:
                # first fit fails only when no free block is large enough
                assert a.largest_free_block() < a.round_up(arg)
                continue
            assert off % alignment == 0 and off not in live
            live[off] = a.size_of(off)
            assert live[off] >= arg and live[off] % alignment == 0 and off + live[off] <= a.capacity
        elif live:
            off = sorted(live)[arg % len(live)]
            assert a.free(off) == live.pop(off)
        assert not _overlaps(live)
        assert a.free_bytes == a.capacity - sum(live.values())
        a.check()
    # free the rest in a random order: everything coalesces back into one block
    for off in data.draw(st.permutations(sorted(live))):
        a.free(off)
        a.check()
    assert a.free_bytes == a.capacity and a.num_allocated == 0
    assert a.free_blocks() == ([(0, a.capacity)] if a.capacity else [])


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=40), alignment=ALIGNMENTS)
def test_first_fit_reuses_the_lowest_hole(sizes, alignment):
    a = SliceAllocator(10**6, alignment)
    offs = [a.alloc(n) for n in sizes]
    assert offs == sorted(offs)  # a fresh buffer fills from offset 0 upwards, in order
    a.free(offs[0])
    assert a.alloc(sizes[0]) == 0  # the hole at the start is the first that fits


def test_errors_and_reset():
    with pytest.raises(ValueError):
        SliceAllocator(1024, alignment=3)
    a = SliceAllocator(4096, 512)
    with pytest.raises(KeyError):
        a.free(0)
    o = a.alloc(10)
    with pytest.raises(KeyError):
        a.free(o + 512)
    assert a.alloc(5000) is None
    a.alloc(100)
    assert a.reset() == 2 and a.free_bytes == 4096 and a.free_blocks() == [(0, 4096)]
    assert SliceAllocator(1000, 512).capacity == 512  # the unaligned tail is not used
