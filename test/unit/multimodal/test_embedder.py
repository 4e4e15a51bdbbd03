"""MultimodalEmbedder: the strategy is fixed by its config, pending rows of an image cut by a chunk
boundary are held per request id (not on the request's inputs) until consumed or released, and the
per-request encode counts are what the scheduler reports."""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.mm_embedding_cache import ImageEmbeddingCache, MultimodalEmbeddingCache
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.multimodal.embedder import MultimodalEmbedConfig, MultimodalEmbedder
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs

HIDDEN = 4


def _mm(n_tokens: int, seed: int, start: int = 2) -> MultimodalInputs:
    item = MultimodalDataItem(Modality.IMAGE, offsets=[(start, start + n_tokens)], model_specific_data={"seed": seed})
    item.hash = 1000 + seed
    return MultimodalInputs(mm_items=[item])


def _fb(mms, rids, prefix, lens):
    t = sum(lens)
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND, input_ids=torch.zeros(t, dtype=torch.int64), positions=torch.zeros(3, t),
        req_pool_indices=torch.zeros(len(mms)), seq_lens=torch.tensor([p + n for p, n in zip(prefix, lens)]),
        out_cache_loc=torch.zeros(t), seq_lens_cpu=[p + n for p, n in zip(prefix, lens)], extend_seq_lens_cpu=lens,
        extend_prefix_lens_cpu=prefix, mm_inputs=mms, rids=rids,
    )


def _encode_counting(calls):
    def encode(items):
        calls.append([it.model_specific_data["seed"] for it in items])
        return [torch.full((it.offsets[0][1] - it.offsets[0][0], 2 * HIDDEN), float(it.model_specific_data["seed"]))
                for it in items]
    return encode


def _embed_tokens(ids):
    return torch.zeros(ids.shape[0], HIDDEN)


def test_config_picks_the_strategy_once():
    assert isinstance(MultimodalEmbedder(MultimodalEmbedConfig(chunk_per_image=True)).cache, ImageEmbeddingCache)
    base = MultimodalEmbedder(MultimodalEmbedConfig(chunk_per_image=False))
    assert type(base.cache) is MultimodalEmbeddingCache


def test_pending_rows_are_keyed_by_request_and_released():
    emb = MultimodalEmbedder(MultimodalEmbedConfig(chunk_per_image=True, cache_bytes=0))  # no cache: pending only
    a, b = _mm(6, seed=1), _mm(6, seed=2)
    calls = []
    enc = _encode_counting(calls)
    # first chunk of both requests stops inside their image (tokens 2..8): rows stay pending per rid
    embeds, deep = emb.embed(torch.zeros(10, dtype=torch.int64), _fb([a, b], ["A", "B"], [0, 0], [5, 5]),
                             _embed_tokens, enc, HIDDEN)
    assert calls == [[1, 2]] and emb.num_pending() == 2
    assert torch.equal(embeds[2:5], torch.full((3, HIDDEN), 1.0)) and torch.equal(embeds[7:10], torch.full((3, HIDDEN), 2.0))
    assert deep.shape == (10, HIDDEN)
    assert not hasattr(a, "_pending_embeds")  # nothing hangs on the (pickled) request inputs
    # A finishes its image from pending (no new encode); B is released (e.g. aborted) in between
    emb.release("B")
    emb.embed(torch.zeros(5, dtype=torch.int64), _fb([a], ["A"], [5], [5]), _embed_tokens, enc, HIDDEN)
    assert calls == [[1, 2]] and emb.num_pending() == 0
    assert emb.encoded_images("A") == 1 and emb.encoded_images("B") == 0
    emb.release("A")
    assert emb.encoded_images("A") == 0


def test_baseline_encodes_the_whole_set_and_caches_it():
    emb = MultimodalEmbedder(MultimodalEmbedConfig(chunk_per_image=False, cache_bytes=10**6))
    mm = _mm(4, seed=3)
    calls = []
    enc = _encode_counting(calls)
    emb.embed(torch.zeros(8, dtype=torch.int64), _fb([mm], ["R"], [0], [8]), _embed_tokens, enc, HIDDEN)
    emb.embed(torch.zeros(8, dtype=torch.int64), _fb([mm], ["S"], [0], [8]), _embed_tokens, enc, HIDDEN)
    assert calls == [[3]]  # the second request hit the set's cache entry
    assert emb.encoded_images("R") == 1 and emb.encoded_images("S") == 0
    assert emb.stats()["mm_embedding_cache_hits"] == 1
