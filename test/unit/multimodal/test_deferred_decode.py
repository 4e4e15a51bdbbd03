"""SGLANG_GPU_IMAGE_DECODE: JPEGs sized from the header in the tokenizer, decoded where the vision tower
runs. On CPU the deferred PIL decode gives the baseline's pixel_values bit for bit; fallbacks (non-JPEG,
progressive, CMYK, images the full path refuses) take today's path with today's errors; the hash covers
the bytes and the grid; the device pipeline (run here on CPU tensors) stays within one uint8 level."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.multimodal import deferred_decode as dd
from sglang.srt.multimodal.hashing import feature_hash, item_hash
from sglang.srt.multimodal.image_io import ImageLoadError
from sglang.srt.multimodal.mm_types import EncodedImage, Modality, MultimodalDataItem
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor

IMG = 151655
QWEN3 = QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                             min_pixels=64 * 64, max_pixels=512 * 512)


def make_card(w: int, h: int, seed: int = 0) -> np.ndarray:
    """Photographic-like card: smooth colour gradients, a few hard-edged shapes, sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1),
                    127 + 100 * np.sin(x / 17.0 + y / 23.0)], axis=-1)
    for _ in range(4):
        cx, cy, r = rng.integers(0, w), rng.integers(0, h), rng.integers(4, max(5, min(w, h) // 3))
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.integers(0, 256, 3)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg_bytes(w, h, seed=0, subsampling=2, orientation=None, gray=False, **save) -> bytes:
    im = Image.fromarray(make_card(w, h, seed))
    if gray:
        im = im.convert("L")
    if orientation is not None:
        ex = Image.Exif()
        ex[0x0112] = orientation
        save["exif"] = ex.tobytes()
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90, subsampling=subsampling, **save)
    return buf.getvalue()


def processors():
    base = QwenVLProcessor(None, QWEN3)
    deferred = QwenVLProcessor(None, QWEN3)
    deferred.deferred_jpeg = True
    return base, deferred


def run(proc, images):
    return proc.process([1, IMG, 2] * len(images), images)


CASES = [(96, 64, 2, None, False), (333, 121, 0, 6, False), (640, 480, 2, 3, False), (50, 700, 1, 8, True),
         (257, 255, 0, 5, False)]


@pytest.mark.parametrize("w,h,ss,orient,gray", CASES)
def test_deferred_pil_decode_is_bit_identical(w, h, ss, orient, gray):
    base, deferred = processors()
    data = jpeg_bytes(w, h, subsampling=ss, orientation=orient, gray=gray)
    ids0, mm0 = run(base, [data])
    ids1, mm1 = run(deferred, [data])
    assert ids0 == ids1 and torch.equal(mm0.mrope_positions, mm1.mrope_positions)
    enc = mm1.mm_items[0].feature
    assert isinstance(enc, EncodedImage) and enc.data == data
    assert mm1.mm_items[0].image_grid_thw == mm0.mm_items[0].image_grid_thw == enc.grid_thw
    pixels = dd.materialize_pixels(mm1.mm_items, "cpu")
    assert pixels.dtype == torch.float32 and torch.equal(pixels, mm0.mm_items[0].feature)


def test_mixed_batch_keeps_item_order_and_base64_sources():
    import base64

    base, deferred = processors()
    png = io.BytesIO()
    Image.fromarray(make_card(80, 90, 3)).save(png, "PNG")
    images = [jpeg_bytes(200, 100, 1), png.getvalue(), "data:image/jpeg;base64," + base64.b64encode(
        jpeg_bytes(120, 300, 2)).decode()]
    _, mm0 = run(base, images)
    _, mm1 = run(deferred, images)
    kinds = [type(it.feature).__name__ for it in mm1.mm_items]
    assert kinds == ["EncodedImage", "Tensor", "EncodedImage"]
    want = torch.cat([it.feature for it in mm0.mm_items])
    assert torch.equal(dd.materialize_pixels(mm1.mm_items, "cpu"), want)


def test_fallbacks_are_counted_and_take_todays_path():
    dd.reset_stats()
    base, deferred = processors()
    cmyk = io.BytesIO()
    Image.fromarray(make_card(64, 64)).convert("CMYK").save(cmyk, "JPEG")
    png = io.BytesIO()
    Image.fromarray(make_card(64, 64)).save(png, "PNG")
    images = [jpeg_bytes(100, 80, progressive=True), cmyk.getvalue(), png.getvalue()]
    _, mm0 = run(base, images)
    _, mm1 = run(deferred, images)
    for a, b in zip(mm0.mm_items, mm1.mm_items):
        assert isinstance(b.feature, torch.Tensor) and torch.equal(a.feature, b.feature)
    s = dd.stats()
    assert s["progressive"] == 1 and s["CMYK/YCCK"] == 1 and s["not a JPEG"] == 1 and "deferred" not in s


def test_errors_are_todays_errors():
    big = jpeg_bytes(300, 200)
    for proc_kwargs, data in (({"max_image_pixels": 300 * 200 - 1}, big),
                              ({}, jpeg_bytes(800, 3)),  # aspect ratio > 200
                              ({}, big[: len(big) // 2])):  # truncated
        msgs = []
        for deferred in (False, True):
            proc = QwenVLProcessor(None, QWEN3, **proc_kwargs)
            proc.deferred_jpeg = deferred
            with pytest.raises(ImageLoadError) as e:
                run(proc, [data])
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1]


def test_hash_covers_bytes_and_grid_and_pickles_small():
    data = jpeg_bytes(640, 480)
    enc = dd.defer_jpeg(data, QWEN3, None)
    other_grid = dd.defer_jpeg(data, QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3,
                                                          image_std=(0.5,) * 3, max_pixels=256 * 256), None)
    other_bytes = dd.defer_jpeg(jpeg_bytes(640, 480, seed=1), QWEN3, None)
    assert enc.grid_thw != other_grid.grid_thw
    for algo in ("xxh3_128", "blake3", "sha256"):
        h = feature_hash(enc, algo)
        assert h == feature_hash(pickle.loads(pickle.dumps(enc)), algo)
        assert h != feature_hash(other_grid, algo) and h != feature_hash(other_bytes, algo)
    item = MultimodalDataItem(Modality.IMAGE, feature=enc, image_grid_thw=enc.grid_thw)
    assert item_hash(item) == feature_hash(enc)
    wire = len(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
    pixels = dd.pil_pixels(enc)
    assert wire < len(data) + 1024 and wire * 10 < pixels.numel() * 4
    back = pickle.loads(pickle.dumps(enc))
    assert back.processor == QWEN3 and np.array_equal(back.processor._lut, QWEN3._lut)


def test_switch_resolution(monkeypatch):
    for raw, device, tv, want in (("0", "cuda", True, False), ("1", "cpu", False, True),
                                  ("auto", "cpu", True, False), ("auto", "cuda", False, False),
                                  ("auto", "cuda", True, True)):
        monkeypatch.setenv("SGLANG_GPU_IMAGE_DECODE", raw)
        monkeypatch.setattr(dd, "torchvision_available", lambda tv=tv: tv)
        assert dd.deferred_decode_enabled(device) is want, (raw, device, tv)
    monkeypatch.delenv("SGLANG_GPU_IMAGE_DECODE")
    assert dd.deferred_decode_enabled("cpu") is False  # auto on a CPU model: baseline
    assert QwenVLProcessor(None, QWEN3).deferred_jpeg is False


def test_corrupt_scan_data_gives_a_blank_image_not_a_crash():
    data = bytearray(jpeg_bytes(128, 128))
    enc = dd.defer_jpeg(bytes(data), QWEN3, None)
    sos = data.find(b"\xff\xda")
    enc.data = bytes(data[: sos + 30]) + b"\xff\xd9"  # scan cut short, EOI kept
    out = dd.pil_pixels(enc)
    t, gh, gw = enc.grid_thw
    assert out.shape == (gh * gw, 3 * 2 * 16 * 16)


@pytest.mark.parametrize("orient", range(1, 9))
@pytest.mark.parametrize("ss", [0, 2])
def test_device_pipeline_on_cpu_within_one_level_of_pil(orient, ss):
    """The post-decode half of the nvJPEG path (orient, two-pass resize, LUT, patchify) fed with PIL's
    own decode: what is left is PIL's fixed-point resize rounding (one level) and, for a few shape
    pairs, its pass order (see `resize_like_pil`): at most 2 levels, mean under 0.3 level."""
    data = jpeg_bytes(301, 187, seed=orient, subsampling=ss, orientation=orient)
    enc = dd.defer_jpeg(data, QWEN3, None)
    raw = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy()).permute(2, 0, 1)
    got = dd.device_pixels(raw, enc, "cpu")
    want = dd.pil_pixels(enc)
    diff = (got - want).abs()
    level = 1 / 255 / 0.5
    assert got.shape == want.shape and diff.max() <= 2 * level + 1e-6 and diff.mean() < 0.3 * level


def test_device_pipeline_patchify_is_exact_without_resize():
    cfg = QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                               min_pixels=64 * 64, max_pixels=4096 * 4096)
    data = jpeg_bytes(256, 192, subsampling=0)
    enc = dd.defer_jpeg(data, cfg, None)
    assert enc.target_hw == (192, 256)
    raw = torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy()).permute(2, 0, 1)
    assert torch.equal(dd.device_pixels(raw, enc, "cpu"), dd.pil_pixels(enc))


