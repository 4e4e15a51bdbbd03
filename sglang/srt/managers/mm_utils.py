"""Scheduler-side multimodal helpers. The embedding merge itself lives in
`sglang.srt.multimodal.embedder` (owned by the model runner)."""

from __future__ import annotations


def pad_input_ids(input_ids: list[int], mm_inputs) -> list[int]:
    """Prefix-cache key of a prompt: each image's placeholder tokens replaced by its pad value."""
    out = list(input_ids)
    for item in mm_inputs.mm_items:
        for s, e in item.offsets:
            out[s:e] = [item.pad_value] * (e - s)
    return out
