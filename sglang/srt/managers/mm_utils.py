"""Multimodal embedding merge: text embeddings with image embeddings scattered in at image positions.

Image positions are found from each item's `offsets`, never from token values: the scheduler
replaces image tokens with hash-derived pad values (for prefix caching) that may collide with
real vocabulary ids.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from sglang.srt.managers.mm_chunk_encoder import batch_image_spans, gather_chunk_image_rows
from sglang.srt.multimodal.hashing import combined_hash


def _request_image_embeddings(mm_inputs, encode_images, cache) -> list[torch.Tensor]:
    """Baseline: all of a request's image embeddings, cached under the combined hash of the set."""
    items = mm_inputs.mm_items
    key = None if cache is None or any(it.hash is None for it in items) else combined_hash([it.hash for it in items])
    embeds = cache.get(key) if key is not None else None
    if embeds is None:
        embeds = encode_images(items)
        mm_inputs.num_vit_encoded += len(items)
        if key is not None:
            cache.put(key, embeds)
    return embeds


def pad_input_ids(input_ids: list[int], mm_inputs) -> list[int]:
    """Prefix-cache key of a prompt: each image's placeholder tokens replaced by its pad value."""
    out = list(input_ids)
    for item in mm_inputs.mm_items:
        for s, e in item.offsets:
            out[s:e] = [item.pad_value] * (e - s)
    return out


def general_mm_embed_routine(
    input_ids: torch.Tensor,
    forward_batch,
    embed_tokens: Callable[[torch.Tensor], torch.Tensor],
    encode_images: Callable[[list], list[torch.Tensor]],
    hidden_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (input embeddings (T, hidden), deepstack embeddings (T, hidden * k) or None).

    Baseline behaviour: a chunk that touches any image of a request encodes all of that request's
    images (in one ViT call) and takes the rows it needs.
    """
    if forward_batch.stage_timings is None:
        return _embed(input_ids, forward_batch, embed_tokens, encode_images, hidden_size)
    # Stage timer: the ViT time of this batch is charged to every request with image rows in it.
    vit_ms = [0.0]

    sync = torch.cuda.synchronize if input_ids.is_cuda else (lambda: None)

    def timed_encode(items):
        sync()
        start = time.perf_counter()
        out = encode_images(items)
        sync()
        vit_ms[0] += (time.perf_counter() - start) * 1e3
        return out

    start = time.perf_counter()
    result = _embed(input_ids, forward_batch, embed_tokens, timed_encode, hidden_size)
    sync()
    merge_ms = (time.perf_counter() - start) * 1e3 - vit_ms[0]
    if forward_batch.forward_mode.is_extend():
        touched = [i for i, _, _ in batch_image_spans(forward_batch)]
        for stage, ms in (("vit_encode", vit_ms[0]), ("embed_merge", merge_ms)):
            forward_batch.stage_totals[stage] = forward_batch.stage_totals.get(stage, 0.0) + ms
            for i in touched:
                t = forward_batch.stage_timings[i]
                t[stage] = t.get(stage, 0.0) + ms
    return result


def _embed(input_ids, forward_batch, embed_tokens, encode_images, hidden_size):
    positions: list[torch.Tensor] = []
    rows: list[torch.Tensor] = []
    cache = forward_batch.mm_embedding_cache
    if forward_batch.forward_mode.is_extend() and any(m is not None for m in forward_batch.mm_inputs):
        if forward_batch.vit_chunk_per_image:
            positions, rows = gather_chunk_image_rows(forward_batch, encode_images, cache)
        else:
            starts = forward_batch.extend_start_locs()
            for i, mm, spans in batch_image_spans(forward_batch):
                embeds = _request_image_embeddings(mm, encode_images, cache)
                for idx, r0, r1, p0 in spans:
                    rows.append(embeds[idx][r0:r1])
                    positions.append(torch.arange(starts[i] + p0, starts[i] + p0 + (r1 - r0)))
    if not rows:
        return embed_tokens(input_ids), None
    pos = torch.cat(positions).to(input_ids.device)
    mm_rows = torch.cat(rows, dim=0)
    safe_ids = input_ids.clone()
    safe_ids[pos] = 0
    embeds = embed_tokens(safe_ids)
    embeds[pos] = mm_rows[:, :hidden_size].to(embeds.dtype)
    deepstack = None
    if mm_rows.shape[1] > hidden_size:
        deepstack = torch.zeros(input_ids.shape[0], mm_rows.shape[1] - hidden_size, dtype=embeds.dtype, device=embeds.device)
        deepstack[pos] = mm_rows[:, hidden_size:].to(embeds.dtype)
    return embeds, deepstack
