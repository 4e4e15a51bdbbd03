"""Chunk-aware ViT encoding: a prefill chunk encodes only the images whose token ranges overlap
it, looked up per image in the `ImageEmbeddingCache`, with all misses of the batch (deduplicated
by content hash) encoded in one ViT call.

An image cut by a chunk boundary is kept on its request (`_pending_embeds`) until the chunk that
consumes its last row, so a cache smaller than one request's images never re-encodes it."""

from __future__ import annotations

from typing import Callable

import torch

from sglang.srt.mem_cache.mm_embedding_cache import ImageEmbeddingCache


def chunk_image_spans(mm_inputs, chunk_start: int, chunk_end: int):
    """(item index, first row, end row, first position in the chunk) for every item whose token
    range overlaps [chunk_start, chunk_end)."""
    spans = []
    for idx, item in enumerate(mm_inputs.mm_items):
        row_base = 0
        for s, e in item.offsets:
            lo, hi = max(s, chunk_start), min(e, chunk_end)
            if lo < hi:
                spans.append((idx, row_base + lo - s, row_base + hi - s, lo - chunk_start))
            row_base += e - s
    return spans


def batch_image_spans(forward_batch) -> list[tuple[int, object, list]]:
    """(request index, mm_inputs, spans) for each request of an extend batch whose chunk overlaps
    any of its images."""
    out = []
    for i, mm in enumerate(forward_batch.mm_inputs):
        if mm is None or not mm.mm_items:
            continue
        pre, n = forward_batch.extend_prefix_lens_cpu[i], forward_batch.extend_seq_lens_cpu[i]
        spans = chunk_image_spans(mm, pre, pre + n)
        if spans:
            out.append((i, mm, spans))
    return out


def _item_key(item):
    return item.hash if item.hash is not None else ("unhashed", id(item))


def _item_end(item) -> int:
    return max(e for _, e in item.offsets)


def gather_chunk_image_rows(
    forward_batch, encode_images: Callable[[list], list[torch.Tensor]], cache: ImageEmbeddingCache | None
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """-> (batch positions, embedding rows) of every image token in this extend batch."""
    starts = forward_batch.extend_start_locs()
    wanted = batch_image_spans(forward_batch)
    found: dict = {}
    to_encode: dict = {}
    for i, mm, spans in wanted:
        pending = getattr(mm, "_pending_embeds", {})
        for idx, *_ in spans:
            item = mm.mm_items[idx]
            key = _item_key(item)
            if key in found or key in to_encode:
                continue
            emb = pending.get(idx)
            if emb is None and cache is not None and item.hash is not None:
                emb = cache.get_image(item.hash)
            if emb is None:
                to_encode[key] = (item, mm)
            else:
                found[key] = emb
    if to_encode:
        keys = list(to_encode)
        for key, emb in zip(keys, encode_images([to_encode[k][0] for k in keys])):
            item, mm = to_encode[key]
            mm.num_vit_encoded += 1
            found[key] = emb
            if cache is not None and item.hash is not None:
                cache.put_image(item.hash, emb)

    positions, rows = [], []
    for i, mm, spans in wanted:
        pre, n = forward_batch.extend_prefix_lens_cpu[i], forward_batch.extend_seq_lens_cpu[i]
        pending = getattr(mm, "_pending_embeds", {})
        for idx, r0, r1, p0 in spans:
            item = mm.mm_items[idx]
            emb = found[_item_key(item)]
            rows.append(emb[r0:r1])
            positions.append(torch.arange(starts[i] + p0, starts[i] + p0 + (r1 - r0)))
            if _item_end(item) > pre + n:
                pending[idx] = emb  # the next chunk still needs rows of this image
            else:
                pending.pop(idx, None)
        mm._pending_embeds = pending
    return positions, rows
