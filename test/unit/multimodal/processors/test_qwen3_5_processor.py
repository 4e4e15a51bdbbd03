"""The server's processor for Qwen3.5 checkpoints: looked up by architecture and model type, it reads the
Qwen3.5 special ids from config.json and places images as transformers' Qwen3.5 rope index does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.multimodal.processors.base import get_processor_class

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("preset", ["qwen3.5-tiny", "qwen3.5-moe-tiny"])
def test_processor_from_the_checkpoint_matches_transformers_rope_index(tiny_model_dir, preset):
    import json

    path = tiny_model_dir(preset)
    cfg = json.loads((path / "config.json").read_text())
    cls = get_processor_class(cfg["architectures"], cfg["model_type"])
    assert cls is get_processor_class(None, cfg["model_type"])
    proc = cls.from_pretrained(str(path))
    assert (proc.image_token_id, proc.vision_start_token_id, proc.vision_end_token_id) == (
        cfg["image_token_id"], cfg["vision_start_token_id"], cfg["vision_end_token_id"]) == (248056, 248053, 248054)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in ((96, 64), (64, 128))]
    slot = [248053, 248056, 248054]
    ids, mm = proc.process([11, 12] + slot + [13] * 4 + slot + [14, 15], images)
    ref = transformers.AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32)
    t = torch.tensor([ids])
    grids = torch.tensor([list(it.image_grid_thw) for it in mm.mm_items])
    want, delta = ref.model.get_rope_index(t, (t == 248056).int(), image_grid_thw=grids)
    assert torch.equal(torch.as_tensor(mm.mrope_positions), want[:, 0])
    assert int(mm.mrope_position_delta) == int(delta.reshape(-1)[0])
