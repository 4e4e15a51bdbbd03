"""SGLANG_MM_UINT8_PIXELS: the uint8 carrier (resized pixels + PixelNorm) made by the processor, finished
where the vision tower runs (`raw_pixels.item_pixels`), equals the baseline's float32 pixel values bit for
bit, for images and videos of both model families; the hash keeps the baseline's equal/unequal relation;
a carrier without its recipe (or a recipe on float pixels) is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.environ import envs
from sglang.srt.multimodal.hashing import item_hash
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, PixelNorm
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor, image_norm_table
from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
from sglang.srt.multimodal.raw_pixels import item_pixels

IMG, VID, VS, VE = 151655, 151656, 151652, 151653
FAMILIES = {"qwen3_vl": QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                                             min_pixels=4 * 32 * 32, max_pixels=64 * 32 * 32),
            "qwen2_5_vl": QwenVLImageProcessor(min_pixels=4 * 28 * 28, max_pixels=64 * 28 * 28)}


class _Tok:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 1000 for c in text]


def _procs(model_type: str) -> tuple[QwenVLProcessor, QwenVLProcessor]:
    base = QwenVLProcessor(_Tok(), FAMILIES[model_type], model_type=model_type)
    u8 = QwenVLProcessor(_Tok(), FAMILIES[model_type], model_type=model_type)
    u8.uint8_pixels = True
    return base, u8


def _image(w: int, h: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_switch_defaults_off():
    assert envs.SGLANG_MM_UINT8_PIXELS.default is False
    assert QwenVLProcessor(None, FAMILIES["qwen3_vl"]).uint8_pixels is False


@pytest.mark.parametrize("on", [False, True])
def test_request_builder_reads_the_switch_once(tiny_model_dir, monkeypatch, on):
    from sglang.srt.managers.request_builder import RequestBuilder
    from sglang.srt.server_args import ServerArgs

    path = str(tiny_model_dir("qwen3-vl-tiny"))
    monkeypatch.setenv("SGLANG_MM_UINT8_PIXELS", "1" if on else "0")
    b = RequestBuilder(ServerArgs(model_path=path, port=31977), path)
    try:
        assert b.processor.uint8_pixels is on
        monkeypatch.setenv("SGLANG_MM_UINT8_PIXELS", "0" if on else "1")  # later changes are not read
        assert b.processor.uint8_pixels is on
    finally:
        b.close()


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("size", [(96, 64), (40, 130), (600, 28), (33, 517)])
def test_image_carrier_finishes_to_the_baseline_bit_for_bit(model_type, size):
    base, u8 = _procs(model_type)
    ids = [1, VS, IMG, VE, 2]
    img = _image(*size, seed=size[0])
    b_ids, b = base.process(ids, [img])
    u_ids, u = u8.process(ids, [img])
    assert b_ids == u_ids and torch.equal(b.mrope_positions, u.mrope_positions)
    bi, ui = b.mm_items[0], u.mm_items[0]
    assert bi.pixel_norm is None and ui.pixel_norm == PixelNorm.of("image", FAMILIES[model_type])
    t, gh, gw = ui.image_grid_thw
    p = FAMILIES[model_type].patch_size
    assert ui.feature.dtype == torch.uint8 and tuple(ui.feature.shape) == (gh * p, gw * p, 3)
    assert ui.image_grid_thw == bi.image_grid_thw
    out = item_pixels(ui, "cpu")
    assert out.dtype == torch.float32 and torch.equal(out, bi.feature)
    # float32 patches repeat the still image over T=2: 8x the uint8 bytes
    assert bi.feature.numel() * 4 == 8 * ui.feature.numel()


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("n_frames", [2, 4, 5])
def test_video_frames_finish_to_the_baseline_bit_for_bit(model_type, n_frames):
    base, u8 = _procs(model_type)
    frames = [_image(64, 48, seed=k) for k in range(n_frames)]
    ids = [1, VS, VID, VE, 2]
    _, vcfg = base.media_config({"num_frames": n_frames} if model_type == "qwen3_vl" else {})
    b_ids, b = base.process(ids, [], videos=[frames], video_config=vcfg)
    u_ids, u = u8.process(ids, [], videos=[frames], video_config=vcfg)
    assert b_ids == u_ids and torch.equal(b.mrope_positions, u.mrope_positions)
    bi, ui = b.mm_items[0], u.mm_items[0]
    assert ui.modality == Modality.VIDEO and ui.pixel_norm.kind == "video"
    assert ui.feature.dtype == torch.uint8 and ui.feature.dim() == 4 and ui.image_grid_thw == bi.image_grid_thw
    assert torch.equal(item_pixels(ui, "cpu"), bi.feature)


def test_video_file_hashes_the_same_both_ways():
    pytest.importorskip("av")
    from sglang.testing.sample_video import make_clip

    base, u8 = _procs("qwen3_vl")
    clip = make_clip(64, 48, 8, 1.0, seed=3)
    ids = [1, VS, VID, VE, 2]
    (_, b), (_, u) = base.process(ids, [], videos=[clip]), u8.process(ids, [], videos=[clip])
    assert torch.equal(item_pixels(u.mm_items[0], "cpu"), b.mm_items[0].feature)
    for algo in ("xxh3_128", "blake3"):
        assert item_hash(b.mm_items[0], algo) == item_hash(u.mm_items[0], algo)


@pytest.mark.parametrize("algo", ["xxh3_128", "blake3", "sha256"])
def test_uint8_hash_partitions_images_as_the_baseline_does(algo):
    base, u8 = _procs("qwen3_vl")
    imgs = [_image(64, 64, 0), _image(64, 64, 0), _image(64, 64, 1), _image(96, 64, 0)]
    ids = [1] + [VS, IMG, VE] * len(imgs)
    _, b = base.process(ids, imgs)
    _, u = u8.process(ids, imgs)
    hb = [item_hash(it, algo) for it in b.mm_items]
    hu = [item_hash(it, algo) for it in u.mm_items]
    same_b = [[x == y for y in hb] for x in hb]
    same_u = [[x == y for y in hu] for x in hu]
    assert same_b == same_u and hu[0] == hu[1] and len(set(hu[1:])) == 3
    # the recipe is part of the key: other mean/std, same bytes -> another hash
    other = MultimodalDataItem(Modality.IMAGE, u.mm_items[0].feature, u.mm_items[0].image_grid_thw,
                               pixel_norm=PixelNorm.of("image", FAMILIES["qwen2_5_vl"]))
    assert item_hash(other, algo) != hu[0]


@pytest.mark.parametrize("cfg", [FAMILIES["qwen3_vl"], FAMILIES["qwen2_5_vl"],
                                 QwenVLVideoProcessor.defaults("qwen3"), QwenVLVideoProcessor.defaults("qwen2")])
def test_normalize_tables_are_injective(cfg):
    """Distinct uint8 values never meet in float32: the hash argument above relies on it."""
    from sglang.srt.multimodal.processors.video_pixels import _normalize

    if isinstance(cfg, QwenVLImageProcessor):
        table = image_norm_table(cfg)
    else:
        x = torch.arange(256, dtype=torch.uint8).view(1, 1, 1, 256).expand(1, 3, 1, 256)
        table = _normalize(x, cfg)[0, :, 0].numpy()
    assert all(len(np.unique(table[c])) == 256 for c in range(3))


def test_carrier_without_its_recipe_is_refused():
    u8 = torch.zeros(32, 32, 3, dtype=torch.uint8)
    with pytest.raises(TypeError, match="without its PixelNorm"):
        item_pixels(MultimodalDataItem(Modality.IMAGE, u8, (1, 2, 2)), "cpu")
    f32 = torch.zeros(4, 3 * 2 * 16 * 16)
    norm = PixelNorm.of("image", FAMILIES["qwen3_vl"])
    with pytest.raises(TypeError, match="needs a uint8"):
        item_pixels(MultimodalDataItem(Modality.IMAGE, f32, (1, 2, 2), pixel_norm=norm), "cpu")
    with pytest.raises(ValueError):
        PixelNorm("audio", 16, 2, 2, (0.5,) * 3, (0.5,) * 3, True, 1 / 255, True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_cuda_device_pixels_equal_the_cpu_bits(model_type):
    """On the GPU the same gather and layout: the float32 values are the CPU's bit for bit."""
    from sglang.srt.multimodal.raw_pixels import device_pixels

    base, u8 = _procs(model_type)
    frames = [_image(96, 64, seed=k) for k in range(5)]
    _, vcfg = base.media_config({"num_frames": 5} if model_type == "qwen3_vl" else {})
    _, u = u8.process([1, VS, IMG, VE, VS, VID, VE], [_image(130, 70, 9)], videos=[frames], video_config=vcfg)
    for it in u.mm_items:
        got = device_pixels(it.feature, it.pixel_norm, "cuda")
        cpu = device_pixels(it.feature, it.pixel_norm, "cpu")
        assert got.device.type == "cuda" and torch.equal(got.cpu(), cpu)
        assert torch.equal(cpu, device_pixels(it.feature, it.pixel_norm, "cpu", gather=True))
