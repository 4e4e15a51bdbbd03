"""--mm-enable-dp-encoder: the balanced split of images over the ranks (patch counts, 0 and 1 items), and
at TP=2 over gloo the data-parallel encoder (whole tower per rank, images dealt out, embeddings gathered
back) gives the same per-image features as the TP-sharded tower and the single-rank model, on Qwen3-VL,
Qwen2.5-VL and Qwen3.5 (the Qwen3-VL tower without deepstack), for no image, one image (one rank encodes
nothing and still joins the gather), several images of different sizes and a video. The engine-level TP=2 == TP=1 runs are in test_tensor_parallel.py."""

from __future__ import annotations

import multiprocessing as mp
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from dp_encoder_worker_main import items_for, patch_row, run, uint8_items_for  # noqa: E402

from sglang.srt.distributed.dp_encoder import balanced_split, frame_groups  # noqa: E402
from sglang.srt.distributed.sequence_parallel import vision_tower_parallelism  # noqa: E402
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo  # noqa: E402
from sglang.srt.model_loader.loader import get_model, log_replicated_vision_memory  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.server_args_checks import log_ignored_flags  # noqa: E402
from sglang.srt.utils.network import pick_unused_port  # noqa: E402

PRESETS = {"qwen3": "qwen3-vl-tiny", "qwen2_5": "qwen2.5-vl-tiny", "qwen3_5": "qwen3.5-tiny"}
SIZE = 2
CASES = [
    ([], 0),  # text only: no image, no collective
    ([(1, 4, 4)], 1),  # one image: one rank has none
    ([(1, 4, 4), (1, 8, 6), (1, 2, 2), (1, 6, 10)], 2),  # several sizes
    ([(2, 4, 4), (1, 4, 6), (3, 2, 4)], 3),  # videos (t > 1) among images, none over one share
    ([(4, 4, 4)], 4),  # one video: two frame groups, one per rank
    ([(3, 4, 6), (1, 2, 2)], 5),  # a long video cut 2 + 1 frames beside a small image
]


# ---------------------------------------------------------------------------- the split
def test_split_of_zero_and_one_item():
    assert balanced_split([], 2) == [[], []]
    assert balanced_split([64], 2) == [[0], []]
    assert balanced_split([64], 1) == [[0]]
    assert balanced_split([0, 0, 0], 2) == [[0, 2], [1]]


def test_split_balances_patch_counts():
    assert balanced_split([16, 48, 4, 60], 2) == [[2, 3], [0, 1]]  # 60 | 48, then 16 -> 48, 4 -> 60: 64 each
    with pytest.raises(ValueError):
        balanced_split([1], 0)
    with pytest.raises(ValueError):
        balanced_split([-1], 2)


@given(costs=st.lists(st.integers(0, 500), max_size=12), world=st.integers(1, 4))
def test_split_is_a_partition_within_one_item_of_the_mean(costs, world):
    plan = balanced_split(costs, world)
    assert len(plan) == world
    assert sorted(i for idx in plan for i in idx) == list(range(len(costs)))
    assert all(idx == sorted(idx) for idx in plan)
    loads = [sum(costs[i] for i in idx) for idx in plan]
    assert max(loads) <= sum(costs) / world + max(costs, default=0)
    assert plan == balanced_split(list(costs), world), "every rank computes the same plan"


def test_frame_groups_cut_only_videos_over_one_share():
    assert frame_groups([], 2) == []
    assert frame_groups([(1, 4, 4)], 2) == [(0, 0, 1)]  # an image is never cut
    assert frame_groups([(2, 4, 4), (1, 4, 6), (3, 2, 4)], 2) == [(0, 0, 2), (1, 0, 1), (2, 0, 3)]
    assert frame_groups([(4, 4, 4)], 2) == [(0, 0, 2), (0, 2, 2)]
    assert frame_groups([(3, 4, 6), (1, 2, 2)], 2) == [(0, 0, 2), (0, 2, 1), (1, 0, 1)]
    assert frame_groups([(4, 4, 4)], 1) == [(0, 0, 4)]
    assert frame_groups([(2, 4, 4)], 8) == [(0, 0, 1), (0, 1, 1)]  # never more groups than frames


@given(grids=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(1, 4)), max_size=6),
       world=st.integers(1, 4))
def test_frame_groups_cover_every_frame_once_in_order(grids, world):
    units = frame_groups(grids, world)
    for i, (t, _, _) in enumerate(grids):
        mine = [(f0, n) for j, f0, n in units if j == i]
        assert all(n >= 1 for _, n in mine) and len(mine) <= min(t, world)
        assert [f0 for f0, _ in mine] == [sum(n for _, n in mine[:k]) for k in range(len(mine))]
        assert sum(n for _, n in mine) == t
    assert [u[0] for u in units] == sorted(u[0] for u in units)


