"""compute_mrope_positions vs transformers' get_rope_index (Qwen3-VL, Qwen2.5-VL, Qwen2-VL)."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.multimodal.mrope import (
    MRopeError,
    compute_mrope_positions,
    compute_text_mrope_positions,
    decode_mrope_positions,
)

transformers = pytest.importorskip("transformers")

IMG, VID, VS, VE = 151655, 151656, 151652, 151653

TEXT_CFG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def hf_models():
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    torch.manual_seed(0)
    q3 = Qwen3VLModel(
        Qwen3VLConfig(
            text_config=dict(
                TEXT_CFG,
                head_dim=16,
                rope_scaling=dict(rope_type="default", mrope_section=[4, 2, 2], mrope_interleaved=True),
            ),
            vision_config=dict(
                depth=1,
                hidden_size=32,
                intermediate_size=64,
                num_heads=2,
                out_hidden_size=64,
                deepstack_visual_indexes=[0],
                num_position_embeddings=64,
            ),
        )
    ).eval()
    q25 = Qwen2_5_VLModel(
        Qwen2_5_VLConfig(
            text_config=dict(TEXT_CFG, rope_scaling=dict(rope_type="default", mrope_section=[4, 2, 2])),
            vision_config=dict(
                depth=1,
                hidden_size=32,
                intermediate_size=64,
                num_heads=2,
                out_hidden_size=64,
                fullatt_block_indexes=[0],
                window_size=112,
                tokens_per_second=2,
            ),
        )
    ).eval()
    q2 = Qwen2VLModel(
        Qwen2VLConfig(
            text_config=dict(TEXT_CFG, rope_scaling=dict(rope_type="default", mrope_section=[4, 2, 2])),
            vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2),
        )
    ).eval()
    for m in (q3, q25, q2):
        assert m.config.image_token_id == IMG and m.config.video_token_id == VID
        assert m.config.vision_config.spatial_merge_size == 2
    return {"qwen3_vl": q3, "qwen2_5_vl": q25, "qwen2_vl": q2}


def text(n: int, base: int = 1000) -> list[int]:
    return list(range(base, base + n))


def image_block(grid, merge=2, token=IMG) -> list[int]:
    t, h, w = grid
    return [VS] + [token] * (t * h * w // merge**2) + [VE]


def hf_rope_index(model, ids, image_grids=None, video_grids=None, second_per_grid_ts=None):
    input_ids = torch.tensor([ids])
    mm = torch.zeros_like(input_ids, dtype=torch.int32)
    mm[input_ids == IMG] = 1
    mm[input_ids == VID] = 2
    kw = {}
    if second_per_grid_ts is not None:
        kw["second_per_grid_ts"] = torch.tensor(second_per_grid_ts, dtype=torch.float32)
    pos, delta = model.get_rope_index(
        input_ids,
        mm,
        image_grid_thw=torch.tensor(image_grids) if image_grids else None,
        video_grid_thw=torch.tensor(video_grids) if video_grids else None,
        **kw,
    )
    return pos[:, 0], int(delta.reshape(-1)[0])


MODEL_TYPES = ["qwen3_vl", "qwen2_5_vl", "qwen2_vl"]

IMAGE_CASES = {
    "text_only": ([text(17)], []),
    "one_image": ([text(5), (1, 8, 12), text(9)], None),
    "three_images_different_sizes": (
        [text(3), (1, 4, 6), text(2), (1, 16, 4), text(4), (1, 2, 2), text(6)],
        None,
    ),
    "image_first": ([(1, 6, 10), text(7)], None),
    "image_last": ([text(7), (1, 10, 6)], None),
    "only_image_tokens": ([(1, 2, 4)], None),
    "tall_and_wide": ([text(1), (1, 40, 2), text(1), (1, 2, 40), text(3)], None),
    "adjacent_blocks": ([text(2), (1, 4, 4), (1, 6, 2), text(2)], None),
}


def build(segments, merge=2):
    ids, grids = [], []
    for seg in segments:
        if isinstance(seg, tuple):
            ids += image_block(seg, merge)
            grids.append(seg)
        else:
            ids += seg
    return ids, grids


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("case", list(IMAGE_CASES))
def test_images_match_get_rope_index(hf_models, model_type, case):
    segments, _ = IMAGE_CASES[case]
    ids, grids = build(segments)
    ref_pos, ref_delta = hf_rope_index(hf_models[model_type], ids, grids or None)
    pos, delta = compute_mrope_positions(
        ids, grids, 2, IMG, VID, VS, model_type=model_type, tokens_per_second=2
    )
    assert pos.dtype == torch.int64 and pos.shape == (3, len(ids))
    assert torch.equal(pos, ref_pos)
    assert delta == ref_delta


def test_text_only_is_arange():
    pos, delta = compute_mrope_positions(text(10), [], 2)
    assert torch.equal(pos, torch.arange(10).expand(3, -1)) and delta == 0
    assert torch.equal(compute_text_mrope_positions(10), pos)


def test_image_positions_by_hand():
    ids = text(2) + [IMG] * 6 + text(2)  # grid (1, 4, 6) -> merged 2 x 3
    pos, delta = compute_mrope_positions(ids, [(1, 4, 6)], 2, model_type="qwen3_vl")
    assert pos[0].tolist() == [0, 1, 2, 2, 2, 2, 2, 2, 5, 6]
    assert pos[1].tolist() == [0, 1, 2, 2, 2, 3, 3, 3, 5, 6]
    assert pos[2].tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5, 6]
    assert delta == 7 - 10


def test_adjacent_images_split_by_grid_size():
    ids = text(1) + [IMG] * 4 + [IMG] * 3 + text(1)  # (1,4,4) then (1,6,2) back to back
    pos, _ = compute_mrope_positions(ids, [(1, 4, 4), (1, 6, 2)], 2)
    a, _ = compute_mrope_positions(text(1) + [IMG] * 4, [(1, 4, 4)], 2)
    assert torch.equal(pos[:, :5], a)
    assert pos[:, 5].tolist() == [3, 3, 3]  # second image starts where the first ends (1 + 2)


@pytest.mark.parametrize("seconds", [None, [1.0], [0.5], [0.083], [1.7]])
def test_qwen25_video_matches(hf_models, seconds):
    grid = (4, 4, 6)
    ids = text(3) + image_block(grid, token=VID) + text(4) + image_block((1, 6, 4)) + text(2)
    ref_pos, ref_delta = hf_rope_index(hf_models["qwen2_5_vl"], ids, [(1, 6, 4)], [grid], seconds)
    pos, delta = compute_mrope_positions(
        ids,
        [(1, 6, 4)],
        2,
        model_type="qwen2_5_vl",
        tokens_per_second=2,
        second_per_grid_ts=seconds,
        video_grid_thw=[grid],
    )
    assert torch.equal(pos, ref_pos) and delta == ref_delta


def test_qwen2_vl_video_matches(hf_models):
    grid = (3, 4, 4)
    ids = text(3) + image_block(grid, token=VID) + text(4)
    ref_pos, ref_delta = hf_rope_index(hf_models["qwen2_vl"], ids, None, [grid])
    pos, delta = compute_mrope_positions(ids, None, 2, model_type="qwen2_vl", video_grid_thw=[grid])
    assert torch.equal(pos, ref_pos) and delta == ref_delta


def test_qwen3_video_frames_match(hf_models):
    # Qwen3-VL: each frame is its own <vision_start> block preceded by a timestamp text.
    grid = (3, 4, 6)
    ids = text(2)
    for f in range(3):
        ids += text(4, base=2000 + 10 * f) + image_block((1, 4, 6), token=VID)
    ids += text(3) + image_block((1, 2, 8)) + text(1)
    ref_pos, ref_delta = hf_rope_index(hf_models["qwen3_vl"], ids, [(1, 2, 8)], [grid])
    pos, delta = compute_mrope_positions(ids, [(1, 2, 8)], 2, model_type="qwen3_vl", video_grid_thw=[grid])
    assert torch.equal(pos, ref_pos) and delta == ref_delta


def test_legacy_max_rule_for_long_videos():
    grid = (6, 2, 2)  # merged 1x1 per frame, temporal extent >> spatial
    ids = text(2) + [VID] * 6 + text(2)
    hf5, _ = compute_mrope_positions(
        ids, None, 2, model_type="qwen2_5_vl", tokens_per_second=2, video_grid_thw=[grid]
    )
    legacy, delta = compute_mrope_positions(
        ids, None, 2, model_type="qwen2_5_vl", tokens_per_second=2, video_grid_thw=[grid],
        text_start_after_vision="max",
    )
    assert hf5[0, 2:8].tolist() == [2, 4, 6, 8, 10, 12]
    assert hf5[:, 8].tolist() == [3, 3, 3]  # transformers 5.x: start + max(h, w) // merge
    assert legacy[:, 8].tolist() == [13, 13, 13]  # 4.x / original Qwen: max + 1
    assert torch.equal(hf5[:, :8], legacy[:, :8])


def test_decode_positions_follow_delta(hf_models):
    """Decode positions == transformers' compute_3d_position_ids on the incremental path."""
    ids, grids = build(IMAGE_CASES["three_images_different_sizes"][0])
    _, delta = compute_mrope_positions(ids, grids, 2, model_type="qwen3_vl")
    n = len(ids)
    d = decode_mrope_positions(n, delta)
    assert d.shape == (3, 1) and d.dtype == torch.int64
    assert d[:, 0].tolist() == [n + delta] * 3
    d3 = decode_mrope_positions(n + 5, delta, num_new_tokens=3)
    assert d3.tolist() == [[n + 5 + delta + i for i in range(3)]] * 3

    model = hf_models["qwen3_vl"]
    _, ref_delta = hf_rope_index(model, ids, grids)
    model.rope_deltas = torch.tensor([[ref_delta]])

    class _KV:
        def get_seq_length(self):
            return n

    ref = model.compute_3d_position_ids(
        input_ids=torch.tensor([[1]]),
        inputs_embeds=torch.zeros(1, 1, 64),
        image_grid_thw=None,
        past_key_values=_KV(),
    )
    assert ref[:, 0, 0].tolist() == d[:, 0].tolist()
    # and the first decode position is exactly one past the prompt's max position
    pos, _ = compute_mrope_positions(ids, grids, 2, model_type="qwen3_vl")
    assert int(pos.max()) + 1 == n + delta


