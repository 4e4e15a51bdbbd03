"""SGLANG_VIT_FAST_POS_EMBED: cached bilinear taps and rotary indices equal the baseline's per-forward
computation (Qwen3VisionTransformer.interpolated_pos_embed, rot_pos_ids + cos_sin), the caches stay
within their bound, and the Triton kernel gives the same result through the same path."""

from __future__ import annotations

import pytest
import torch
from vit_pos_reference import vit_pair

from sglang.srt.layers.vision_blocks import rot_pos_ids
from sglang.srt.layers.vision_pos_embed import GridLRU, bilinear_taps

GRIDS = {
    "one_window": [(1, 2, 2)],
    "seed_image": [(1, 80, 60)],
    "strip_one_window_high": [(1, 2, 64)],
    "strip_one_window_wide": [(1, 64, 2)],
    "larger_than_table": [(1, 100, 130)],
    "frames_and_mixed": [(2, 6, 4), (1, 2, 96), (3, 10, 14), (1, 6, 4)],
}


@pytest.fixture(scope="module")
def pair():
    return vit_pair()


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_pos_embed_equals_baseline_float32(pair, name):
    base, fast = pair
    grid = GRIDS[name]
    ref = base.pos_embeds(grid, torch.float32)
    out = fast.pos_embeds(grid, torch.float32)
    assert out.shape == ref.shape == (sum(t * h * w for t, h, w in grid), 32)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("h,w", [(1, 1), (1, 7), (9, 1), (48, 48), (50, 3)])
def test_taps_reproduce_the_baseline_bit_for_bit(h, w):
    """merge=1 allows 1-wide strips; the taps summed in the baseline's order give its exact values."""
    side = 48
    table = torch.randn(side * side, 16)
    idx, wts = bilinear_taps(h, w, side, merge=1)
    assert idx.dtype == torch.int32 and wts.dtype == torch.float32 and idx.shape == (h * w, 4)
    assert int(idx.min()) >= 0 and int(idx.max()) < side * side
    torch.testing.assert_close(wts.sum(1), torch.ones(h * w), rtol=0, atol=1e-6)
    out = sum(table[idx[:, k].long()] * wts[:, k : k + 1] for k in range(4))
    hs, ws = torch.linspace(0, side - 1, h), torch.linspace(0, side - 1, w)
    h0, w0 = hs.floor().long(), ws.floor().long()
    h1, w1 = (h0 + 1).clamp(max=side - 1), (w0 + 1).clamp(max=side - 1)
    dh, dw = (hs - h0)[:, None], (ws - w0)[None, :]
    ref = (
        table[(h0[:, None] * side + w0[None, :]).flatten()] * ((1 - dh) * (1 - dw)).reshape(-1, 1)
        + table[(h0[:, None] * side + w1[None, :]).flatten()] * ((1 - dh) * dw).reshape(-1, 1)
        + table[(h1[:, None] * side + w0[None, :]).flatten()] * (dh * (1 - dw)).reshape(-1, 1)
        + table[(h1[:, None] * side + w1[None, :]).flatten()] * (dh * dw).reshape(-1, 1)
    )
    assert torch.equal(out, ref)