def test_flag_builds_a_replicated_tower_and_refuses_ulysses():
    tp2 = TPInfo(rank=0, size=2)
    assert vision_tower_parallelism(tp2, False, 4, dp_encoder=True) == (SINGLE_RANK, None)
    assert vision_tower_parallelism(SINGLE_RANK, False, 4, dp_encoder=True) == (SINGLE_RANK, None)
    with pytest.raises(ValueError, match="choose one"):
        vision_tower_parallelism(tp2, True, 4, dp_encoder=True)
    with pytest.raises(ValueError, match="--mm-enable-dp-encoder with --enable-vit-ulysses-sp"):
        ServerArgs(tp_size=2, mm_enable_dp_encoder=True, enable_vit_ulysses_sp=True)
    with pytest.raises(SystemExit):  # the command line: one line on stderr and exit status 2
        ServerArgs.from_argv(["--tp-size", "2", "--mm-enable-dp-encoder", "--enable-vit-ulysses-sp"])
    on = ServerArgs.from_argv(["--tp-size", "2", "--mm-enable-dp-encoder"])
    assert on.mm_enable_dp_encoder and not ServerArgs().mm_enable_dp_encoder
    assert log_ignored_flags(on, "cpu") == []
    assert log_ignored_flags(ServerArgs(mm_enable_dp_encoder=True), "cpu") == [
        "--mm-enable-dp-encoder: no effect at --tp-size 1 (nothing to split over)"]


def test_flag_reaches_the_model_and_logs_the_replicated_memory(dirs):
    """ServerArgs -> ModelRunnerConfig -> ViTStrategy (resolved once by the runner) -> the model's
    `vision_dp`; each rank logs what the whole tower costs."""
    from sglang.srt.configs.vit_strategy import ViTStrategy
    from sglang.srt.model_executor.model_runner import ModelRunnerConfig

    assert ModelRunnerConfig("x").mm_enable_dp_encoder is False and ViTStrategy.from_env().dp_encoder is False
    assert ViTStrategy.from_env(dp_encoder=True).dp_encoder
    model = get_model(dirs["qwen3"], "float32", vit=ViTStrategy(dp_encoder=True))
    assert model.vision_dp is None, "no effect at TP 1"
    line = log_replicated_vision_memory(model, TPInfo(rank=0, size=2), "mm-dp-encoder")
    assert line.startswith("mm-dp-encoder: vision tower weights replicated on each of 2 ranks")


# ---------------------------------------------------------------------------- TP=2 over gloo
@pytest.fixture(scope="module")
def dirs(tiny_model_dir) -> dict[str, str]:
    return {name: str(tiny_model_dir(preset)) for name, preset in PRESETS.items()}


@pytest.fixture(scope="module")
def tp2(dirs):
    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    port = pick_unused_port()
    procs = [ctx.Process(target=run, args=(r, SIZE, port, dirs, CASES, outbox), daemon=True) for r in range(SIZE)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(SIZE):
            rank, status, value = outbox.get(timeout=240)
            assert status == "ok", f"rank {rank}: {value}"
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out


def test_vision_weights_replicated(tp2):
    for rank in range(SIZE):
        for name, info in tp2[rank][0].items():
            assert info["dp_qkv_rows"] == SIZE * info["sharded_qkv_rows"], name
            assert info["dp_group_size"] == SIZE, name


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("case", range(len(CASES)), ids=["no_image", "one_image", "several_sizes", "video", "one_video_split", "video_split_and_image"])
def test_dp_encoder_equals_sharded_and_single_rank(tp2, dirs, name, case):
    grids, seed = CASES[case]
    model = get_model(dirs[name], "float32")
    items = items_for(grids, patch_row(model.visual), seed)
    with torch.inference_mode():
        ref = model.get_image_feature(items)
    if grids == [(1, 4, 4)]:
        assert balanced_split([16], SIZE)[1] == [], "rank 1 encodes nothing and still joins the gather"
    for rank in range(SIZE):
        sharded, dp = tp2[rank][1][name, case]
        assert len(dp) == len(ref) == len(grids)
        for r, s, d in zip(ref, map(torch.from_numpy, sharded), map(torch.from_numpy, dp)):
            scale = r.abs().max().item()
            assert d.shape == r.shape
            assert (d - r).abs().max().item() <= 1e-5 * scale + 1e-6, (rank, grids)
            assert (d - s).abs().max().item() <= 1e-5 * scale + 1e-6, (rank, grids)


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("case", range(len(CASES)), ids=["no_image", "one_image", "several_sizes", "video", "one_video_split", "video_split_and_image"])
def test_dp_encoder_finishes_uint8_carriers(tp2, dirs, name, case):
    """SGLANG_MM_UINT8_PIXELS under --mm-enable-dp-encoder: the ranks' uint8 items (frame groups cut after
    finishing) give the single-rank model's features on the baseline's float32 pixels."""
    from sglang.srt.multimodal.raw_pixels import item_pixels

    grids, seed = CASES[case]
    model = get_model(dirs[name], "float32")
    u8 = uint8_items_for(grids, model.visual, model.config.vision.spatial_merge_size, seed)
    floats = items_for(grids, patch_row(model.visual), seed)
    for f, u in zip(floats, u8):
        f.feature = item_pixels(u, "cpu")
    with torch.inference_mode():
        ref = model.get_image_feature(floats)
    for rank in range(SIZE):
        dp = tp2[rank][1][name, case, "u8"]
        assert len(dp) == len(ref) == len(grids)
        for r, d in zip(ref, map(torch.from_numpy, dp)):
            assert d.shape == r.shape
            assert (d - r).abs().max().item() <= 1e-5 * r.abs().max().item() + 1e-6, (rank, grids)
