"""A small Qwen3-VL vision tower for position tests: the baseline and fast position paths on the same
learned table (48x48, as the real checkpoints), without the cost of real blocks."""

from __future__ import annotations

import torch

from sglang.srt.configs.model_config import VisionConfig
from sglang.srt.models.qwen3_vl import Qwen3VisionTransformer


def vit_pair(side: int = 48, hidden: int = 32, heads: int = 2, dtype=torch.float32, seed: int = 0):
    """(baseline tower, fast tower) sharing one random position table; depth 0 keeps them cheap."""
    cfg = VisionConfig(depth=0, hidden_size=hidden, intermediate_size=8, num_heads=heads, out_hidden_size=8,
                       patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                       num_position_embeddings=side * side)
    base = Qwen3VisionTransformer(cfg, dtype=dtype, fast_pos_embed=False)
    fast = Qwen3VisionTransformer(cfg, dtype=dtype, fast_pos_embed=True)
    table = torch.randn(side * side, hidden, generator=torch.Generator().manual_seed(seed)).to(dtype)
    with torch.no_grad():
        base.pos_embed.weight.copy_(table)
        fast.pos_embed.weight.copy_(table)
    return base, fast
