"""Embedding caches: byte bound, LRU order, oversize values refused."""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.mm_embedding_cache import ImageEmbeddingCache, MultimodalEmbeddingCache


def _t(rows: int) -> torch.Tensor:
    return torch.zeros(rows, 4, dtype=torch.float32)  # 16 bytes per row


def test_lru_eviction_keeps_within_budget():
    cache = ImageEmbeddingCache(max_bytes=16 * 10)
    assert cache.put_image(1, _t(4)) and cache.put_image(2, _t(4))
    assert cache.get_image(1) is not None  # 1 is now the most recent
    assert cache.put_image(3, _t(4))  # evicts 2, the least recent
    assert cache.get_image(2) is None and cache.get_image(1) is not None and cache.get_image(3) is not None
    assert cache.current_bytes <= cache.max_bytes
    assert (cache.hits, cache.misses) == (3, 1)


def test_oversize_value_is_refused_without_evicting():
    cache = MultimodalEmbeddingCache(max_bytes=16 * 4)
    assert cache.put(1, [_t(2)])
    assert not cache.put(2, [_t(5)])
    assert cache.get(1) is not None and len(cache) == 1


def test_replacing_a_key_recounts_bytes():
    cache = ImageEmbeddingCache(max_bytes=16 * 10)
    cache.put_image(1, _t(4))
    cache.put_image(1, _t(2))
    assert cache.current_bytes == 32 and len(cache) == 1
