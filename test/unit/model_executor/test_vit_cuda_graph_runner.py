"""ViT CUDA graphs at token budgets: buckets, padded segments, and the padded forward equal to the tower's
own on CPU (the capture itself runs on CUDA only: the gpu-marked case)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from sglang.srt.layers.attention.vision_attention import VisionSegments, packed_attention, varlen_packed_attention
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
from sglang.srt.model_executor.vit_cuda_graph_runner import (
    DEFAULT_BUCKETS,
    PAD_PIECE,
    ViTCudaGraphRunner,
    padded_segments,
    pick_bucket,
    segment_slots,
    token_buckets,
)

GRIDS = {
    "one_image": [(1, 4, 6)],
    "mixed_images": [(1, 4, 4), (1, 8, 6), (1, 2, 2)],
    "video_and_image": [(3, 4, 4), (1, 6, 4)],
}


def test_buckets_round_up_to_the_merge_window_sorted_and_unique():
    assert token_buckets("10,4,3", 4) == (4, 12)
    assert token_buckets(None, 4) == DEFAULT_BUCKETS
    with pytest.raises(ValueError, match="positive"):
        token_buckets("0,8", 4)


def test_pick_bucket_takes_the_smallest_that_holds_the_batch():
    assert [pick_bucket(n, (8, 16)) for n in (1, 8, 9, 16, 17)] == [8, 8, 16, 16, None]


def test_padded_segments_keep_the_real_ones_and_isolate_the_padding():
    assert padded_segments([0, 4, 10], 16, 5) == [0, 4, 10, 16, 16, 16]
    assert padded_segments([0, 16], 16, 3) == [0, 16, 16, 16]  # no padding rows: no padding segment
    # long padding in pieces: attention over padding stays linear in its length
    assert padded_segments([0, 100], 100 + 2 * PAD_PIECE + 8, 5) == [
        0, 100, 100 + PAD_PIECE, 100 + 2 * PAD_PIECE, 108 + 2 * PAD_PIECE, 108 + 2 * PAD_PIECE]
    assert segment_slots(1024, 64) == 64 + 1024 // PAD_PIECE
    with pytest.raises(ValueError, match="exceed"):
        padded_segments([0, 1, 2, 3], 8, 3)


@pytest.fixture(scope="module")
def tower(tiny_model_dir):
    runner = ModelRunner(ModelRunnerConfig(model_path=str(tiny_model_dir("qwen3-vl-tiny")), dtype="float32",
                                           max_total_tokens=256, max_running_requests=2, context_length=256))
    return runner.model.visual


def _pixels(tower, grid, seed):
    n = sum(t * h * w for t, h, w in grid)
    width = tower.cfg.in_channels * tower.cfg.temporal_patch_size * tower.cfg.patch_size**2
    return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", sorted(GRIDS))
def test_padded_forward_equals_the_tower(tower, case):
    grid = GRIDS[case]
    px = _pixels(tower, grid, seed=len(case))
    with torch.no_grad():
        want = tower(px, grid)
        runner = ViTCudaGraphRunner(tower, token_buckets("64,256", tower.merge**2), max_segments=8, capture=False)
        got = runner(px, grid)
        again = runner(px, grid)  # the bucket's buffers reused: stale rows from the last batch must not leak
    assert runner.replays == 2
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, want, rtol=1e-5, atol=1e-5)


def test_a_smaller_batch_after_a_larger_one_in_the_same_bucket(tower):
    runner = ViTCudaGraphRunner(tower, (256,), max_segments=8, capture=False)
    big, small = GRIDS["video_and_image"], GRIDS["one_image"]
    with torch.no_grad():
        runner(_pixels(tower, big, 1), big)
        got = runner(_pixels(tower, small, 2), small)
        want = tower(_pixels(tower, small, 2), small)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("buckets,max_segments", [((16,), 8), ((256,), 2)])
def test_batches_past_the_buckets_or_the_segment_table_run_eagerly(tower, buckets, max_segments):
    grid = GRIDS["mixed_images"]  # 68 patches, 3 segments
    runner = ViTCudaGraphRunner(tower, buckets, max_segments=max_segments, capture=False)
    px = _pixels(tower, grid, 3)
    with torch.no_grad():
        torch.testing.assert_close(runner(px, grid), tower(px, grid), rtol=0, atol=0)
    assert runner.replays == 0


_KERNEL_CHECK = """
import torch
from sglang.srt.layers.attention.vision_attention import VisionSegments, packed_attention, varlen_packed_attention
from sglang.srt.model_executor.vit_cuda_graph_runner import padded_segments
cu, bucket = [0, 16, 40, 44], 64
g = torch.Generator().manual_seed(5)
q, k, v = (torch.randn(bucket, 2, 16, generator=g) for _ in range(3))
seg = torch.tensor(padded_segments(cu, bucket, 6), dtype=torch.int32)
got = varlen_packed_attention(q, k, v, VisionSegments(seg, bucket), 0.25)
want = packed_attention(q[:44], k[:44], v[:44], cu, 0.25)
print((got[:44] - want).abs().max().item(), bool(torch.isfinite(got).all()))
"""


def test_varlen_kernel_on_padded_segments_and_a_grid_bound():
    """The captured graph's attention: device segments padded with a padding segment and empty ones, and
    max_len the whole bucket. Real rows equal the per-image SDPA on the unpadded segments. The kernel uses
    triton.language's @jit helpers, so it is interpreted in a process that sets TRITON_INTERPRET=1 first."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", _KERNEL_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    diff, finite = res.stdout.split()
    assert float(diff) < 1e-5 and finite == "True", res.stdout


def test_the_sdpa_path_refuses_device_only_segments():
    q = torch.zeros(4, 1, 8)
    with pytest.raises(ValueError, match="triton"):
        packed_attention(q, q, q, VisionSegments(torch.tensor([0, 4], dtype=torch.int32), 4), 1.0)


@pytest.mark.parametrize("name,attached", [("qwen3-vl-tiny", True), ("qwen2.5-vl-tiny", False)])
def test_the_switch_attaches_the_runner_where_the_tower_allows(tiny_model_dir, monkeypatch, caplog, name, attached):
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
    monkeypatch.setenv("SGLANG_VIT_CUDA_GRAPH_BUCKETS", "64,256")
    with caplog.at_level(logging.WARNING):
        runner = ModelRunner(ModelRunnerConfig(model_path=str(tiny_model_dir(name)), dtype="float32",
                                               max_total_tokens=256, max_running_requests=2, context_length=256))
    assert (runner.model.vit_graph is not None) is attached
    assert attached or "unused" in caplog.text
    if attached:
        assert runner.vit_graph_runner.buckets == (64, 256) and not runner.vit_graph_runner.capture


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_graphs_replay_to_the_eager_output(tiny_model_dir):
    runner = ModelRunner(ModelRunnerConfig(model_path=str(tiny_model_dir("qwen3-vl-tiny")), dtype="float32",
                                           device="cuda", max_total_tokens=256, max_running_requests=2,
                                           context_length=256, attention_fp32_precision="ieee"))
    tower = runner.model.visual
    graphs = ViTCudaGraphRunner(tower, (64, 256), max_segments=8, capture=True)
    with torch.no_grad():
        for case in sorted(GRIDS):
            grid = GRIDS[case]
            px = _pixels(tower, grid, 7).cuda()
            torch.testing.assert_close(graphs(px, grid), tower(px, grid), rtol=1e-5, atol=1e-5)
    assert graphs.replays == len(GRIDS) and all(b.graph is not None for b in graphs._bufs.values())
