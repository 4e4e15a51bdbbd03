"""The Ulysses split plan (every token assigned exactly once, cuts on merge units, segment boundaries
unless marked as token splits, bounded imbalance), the single-process references of the all-to-alls,
the start-up check and the byte model. The collectives themselves run at TP=2 in
test/unit/models/test_vit_ulysses_sp.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.distributed.sequence_parallel import (
    DEFAULT_BOUNDARY_TOLERANCE,
    bytes_per_layer,
    plan_sequence_split,
    reference_heads_to_seq,
    reference_seq_to_heads,
    vision_tower_parallelism,
)


def _cu(units_per_segment: list[int], unit: int) -> list[int]:
    cu = [0]
    for u in units_per_segment:
        cu.append(cu[-1] + u * unit)
    return cu


@settings(max_examples=300, deadline=None)
@given(
    segments=st.lists(st.integers(1, 400), min_size=1, max_size=30),
    world=st.integers(1, 8),
    unit=st.sampled_from([1, 4]),
    tolerance=st.sampled_from([0.0, DEFAULT_BOUNDARY_TOLERANCE, 0.3]),
)
def test_plan_properties(segments, world, unit, tolerance):
    cu = _cu(segments, unit)
    total = cu[-1]
    split = plan_sequence_split(cu, world, unit, tolerance)
    b = split.bounds
    assert len(b) == world + 1 and b[0] == 0 and b[-1] == total
    assert all(x <= y for x, y in zip(b, b[1:])), "contiguous, ordered: every token exactly once"
    assert sum(split.sizes) == total
    covered = torch.zeros(total, dtype=torch.int32)
    for r in range(world):
        covered[split.shard(r)] += 1
    assert bool((covered == 1).all())
    assert all(c % unit == 0 for c in b), "no merge window is cut"
    for cut, token_split in zip(b[1:-1], split.token_split):
        assert token_split == (cut not in cu), "a cut inside a segment is marked, one on a boundary is not"
    share = total / world
    for size in split.sizes:
        assert abs(size - share) <= 2 * tolerance * share + unit, (split, share)


def test_image_boundaries_where_they_balance():
    # the seed's request at P=2: 20 equal images, the middle is an image boundary
    cu = _cu([1200] * 20, 4)
    split = plan_sequence_split(cu, 2, 4)
    assert split.bounds == (0, 48000, 96000) and split.token_split == (False,)
    # P=8: a share is 2.5 images; boundaries are half an image (20% of a share) away: token splits
    split = plan_sequence_split(cu, 8, 4)
    assert split.sizes == [12000] * 8 and all(split.token_split[i] for i in (0, 2, 4, 6))
    # one large and several small images: the cut lands inside the large one
    split = plan_sequence_split(_cu([1000, 10, 10, 10], 4), 2, 4)
    assert split.token_split == (True,) and abs(split.sizes[0] - split.sizes[1]) <= 4


def test_plan_rejects_partial_merge_windows():
    with pytest.raises(ValueError, match="merge unit"):
        plan_sequence_split([0, 6], 2, 4)


@given(sizes=st.lists(st.integers(0, 5), min_size=1, max_size=4).filter(sum), seed=st.integers(0, 50))
def test_references_round_trip(sizes, seed):
    p = len(sizes)
    full = torch.randn(sum(sizes), 2, 2 * p, 3, generator=torch.Generator().manual_seed(seed))
    shards = list(full.split(sizes))
    per_rank = [reference_seq_to_heads(shards, r) for r in range(p)]
    assert all(t.shape == (sum(sizes), 2, 2, 3) for t in per_rank)
    for r in range(p):
        assert torch.equal(reference_heads_to_seq(per_rank, sizes, r), shards[r])


def test_parallelism_choice_and_refusal():
    tp2 = TPInfo(rank=1, size=2)
    assert vision_tower_parallelism(tp2, False, 16) == (tp2, None), "off: today's sharded tower"
    assert vision_tower_parallelism(SINGLE_RANK, True, 16) == (SINGLE_RANK, None), "TP 1: nothing to split"
    assert vision_tower_parallelism(tp2, True, 16) == (SINGLE_RANK, tp2)
    with pytest.raises(ValueError) as e:
        vision_tower_parallelism(TPInfo(rank=0, size=3), True, 16)
    assert "\n" not in str(e.value) and "16 attention heads" in str(e.value) and "--tp-size 3" in str(e.value)


def test_byte_model():
    # Ulysses sends 1/P of what TP's two ring all-reduces send per layer
    for p in (2, 4, 8):
        b = bytes_per_layer(96000, 1152, p)
        assert b["ratio"] == pytest.approx(p)
    b = bytes_per_layer(96000, 1152, 8)
    assert b["tp"] == pytest.approx(2 * 2 * 7 / 8 * 96000 * 1152 * 2)
    assert bytes_per_layer(100, 8, 1)["tp"] == 0
