"""Property tests for SGLANG_VIT_FAST_POS_EMBED: for any list of image grids (frames, 1-window strips,
grids larger than the learned table, repeated shapes) and any table size, the cached path equals the
baseline's per-forward interpolation and rotary, whether its cache entries are fresh or reused."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang.srt.layers.rotary_embedding import VisionRotaryEmbedding
from sglang.srt.layers.vision_blocks import rot_pos_ids
from sglang.srt.layers.vision_pos_embed import CachedVisionRotary, FastPosEmbedInterpolator, bilinear_taps

MERGE = 2
side_st = st.integers(1, 60)
# h, w in merge windows: 1 (a strip one window across) up to 40 windows (80 patches, beyond 48x48)
windows_st = st.integers(1, 40).map(lambda k: k * MERGE)
grids_st = st.lists(st.tuples(st.integers(1, 3), windows_st, windows_st), min_size=1, max_size=3)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference (torch.testing.assert_close is slow on the larger examples)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    return (a - b).abs().max().item()


def baseline_pos_embed(table: torch.Tensor, side: int, grid_thw) -> torch.Tensor:
    """Qwen3VisionTransformer.interpolated_pos_embed with the table and side passed in."""
    out = []
    for t, h, w in grid_thw:
        idx, wts = bilinear_taps(h, w, side, MERGE)
        out.append((sum(table[idx[:, k].long()] * wts[:, k : k + 1] for k in range(4))).repeat(t, 1))
    return torch.cat(out)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(side=side_st, grids=grids_st, seed=st.integers(0, 2**16))
def test_interpolation_equals_baseline(side, grids, seed):
    from sglang.srt.configs.model_config import VisionConfig
    from sglang.srt.models.qwen3_vl import Qwen3VisionTransformer

    cfg = VisionConfig(depth=0, hidden_size=8, intermediate_size=8, num_heads=2, out_hidden_size=8, patch_size=16,
                       temporal_patch_size=2, spatial_merge_size=MERGE, num_position_embeddings=side * side)
    base = Qwen3VisionTransformer(cfg, dtype=torch.float32, fast_pos_embed=False)
    table = torch.randn(side * side, 8, generator=torch.Generator().manual_seed(seed))
    base.pos_embed.weight.data.copy_(table)
    ref = base.interpolated_pos_embed(grids)
    # the taps reproduce the baseline exactly when summed in its order
    assert torch.equal(baseline_pos_embed(table, side, grids), ref)
    fast = FastPosEmbedInterpolator(side, MERGE, max_bytes=4096)  # tiny bound: entries churn
    for _ in range(2):  # cold, then whatever the bound kept
        assert max_diff(fast(table, grids, torch.float32), ref) <= 1e-6 * max(1.0, ref.abs().max().item())
    assert fast.cache.nbytes <= 4096 or len(fast.cache) == 1


@settings(max_examples=25, deadline=None)
@given(grids=grids_st, head_dim=st.sampled_from([8, 16, 72, 80]))
def test_rotary_equals_baseline(grids, head_dim):
    rotary = VisionRotaryEmbedding(head_dim)
    ref_cos, ref_sin = rotary.cos_sin(rot_pos_ids(grids, MERGE))
    cached = CachedVisionRotary(rotary, MERGE)
    for _ in range(2):
        cos, sin = cached.cos_sin(grids, torch.device("cpu"))
        assert max_diff(cos, ref_cos) <= 1e-6 and max_diff(sin, ref_sin) <= 1e-6
