"""Caches of vision-encoder outputs, bounded in bytes, least-recently-used eviction
(`ByteBoundedLRU`: a value larger than the whole budget is refused, never stored).

`MultimodalEmbeddingCache` is the baseline keying (as upstream before per-image caching): one entry
per request image set, under the combined hash of all its images, holding one matrix per image.
`ImageEmbeddingCache` keys each image by its own content hash, so requests sharing some images,
and later chunks of one request, reuse encodings.
"""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.lru import ByteBoundedLRU, tensors_nbytes


class MultimodalEmbeddingCache(ByteBoundedLRU[int, list[torch.Tensor]]):
    def __init__(self, max_bytes: int):
        super().__init__(max_bytes, tensors_nbytes)


class ImageEmbeddingCache(MultimodalEmbeddingCache):
    """One entry per image: content hash -> (tokens, hidden * (1 + deepstack)) embedding."""

    def get_image(self, image_hash: int) -> torch.Tensor | None:
        value = self.get(image_hash)
        return None if value is None else value[0]

    def put_image(self, image_hash: int, embedding: torch.Tensor) -> bool:
        return self.put(image_hash, [embedding])
