"""A hybrid model's prefill activation estimate (model_executor/memory_budget.py) counts its linear-attention
layer and the chunked gated delta rule kernel's float32 workspace: the figures at Qwen3.5-4B's config."""

from __future__ import annotations

import dataclasses

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_executor.memory_budget import (
    gdn_chunk_workspace_bytes,
    gdn_prefill_bytes,
    prefill_activation_bytes,
)
from sglang.testing.qwen3_5_checkpoint import build_config_dict

MiB = 1 << 20
TEXT = ModelConfig.from_dict(build_config_dict("qwen3.5-4b")).text


def test_the_chunk_kernel_workspace_at_qwen3_5_4b():
    # 16 key / 32 value heads of 128: per token float32 q, k normalised (2 x 16 x 128), w and u (2 x 32 x 128)
    assert gdn_chunk_workspace_bytes(TEXT, 8192) == 8192 * 12288 * 4 == 384 * MiB
    assert gdn_chunk_workspace_bytes(TEXT, 8192, tp_size=4) == 96 * MiB  # heads split over the ranks
    # the layer's own tensors, bf16: q|k|v (8192 channels) and the conv output, z and o (4096 each), g and beta
    assert gdn_prefill_bytes(TEXT, 8192, 2) - 384 * MiB == 8192 * ((2 * 8192 + 2 * 4096) * 2 + 32 * 6)


def test_the_estimate_adds_it_for_hybrid_models_only():
    dense = dataclasses.replace(TEXT, hybrid=None)
    assert gdn_prefill_bytes(dense, 8192, 2) == 0
    extra = prefill_activation_bytes(TEXT, 8192, 32768, 2) - prefill_activation_bytes(dense, 8192, 32768, 2)
    assert extra == gdn_prefill_bytes(TEXT, 8192, 2) > 384 * MiB