def test_bfloat16_table_rounds_once_like_the_baseline():
    base, fast = vit_pair(dtype=torch.bfloat16)
    grid = [(1, 12, 20), (2, 4, 4)]
    ref, out = base.pos_embeds(grid, torch.bfloat16), fast.pos_embeds(grid, torch.bfloat16)
    assert out.dtype == ref.dtype == torch.bfloat16
    # both blend in float32 and round to bf16 once: at most one bf16 ulp apart
    torch.testing.assert_close(out.float(), ref.float(), rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_rotary_equals_baseline(pair, name):
    base, fast = pair
    grid = GRIDS[name]
    ref_cos, ref_sin = base.rotary_cos_sin(grid, torch.device("cpu"))
    cos, sin = fast.rotary_cos_sin(grid, torch.device("cpu"))
    assert cos.shape == ref_cos.shape == (sum(t * h * w for t, h, w in grid), 16)
    assert cos.dtype == sin.dtype == torch.float32
    torch.testing.assert_close(cos, ref_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, ref_sin, rtol=0, atol=1e-6)


def test_rotary_table_grows_for_larger_grids(pair):
    _, fast = pair
    fast.rotary_cos_sin([(1, 4, 4)], torch.device("cpu"))
    small = fast.rotary_ids.table(1, torch.device("cpu"))[0].shape[0]
    cos, _ = fast.rotary_cos_sin([(1, 2, 2 * small)], torch.device("cpu"))
    assert fast.rotary_ids.table(1, torch.device("cpu"))[0].shape[0] >= 2 * small
    ref = fast.rotary.cos_sin(rot_pos_ids([(1, 2, 2 * small)], 2))[0]
    torch.testing.assert_close(cos, ref, rtol=0, atol=1e-6)


def test_second_forward_only_hits_the_cache():
    _, fast = vit_pair()
    grid = [(1, 8, 6), (2, 4, 4), (1, 8, 6)]
    first = fast.pos_embeds(grid, torch.float32), fast.rotary_cos_sin(grid, torch.device("cpu"))
    misses = fast.pos_interp.cache.misses, fast.rotary_ids.cache.misses
    assert misses == (2, 2)  # two distinct (h, w) shapes, whatever t and repetition
    second = fast.pos_embeds(grid, torch.float32), fast.rotary_cos_sin(grid, torch.device("cpu"))
    assert (fast.pos_interp.cache.misses, fast.rotary_ids.cache.misses) == misses
    assert torch.equal(first[0], second[0]) and torch.equal(first[1][0], second[1][0])


def test_grid_lru_is_bounded_and_evicts_least_recent():
    lru = GridLRU(max_bytes=3 * 400)  # room for three 100-float entries

    def entry(v):
        return lambda: (torch.full((100,), float(v)),)

    for k in range(3):
        lru.get((k,), entry(k))
    lru.get((0,), entry(-1))  # touch 0: 1 is now the least recent
    lru.get((3,), entry(3))
    assert (1,) not in lru and all((k,) in lru for k in (0, 2, 3))
    assert lru.nbytes <= lru.max_bytes and len(lru) == 3
    assert lru.get((0,), entry(-1))[0][0] == 0  # cached value, not rebuilt
    assert (lru.hits, lru.misses) == (2, 4)


def test_grid_lru_returns_but_does_not_keep_an_oversized_entry():
    """ByteBoundedLRU's one rule: a value larger than the whole budget is never stored (and evicts nothing)."""
    lru = GridLRU(max_bytes=100)
    lru.get(("small",), lambda: (torch.zeros(10),))
    big = lru.get(("big",), lambda: (torch.zeros(1000),))
    assert big[0].numel() == 1000  # built and returned to the caller
    assert len(lru) == 1 and ("big",) not in lru and ("small",) in lru and lru.rejected == 1


def test_triton_kernel_through_the_layer_under_the_interpreter(pair):
    pytest.importorskip("triton")
    from sgl_kernel.testing import interpreted

    base, fast = pair
    grid = GRIDS["frames_and_mixed"]
    with interpreted("sgl_kernel.vision._pos_embed_triton"):
        fast.pos_interp.backend = "triton"
        try:
            out = fast.pos_embeds(grid, torch.float32)
        finally:
            fast.pos_interp.backend = "auto"
    torch.testing.assert_close(out, base.pos_embeds(grid, torch.float32), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_fast_path_equals_baseline(dtype):
    base, fast = (m.cuda() for m in vit_pair(dtype=dtype))
    dev = torch.device("cuda")
    for grid in GRIDS.values():
        ref, out = base.pos_embeds(grid, dtype), fast.pos_embeds(grid, dtype)
        tol = 1e-5 if dtype == torch.float32 else 2**-7
        torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=1e-5)
        for a, b in zip(fast.rotary_cos_sin(grid, dev), base.rotary_cos_sin(grid, dev)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
