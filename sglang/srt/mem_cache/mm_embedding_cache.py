"""Caches of vision-encoder outputs, bounded in bytes, least-recently-used eviction.

`MultimodalEmbeddingCache` is the baseline keying (as upstream before per-image caching): one entry
per request image set, under the combined hash of all its images, holding one matrix per image.
`ImageEmbeddingCache` keys each image by its own content hash, so requests sharing some images,
and later chunks of one request, reuse encodings.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class MultimodalEmbeddingCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, list[torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _size(value: list[torch.Tensor]) -> int:
        return sum(t.numel() * t.element_size() for t in value)

    def get(self, key: int) -> list[torch.Tensor] | None:
        value = self._entries.get(key)
        if value is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: int, value: list[torch.Tensor]) -> bool:
        """Stores unless the value alone exceeds the budget; evicts LRU entries to make room."""
        size = self._size(value)
        if size > self.max_bytes:
            return False
        if key in self._entries:
            self._bytes -= self._size(self._entries.pop(key))
        while self._bytes + size > self.max_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self._bytes -= self._size(old)
        self._entries[key] = value
        self._bytes += size
        return True

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    @property
    def current_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


class ImageEmbeddingCache(MultimodalEmbeddingCache):
    """One entry per image: content hash -> (tokens, hidden * (1 + deepstack)) embedding."""

    def get_image(self, image_hash: int) -> torch.Tensor | None:
        value = self.get(image_hash)
        return None if value is None else value[0]

    def put_image(self, image_hash: int, embedding: torch.Tensor) -> bool:
        return self.put(image_hash, [embedding])
