"""Multimodal embedding for the language model's input: text embeddings with image embeddings
scattered in at image positions. `MultimodalEmbedder` is owned by the model runner; models call it
through the forward batch and never reach back into the scheduler.

Two strategies, chosen once at construction (`SGLANG_VIT_CHUNK_PER_IMAGE`):
- per image (default): a prefill chunk encodes only the images whose token ranges overlap it, looked
  up per image in the `ImageEmbeddingCache`, all misses of the batch (deduplicated by content hash)
  encoded in one ViT call; an image cut by a chunk boundary stays pending (keyed by request id)
  until the chunk that consumes its last row, so a cache smaller than one request's images never
  re-encodes it;
- baseline: a chunk that touches any image of a request encodes all of that request's images in one
  ViT call, cached under the combined hash of the set.

Image positions come from each item's `offsets`, never from token values: the scheduler replaces
image tokens with hash-derived pad values that may collide with real vocabulary ids.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from sglang.srt.mem_cache.mm_embedding_cache import ImageEmbeddingCache, MultimodalEmbeddingCache
from sglang.srt.metrics.stage_timer import EmbedStageClock
from sglang.srt.multimodal.hashing import combined_hash

EncodeFn = Callable[[list], list[torch.Tensor]]


@dataclass(frozen=True)
class MultimodalEmbedConfig:
    chunk_per_image: bool = True
    cache_bytes: int = 100 * 2**20

    @classmethod
    def from_env(cls) -> "MultimodalEmbedConfig":
        from sglang.srt.environ import envs

        return cls(envs.SGLANG_VIT_CHUNK_PER_IMAGE.get(), int(envs.SGLANG_VLM_CACHE_SIZE_MB.get() * 2**20))


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


def with_precomputed(encode_images: EncodeFn, device, counts: Counter | None = None) -> EncodeFn:
    """Items that arrive with their embeddings (`precomputed_embeddings`: encoder disaggregation) skip the
    vision tower; the others go through it in one call, as before. `counts` (observable in /get_server_info)
    gets "items_from_encoders" and "items_through_tower"."""

    def encode(items: list) -> list[torch.Tensor]:
        todo = [it for it in items if it.precomputed_embeddings is None]
        if counts is not None:
            counts["items_through_tower"] += len(todo)
            counts["items_from_encoders"] += len(items) - len(todo)
        if len(todo) == len(items):
            return encode_images(items)
        encoded = iter(encode_images(todo) if todo else [])
        return [torch.as_tensor(it.precomputed_embeddings).to(device) if it.precomputed_embeddings is not None
                else next(encoded) for it in items]

    return encode


class MultimodalEmbedder:
    def __init__(self, cfg: MultimodalEmbedConfig = MultimodalEmbedConfig()):
        self.cfg = cfg
        cache_cls = ImageEmbeddingCache if cfg.chunk_per_image else MultimodalEmbeddingCache
        self.cache = cache_cls(cfg.cache_bytes)
        self._gather = self._gather_per_image if cfg.chunk_per_image else self._gather_per_request
        # NOTE: entries live until `release(rid)`; the scheduler releases every finished request.
        self._pending: dict[str, dict[int, torch.Tensor]] = {}  # rid -> item index -> embedding
        self._encoded: Counter[str] = Counter()  # rid -> images it sent through the ViT
        self.path_counts: Counter[str] = Counter()  # what ran: items through this tower / from encoders

    # ------------------------------------------------------------------ per request
    def encoded_images(self, rid: str) -> int:
        return self._encoded.get(rid, 0)

    def release(self, rid: str) -> None:
        self._pending.pop(rid, None)
        self._encoded.pop(rid, None)

    def num_pending(self) -> int:
        return sum(len(p) for p in self._pending.values())

    def clear(self) -> None:
        self.cache.clear()

    def stats(self) -> dict:
        return {"mm_embedding_cache_bytes": self.cache.current_bytes, "mm_embedding_cache_hits": self.cache.hits,
                "mm_embedding_cache_misses": self.cache.misses,
                "mm_items_through_tower": self.path_counts["items_through_tower"],
                "mm_items_from_encoders": self.path_counts["items_from_encoders"]}

    # ------------------------------------------------------------------ embedding
    def embed(self, input_ids: torch.Tensor, forward_batch, embed_tokens: Callable[[torch.Tensor], torch.Tensor],
              encode_images: EncodeFn, hidden_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (input embeddings (T, hidden), deepstack embeddings (T, hidden * k) or None)."""
        encode_images = with_precomputed(encode_images, input_ids.device, self.path_counts)
        if forward_batch.stage_timings is None:
            return self._embed(input_ids, forward_batch, embed_tokens, encode_images, hidden_size)
        touched = [i for i, _, _ in batch_image_spans(forward_batch)] if forward_batch.forward_mode.is_extend() else []
        sync = torch.cuda.synchronize if input_ids.is_cuda else (lambda: None)
        with EmbedStageClock(forward_batch, touched, sync) as clock:
            return self._embed(input_ids, forward_batch, embed_tokens, clock.timed(encode_images), hidden_size)

    def _embed(self, input_ids, forward_batch, embed_tokens, encode_images, hidden_size):
        positions: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        if forward_batch.forward_mode.is_extend() and any(m is not None for m in forward_batch.mm_inputs):
            positions, rows = self._gather(forward_batch, encode_images)
        if not rows:
            return embed_tokens(input_ids), None
        pos = torch.cat(positions).to(input_ids.device)
        mm_rows = torch.cat(rows, dim=0)
        embeds = embed_tokens(input_ids)  # image rows are overwritten below, whatever id they hold
        embeds[pos] = mm_rows[:, :hidden_size].to(embeds.dtype)
        deepstack = None
        if mm_rows.shape[1] > hidden_size:
            deepstack = torch.zeros(input_ids.shape[0], mm_rows.shape[1] - hidden_size, dtype=embeds.dtype,
                                    device=embeds.device)
            deepstack[pos] = mm_rows[:, hidden_size:].to(embeds.dtype)
        return embeds, deepstack

    def _gather_per_request(self, forward_batch, encode_images: EncodeFn):
        """Baseline: all of a request's image embeddings, cached under the combined hash of the set."""
        positions, rows = [], []
        starts = forward_batch.extend_start_locs()
        for i, mm, spans in batch_image_spans(forward_batch):
            items = mm.mm_items
            key = None if any(it.hash is None for it in items) else combined_hash([it.hash for it in items])
            embeds = self.cache.get(key) if key is not None else None
            if embeds is None:
                embeds = encode_images(items)
                self._encoded[forward_batch.rids[i]] += len(items)
                if key is not None and not any(it.decode_error for it in items):  # a blank stand-in: not cached
                    self.cache.put(key, embeds)
            for idx, r0, r1, p0 in spans:
                rows.append(embeds[idx][r0:r1])
                positions.append(torch.arange(starts[i] + p0, starts[i] + p0 + (r1 - r0)))
        return positions, rows

    def _gather_per_image(self, forward_batch, encode_images: EncodeFn):
        """-> (batch positions, embedding rows) of every image token in this extend batch."""
        starts = forward_batch.extend_start_locs()
        wanted = batch_image_spans(forward_batch)
        found: dict = {}
        to_encode: dict = {}
        for i, mm, spans in wanted:
            pending = self._pending.get(forward_batch.rids[i], {})
            for idx, *_ in spans:
                item = mm.mm_items[idx]
                key = _item_key(item)
                if key in found or key in to_encode:
                    continue
                emb = pending.get(idx)
                if emb is None and item.hash is not None:
                    emb = self.cache.get_image(item.hash)
                if emb is None:
                    to_encode[key] = (item, forward_batch.rids[i])
                else:
                    found[key] = emb
        if to_encode:
            keys = list(to_encode)
            for key, emb in zip(keys, encode_images([to_encode[k][0] for k in keys])):
                item, rid = to_encode[key]
                self._encoded[rid] += 1
                found[key] = emb
                if item.hash is not None and item.decode_error is None:  # a blank stand-in: not cached
                    self.cache.put_image(item.hash, emb)

        positions, rows = [], []
        for i, mm, spans in wanted:
            pre, n = forward_batch.extend_prefix_lens_cpu[i], forward_batch.extend_seq_lens_cpu[i]
            rid = forward_batch.rids[i]
            pending = self._pending.get(rid, {})
            for idx, r0, r1, p0 in spans:
                item = mm.mm_items[idx]
                key = _item_key(item)
                if key in to_encode and item.decode_error is None:  # the same broken image in another request
                    item.decode_error = to_encode[key][0].decode_error
                emb = found[key]
                rows.append(emb[r0:r1])
                positions.append(torch.arange(starts[i] + p0, starts[i] + p0 + (r1 - r0)))
                if _item_end(item) > pre + n:
                    pending[idx] = emb  # the next chunk still needs rows of this image
                else:
                    pending.pop(idx, None)
            if pending:
                self._pending[rid] = pending
            else:
                self._pending.pop(rid, None)
        return positions, rows