@pytest.mark.gpu
@pytest.mark.parametrize("ss", [0, 2])
def test_nvjpeg_close_to_pil(ss):
    """nvJPEG's chroma upsampling differs from libjpeg's (upstream sglang issue 34163): bounded here.
    Tolerance: mean |diff| <= 2 uint8 levels, PSNR >= 30 dB (over the [-1, 1] range)."""
    pytest.importorskip("torchvision")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    encs = [dd.defer_jpeg(jpeg_bytes(960, 1280, seed=k, subsampling=ss, orientation=1 + k % 8), QWEN3, None)
            for k in range(4)]
    dd.reset_stats()
    gpu = dd.decode_images(encs, "cuda")
    assert dd.stats().get("decoded nvjpeg") == len(encs)
    level = 1 / 255 / 0.5
    for enc, g in zip(encs, gpu):
        ref = dd.pil_pixels(enc)
        d = (g.cpu() - ref).abs()
        psnr = 10 * torch.log10(4 / (d**2).mean())
        assert d.mean() <= 2 * level and psnr >= 30, (d.mean().item(), psnr.item())


def test_an_undecodable_item_is_marked_and_its_request_gets_the_reason():
    from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs

    data = bytearray(jpeg_bytes(128, 128))
    good, bad = dd.defer_jpeg(bytes(data), QWEN3, None), dd.defer_jpeg(bytes(data), QWEN3, None)
    mid = (data.find(b"\xff\xda") + len(data)) // 2
    bad.data = bytes(data[:mid]) + b"\xff\xc4\x00\x05\x77\x00\x00" + bytes(data[mid:])  # a bogus table in the scan
    items = [MultimodalDataItem(Modality.IMAGE, feature=good), MultimodalDataItem(Modality.IMAGE, feature=bad)]
    pixels = dd.materialize_pixels(items, "cpu")
    t, gh, gw = bad.grid_thw
    assert pixels.shape[0] == 2 * gh * gw and float(pixels[gh * gw:].abs().sum()) == 0.0  # the blank stand-in
    assert items[0].decode_error is None and items[1].decode_error
    assert dd.decode_failure(MultimodalInputs(mm_items=items)).startswith("image 1 could not be decoded")
    assert dd.decode_failure(MultimodalInputs(mm_items=items[:1])) is None
