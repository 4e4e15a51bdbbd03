"""Content hashes of multimodal items and the pad values derived from them.

A pad value replaces an image's placeholder token ids in the prefix-cache key, so two requests
with the same image share cached KV and a different image never matches.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

# Pad values stay below 2**30 (as upstream) so they fit any int32 id tensor.
PAD_VALUE_MODULUS = 1 << 30


def _as_bytes_view(feature) -> memoryview:
    if isinstance(feature, torch.Tensor):
        t = feature.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        arr = t.contiguous().view(torch.uint8).numpy() if t.dtype == torch.bfloat16 else t.contiguous().numpy()
    else:
        arr = np.ascontiguousarray(feature)
    return memoryview(arr).cast("B")


def sha256_feature_hash(feature) -> int:
    """Baseline hash: sha256 over the raw pixel bytes, as upstream computed it in the scheduler."""
    return int.from_bytes(hashlib.sha256(_as_bytes_view(feature)).digest()[:8], "little")


def pad_value_from_hash(h: int) -> int:
    return h % PAD_VALUE_MODULUS


def combined_hash(hashes: list[int]) -> int:
    """One key for a set of items, order-sensitive (the baseline embedding cache's key)."""
    digest = hashlib.sha256(b"".join(h.to_bytes(8, "little", signed=False) for h in hashes)).digest()
    return int.from_bytes(digest[:8], "little")


def ensure_item_hashes(mm_inputs, hash_fn=sha256_feature_hash) -> int:
    """Fills `hash` and `pad_value` of every item that lacks them; returns how many were computed."""
    computed = 0
    for item in mm_inputs.mm_items:
        if item.hash is None:
            item.hash = hash_fn(item.feature)
            computed += 1
        if item.pad_value is None:
            item.pad_value = pad_value_from_hash(item.hash)
    return computed
