"""`ByteBoundedLRU`: a least-recently-used map whose bound is the total size in bytes of its values.

One rule for every cache built on it:
- the stored values never add up to more than `max_bytes`;
- a put evicts least-recently-used entries until the new value fits;
- a value larger than `max_bytes` on its own is never stored: the put changes nothing (no eviction,
  an existing entry under the same key stays) and counts in `rejected`. `get_or_build` still returns
  the value it built, it only does not keep it.

Used by the vision-encoder embedding caches (`mm_embedding_cache.py`) and the ViT per-grid position
caches (`layers/vision_pos_embed.py`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, Iterator, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def tensors_nbytes(tensors) -> int:
    """Bytes held by an iterable of tensors (the size function of tensor-list and tensor-tuple values)."""
    return sum(t.numel() * t.element_size() for t in tensors)


class ByteBoundedLRU(Generic[K, V]):
    """`sizeof(value)` gives a value's bytes, measured once at put. Values must not be None (a miss)."""

    def __init__(self, max_bytes: int, sizeof: Callable[[V], int]):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._sizeof = sizeof
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.rejected = 0  # puts refused because the value alone exceeds max_bytes

    # ------------------------------------------------------------------ lookups
    def get(self, key: K) -> V | None:
        """The value under `key` (now the most recent) or None; counts a hit or a miss."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        """The cached value, or `build()` stored (when it fits) and returned; a build counts as a miss."""
        value = self.get(key)
        if value is None:
            value = build()
            self.put(key, value)
        return value

    def peek(self, key: K) -> V | None:
        """The value without touching recency or counters."""
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    # ------------------------------------------------------------------ updates
    def put(self, key: K, value: V) -> bool:
        """Stores `value` as the most recent entry, evicting least-recent ones to make room; returns
        False (and stores nothing) when the value alone exceeds `max_bytes`."""
        size = self._sizeof(value)
        if size > self.max_bytes:
            self.rejected += 1
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        while self._entries and self._bytes + size > self.max_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self._bytes -= freed
            self.evictions += 1
        self._entries[key] = (value, size)
        self._bytes += size
        return True

    def pop(self, key: K) -> V | None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._bytes -= entry[1]
        return entry[0]

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    # ------------------------------------------------------------------ state
    @property
    def current_bytes(self) -> int:
        return self._bytes

    def keys(self) -> list[K]:
        """Keys from least to most recent."""
        return list(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._entries))
