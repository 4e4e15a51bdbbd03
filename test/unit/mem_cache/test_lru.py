"""ByteBoundedLRU: the byte bound always holds, the most recently used entries are the ones kept,
and a value larger than the whole budget is never stored (a rejected put that changes nothing)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.mem_cache.lru import ByteBoundedLRU

KEYS = st.integers(0, 7)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.integers(0, 160)),
        st.tuples(st.just("get"), KEYS, st.just(0)),
    ),
    max_size=60,
)


def _lru(max_bytes: int) -> ByteBoundedLRU[int, tuple[int, int]]:
    return ByteBoundedLRU(max_bytes, sizeof=lambda v: v[1])  # value = (tag, size in bytes)


@settings(max_examples=300, deadline=None)
@given(max_bytes=st.integers(0, 320), ops=OPS)
def test_invariants_against_a_reference_model(max_bytes, ops):
    lru = _lru(max_bytes)
    model: list[tuple[int, tuple[int, int]]] = []  # (key, value), least recent first
    rejected = 0
    for tag, (op, key, size) in enumerate(ops):
        if op == "put":
            value = (tag, size)
            stored = lru.put(key, value)
            assert stored == (size <= max_bytes)
            if stored:
                model = [(k, v) for k, v in model if k != key]
                while model and sum(v[1] for _, v in model) + size > max_bytes:
                    model.pop(0)
                model.append((key, value))
                assert lru.keys()[-1] == key  # the newest entry is kept
            else:
                rejected += 1
                assert lru.peek(key) != value  # oversize never stored
        else:
            got = lru.get(key)
            hit = next((v for k, v in model if k == key), None)
            assert got == hit
            if hit is not None:
                model = [(k, v) for k, v in model if k != key] + [(key, hit)]
        # the bound, the byte count and the contents (most recent ones, in recency order)
        assert lru.current_bytes == sum(v[1] for _, v in model) <= max_bytes
        assert lru.keys() == [k for k, _ in model]
        assert [lru.peek(k) for k in lru.keys()] == [v for _, v in model]
        assert lru.rejected == rejected


@settings(max_examples=200, deadline=None)
@given(max_bytes=st.integers(1, 200), sizes=st.lists(st.integers(0, 60), min_size=1, max_size=30))
def test_kept_entries_are_a_most_recent_suffix(max_bytes, sizes):
    """With distinct keys put in order, what stays is the longest run of latest accepted puts that fits
    (an oversize put is refused and evicts nothing)."""
    lru = _lru(max_bytes)
    for i, size in enumerate(sizes):
        lru.put(i, (i, size))
    kept, total = [], 0
    for i in reversed(range(len(sizes))):
        if sizes[i] > max_bytes:
            continue
        if total + sizes[i] > max_bytes:
            break
        kept.insert(0, i)
        total += sizes[i]
    assert lru.keys() == kept


def test_oversize_put_changes_nothing():
    lru = _lru(100)
    assert lru.put(1, ("a", 60)) and lru.put(2, ("b", 40))
    assert not lru.put(1, ("big", 101))  # not stored, nothing evicted, the old value under 1 stays
    assert lru.keys() == [1, 2] and lru.peek(1) == ("a", 60) and lru.current_bytes == 100
    assert (lru.rejected, lru.evictions) == (1, 0)
    assert lru.put(3, ("c", 100)) and lru.keys() == [3] and lru.evictions == 2


def test_get_or_build_counts_and_returns_unkept_values():
    lru = _lru(10)
    builds = []

    def build(size):
        return lambda: builds.append(size) or ("v", size)

    assert lru.get_or_build("k", build(4)) == ("v", 4)
    assert lru.get_or_build("k", build(4)) == ("v", 4) and builds == [4]
    assert lru.get_or_build("huge", build(11)) == ("v", 11) and "huge" not in lru
    assert (lru.hits, lru.misses, lru.rejected) == (1, 2, 1)


def test_pop_and_clear():
    lru = _lru(10)
    lru.put("a", ("a", 3))
    lru.put("b", ("b", 4))
    assert lru.pop("a") == ("a", 3) and lru.pop("a") is None and lru.current_bytes == 4
    lru.clear()
    assert len(lru) == 0 and lru.current_bytes == 0
