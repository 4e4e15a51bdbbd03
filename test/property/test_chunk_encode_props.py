"""Chunk-aware encoding, for any image layout and chunk size: each chunk uses exactly the images
overlapping it, every image is encoded once per request (even with no cache), and the chunks'
rows put together equal the whole request's image embeddings, bit for bit."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.multimodal.embedder import MultimodalEmbedConfig, MultimodalEmbedder, chunk_image_spans
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs

HIDDEN = 3


def _embedding(item) -> torch.Tensor:
    n = item.offsets[0][1] - item.offsets[0][0]
    base = float(item.model_specific_data["seed"])
    return torch.arange(n * HIDDEN, dtype=torch.float32).view(n, HIDDEN) + 1000 * base


def _request(layout, hashed: bool):
    """layout: list of (text_gap, image_tokens); returns (mm_inputs, total length)."""
    items, pos = [], 0
    for k, (gap, n) in enumerate(layout):
        pos += gap
        item = MultimodalDataItem(Modality.IMAGE, offsets=[(pos, pos + n)], model_specific_data={"seed": k})
        if hashed:
            item.hash = 10_000 + k
        items.append(item)
        pos += n
    return MultimodalInputs(mm_items=items), pos + 1


def _fb(mm, start, n):
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND, input_ids=torch.zeros(n, dtype=torch.int64), positions=torch.zeros(3, n),
        req_pool_indices=torch.zeros(1), seq_lens=torch.tensor([start + n]), out_cache_loc=torch.zeros(n),
        seq_lens_cpu=[start + n], extend_seq_lens_cpu=[n], extend_prefix_lens_cpu=[start], mm_inputs=[mm],
        rids=["req"],
    )


@settings(max_examples=150, deadline=None)
@given(
    layout=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 12)), min_size=1, max_size=6),
    chunk=st.integers(1, 20),
    hashed=st.booleans(),
    cache_bytes=st.sampled_from([0, 64, 10**6]),
)
def test_chunks_encode_exactly_overlapping_images_once(layout, chunk, hashed, cache_bytes):
    mm, total = _request(layout, hashed)
    embedder = MultimodalEmbedder(MultimodalEmbedConfig(chunk_per_image=True, cache_bytes=cache_bytes))
    encoded: list[int] = []

    def encode(items):
        encoded.extend(it.model_specific_data["seed"] for it in items)
        return [_embedding(it) for it in items]

    got = torch.full((total, HIDDEN), float("nan"))
    for start in range(0, total, chunk):
        n = min(chunk, total - start)
        overlapping = {idx for idx, *_ in chunk_image_spans(mm, start, start + n)}
        before = len(encoded)
        positions, rows = embedder._gather_per_image(_fb(mm, start, n), encode)
        assert set(encoded[before:]) <= overlapping
        used = {idx for idx, *_ in chunk_image_spans(mm, start, start + n)}
        assert used == overlapping
        for p, r in zip(positions, rows):
            got[start + p] = r

    assert sorted(encoded) == list(range(len(layout))), "each image encoded exactly once per request"
    assert embedder.encoded_images("req") == len(layout)
    assert embedder.num_pending() == 0, "nothing held after the last chunk"
    embedder.release("req")
    assert embedder.encoded_images("req") == 0
    for item in mm.mm_items:
        s, e = item.offsets[0]
        assert torch.equal(got[s:e], _embedding(item))
