"""--mm-enable-dp-encoder actually splits the images: on rank 0 of a TP=2 model built with the flag, the
vision tower runs over rank 0's share of the patches only (not all of them, as a rank of a replicated
tower that skipped the split would), and the embeddings come back through the one all-gather. One
process: the group is rank 0 of two, and the all-gather is stood in for (each part gets this rank's
rows), so only the rows dealt to this rank are compared with the single-rank model."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed import dp_encoder
from sglang.srt.distributed.dp_encoder import balanced_split
from sglang.srt.distributed.parallel_state import TPInfo
from sglang.srt.model_loader.loader import get_model
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem

GRIDS = [(1, 4, 4), (1, 8, 6), (1, 2, 2), (1, 6, 10)]


def _items(row: int) -> list:
    g = torch.Generator().manual_seed(0)
    return [MultimodalDataItem(modality=Modality.IMAGE, feature=torch.randn(t * h * w, row, generator=g),
                               image_grid_thw=(t, h, w)) for t, h, w in GRIDS]


@pytest.mark.parametrize("preset", ["qwen3-vl-tiny", "qwen2.5-vl-tiny", "qwen3.5-tiny"])
def test_dp_encoder_runs_only_this_ranks_share(tiny_model_dir, monkeypatch, preset):
    path = str(tiny_model_dir(preset))
    single = get_model(path, "float32")
    model = get_model(path, "float32", tp=TPInfo(rank=0, size=2), vit=ViTStrategy(dp_encoder=True))
    assert model.vision_dp is not None and model.vision_dp.size == 2
    shape = model.visual.patch_embed.shape
    items = _items(shape[0] * shape[1] * shape[2] * shape[3])

    gathers = []

    def all_gather(parts, tensor, group=None):  # rank 1 stood in for: every part gets this rank's rows
        gathers.append(tensor.shape[0])
        for p in parts:
            p.copy_(tensor)

    monkeypatch.setattr(dp_encoder.dist, "all_gather", all_gather)
    seen = []
    model.visual.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[0]))
    with torch.inference_mode():
        ref = single.get_image_feature(items)
        out = model.get_image_feature(items)

    costs = [t * h * w for t, h, w in GRIDS]
    mine = balanced_split(costs, 2)[0]
    assert 0 < len(mine) < len(GRIDS)
    assert sum(seen) == sum(costs[i] for i in mine) < sum(costs), "rank 0 ran the tower over more than its share"
    assert len(gathers) == 1, "the embeddings did not come back through the all-gather"
    assert len(out) == len(GRIDS)
    for i in mine:
        assert out[i].shape == ref[i].shape
        assert (out[i] - ref[i]).abs().max().item() <= 1e-5 * ref[i].abs().max().item() + 1e-6