def test_accepts_tensor_and_numpy_inputs():
    import numpy as np

    ids, grids = build(IMAGE_CASES["one_image"][0])
    a, da = compute_mrope_positions(ids, grids, 2)
    b, db = compute_mrope_positions(torch.tensor(ids), torch.tensor(grids), 2)
    c, dc = compute_mrope_positions(np.array(ids), np.array(grids), 2)
    assert torch.equal(a, b) and torch.equal(a, c) and da == db == dc


def test_mismatch_errors():
    with pytest.raises(MRopeError, match="needs 6 placeholder tokens"):
        compute_mrope_positions(text(2) + [IMG] * 5 + text(1), [(1, 4, 6)], 2)
    with pytest.raises(MRopeError, match="more image placeholder tokens than images"):
        compute_mrope_positions(text(2) + [IMG] * 7 + text(1), [(1, 4, 6)], 2)
    with pytest.raises(MRopeError, match="2 image grid"):
        compute_mrope_positions(text(2) + [IMG] * 6, [(1, 4, 6), (1, 2, 2)], 2)
    with pytest.raises(MRopeError, match="not divisible"):
        compute_mrope_positions([IMG] * 3, [(1, 3, 4)], 2)
    with pytest.raises(MRopeError, match="unsupported model_type"):
        compute_mrope_positions(text(3), [], 2, model_type="llama")
