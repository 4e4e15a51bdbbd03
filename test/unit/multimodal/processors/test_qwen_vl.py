"""QwenVLImageProcessor / QwenVLProcessor vs transformers' Qwen2VLImageProcessorPil."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.multimodal.image_io import ImageLoadError, load_image
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, MultimodalInputs
from sglang.srt.multimodal.mrope import compute_mrope_positions
from sglang.srt.multimodal.processors.base import (
    BaseMultimodalProcessor,
    MultimodalInputError,
    get_processor_class,
    is_multimodal_model,
)
from sglang.srt.multimodal.processors.qwen_vl import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    QwenVLImageProcessor,
    QwenVLProcessor,
    process_image,
)

ref_mod = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
Qwen2VLImageProcessorPil = ref_mod.Qwen2VLImageProcessorPil

IMG, VID, VS, VE = 151655, 151656, 151652, 151653

# Real preprocessor_config.json contents (Qwen3-VL / Qwen2.5-VL).
QWEN3_PP = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
QWEN25_PP = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": list(OPENAI_CLIP_MEAN),
    "image_std": list(OPENAI_CLIP_STD),
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}
# Same models with a smaller max_pixels so a moderately sized image hits the max branch.
QWEN3_SMALLMAX_PP = dict(QWEN3_PP, size={"longest_edge": 1024 * 32 * 32, "shortest_edge": 65536})
QWEN25_SMALLMAX_PP = dict(QWEN25_PP, max_pixels=512 * 28 * 28)

CONFIGS = {
    "qwen3": QWEN3_PP,
    "qwen25": QWEN25_PP,
    "qwen3_smallmax": QWEN3_SMALLMAX_PP,
    "qwen25_smallmax": QWEN25_SMALLMAX_PP,
}


def make_ref(pp: dict) -> Qwen2VLImageProcessorPil:
    if "size" in pp:
        size = dict(pp["size"])
    else:
        size = {"shortest_edge": pp["min_pixels"], "longest_edge": pp["max_pixels"]}
    return Qwen2VLImageProcessorPil(
        patch_size=pp["patch_size"],
        temporal_patch_size=pp["temporal_patch_size"],
        merge_size=pp["merge_size"],
        image_mean=list(pp["image_mean"]),
        image_std=list(pp["image_std"]),
        size=size,
    )


_REFS: dict[str, Qwen2VLImageProcessorPil] = {}
_OURS: dict[str, QwenVLImageProcessor] = {}


def get_pair(name: str):
    if name not in _REFS:
        _REFS[name] = make_ref(CONFIGS[name])
        _OURS[name] = QwenVLImageProcessor.from_dict(CONFIGS[name])
    return _REFS[name], _OURS[name]


def make_image(h: int, w: int, mode: str, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed + h * 7919 + w)
    if mode == "RGB":
        return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")
    if mode == "RGBA":
        a = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
        a[: h // 3, :, 3] = 0  # fully transparent band
        a[h // 3 : 2 * h // 3, :, 3] = 255
        return Image.fromarray(a, "RGBA")
    if mode == "L":
        return Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L")
    if mode == "LA":
        return Image.fromarray(rng.integers(0, 256, (h, w, 2), dtype=np.uint8), "LA")
    if mode == "P":
        return make_image(h, w, "RGB", seed).quantize(colors=64)
    if mode == "P_transparent":
        im = make_image(h, w, "RGB", seed).quantize(colors=16)
        im.info["transparency"] = 3
        return im
    if mode == "CMYK_JPEG":
        cmyk = Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "CMYK")
        buf = io.BytesIO()
        cmyk.save(buf, format="JPEG", quality=90)
        im = Image.open(io.BytesIO(buf.getvalue()))
        im.load()
        assert im.mode == "CMYK"
        return im
    if mode == "I;16":
        a = rng.integers(0, 65536, (h, w), dtype=np.uint16)
        a[0, :] = rng.integers(0, 256, w)  # some values below 256
        im = Image.fromarray(a)
        assert im.mode == "I;16"
        return im
    if mode == "1":
        return make_image(h, w, "L", seed).convert("1")
    raise ValueError(mode)


SIZES = [(64, 64), (100, 37), (37, 100), (57, 91), (28, 600), (1, 1), (15, 2000), (443, 311)]
MODES = ["RGB", "RGBA", "L", "LA", "P", "P_transparent", "CMYK_JPEG", "I;16", "1"]


def assert_matches_ref(name: str, images: list[Image.Image]):
    ref, ours = get_pair(name)
    r = ref(images=[im.copy() for im in images], return_tensors="np")
    o = ours([im.copy() for im in images])
    assert o["pixel_values"].dtype == np.float32
    np.testing.assert_array_equal(o["image_grid_thw"], r["image_grid_thw"])
    assert o["pixel_values"].shape == r["pixel_values"].shape
    diff = np.abs(o["pixel_values"] - r["pixel_values"].astype(np.float32)).max()
    assert diff <= 1e-5, diff


@pytest.mark.parametrize("name", ["qwen3", "qwen25"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("hw", SIZES, ids=lambda hw: f"{hw[0]}x{hw[1]}")
def test_pixel_values_match_reference(name, mode, hw):
    h, w = hw
    assert_matches_ref(name, [make_image(h, w, mode)])


@pytest.mark.parametrize("name", ["qwen3_smallmax", "qwen25_smallmax"])
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "LA"])
def test_pixel_values_match_reference_max_pixels(name, mode):
    # 900x1300 = 1.17M px > max_pixels of both configs -> the shrinking branch.
    _, ours = get_pair(name)
    rh, rw = ours.get_resized_size(900, 1300)
    assert rh * rw <= ours.max_pixels and (rh, rw) != (900, 1300)
    assert_matches_ref(name, [make_image(900, 1300, mode)])


def test_min_pixels_branch_is_hit():
    _, ours = get_pair("qwen3")
    rh, rw = ours.get_resized_size(28, 600)
    assert rh * rw >= 65536 and (rh % 32, rw % 32) == (0, 0)
    assert round(28 / 32) * 32 * round(600 / 32) * 32 < 65536


@pytest.mark.parametrize("name", ["qwen3", "qwen25"])
def test_batch_of_different_sizes_matches_reference(name):
    images = [make_image(64, 64, "RGB"), make_image(200, 90, "RGBA", 1), make_image(31, 333, "L", 2)]
    assert_matches_ref(name, images)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_decoded_files_match_reference(fmt):
    src = make_image(120, 77, "RGB", 5)
    buf = io.BytesIO()
    src.save(buf, format=fmt)
    data = buf.getvalue()
    ref_img = Image.open(io.BytesIO(data))
    ref_img.load()
    ref, ours = get_pair("qwen3")
    r = ref(images=[ref_img], return_tensors="np")
    pv, grid = process_image(load_image(data), ours)
    assert tuple(r["image_grid_thw"][0]) == grid
    assert np.abs(pv - r["pixel_values"]).max() <= 1e-5


def test_patch_layout_merge_window_order():
    """Row i of pixel_values is patch (gh, gw) in merge-window order, T copies identical."""
    cfg = QwenVLImageProcessor(
        patch_size=2, temporal_patch_size=2, merge_size=2, min_pixels=1, max_pixels=10**9, do_normalize=False
    )
    a = np.arange(8 * 12 * 3, dtype=np.uint8).reshape(8, 12, 3)
    pv, grid = process_image(Image.fromarray(a, "RGB"), cfg)
    assert grid == (1, 4, 6)
    p, m, T = 2, 2, 2
    x = (a.astype(np.float64) / 255).astype(np.float32)
    row = 0
    for bh in range(4 // m):
        for bw in range(6 // m):
            for mh in range(m):
                for mw in range(m):
                    gh, gw = bh * m + mh, bw * m + mw
                    patch = x[gh * p : (gh + 1) * p, gw * p : (gw + 1) * p, :].transpose(2, 0, 1)  # C,p,p
                    expect = np.stack([patch] * T, axis=1).reshape(-1)  # C,T,p,p
                    np.testing.assert_array_equal(pv[row], expect)
                    row += 1
    assert row == pv.shape[0]


def test_from_dict_variants():
    q3 = QwenVLImageProcessor.from_dict(QWEN3_PP)
    assert (q3.patch_size, q3.min_pixels, q3.max_pixels, q3.image_mean) == (16, 65536, 16777216, (0.5,) * 3)
    q25 = QwenVLImageProcessor.from_dict(QWEN25_PP)
    assert (q25.patch_size, q25.min_pixels, q25.max_pixels) == (14, 3136, 12845056)
    # top-level legacy keys win over size (reference __init__ behaviour)
    both = QwenVLImageProcessor.from_dict(dict(QWEN3_PP, min_pixels=1000, max_pixels=2000000))
    assert (both.min_pixels, both.max_pixels) == (1000, 2000000)
    legacy_size = QwenVLImageProcessor.from_dict({"size": {"min_pixels": 10, "max_pixels": 20}})
    assert (legacy_size.min_pixels, legacy_size.max_pixels) == (10, 20)
    assert q3 == QwenVLImageProcessor.from_dict(json.loads(json.dumps(QWEN3_PP)))
    assert pickle.loads(pickle.dumps(q3)) == q3


def test_aspect_ratio_error_is_clear():
    _, ours = get_pair("qwen3")
    with pytest.raises(ImageLoadError, match="aspect ratio"):
        process_image(Image.new("RGB", (1005, 5)), ours)


# --------------------------------------------------------------------------- #
# Processor: placeholder expansion, offsets, mrope, registry
# --------------------------------------------------------------------------- #

SPECIALS = {
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": VS,
    "<|vision_end|>": VE,
    "<|image_pad|>": IMG,
    "<|video_pad|>": VID,
}


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update(SPECIALS)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return PreTrainedTokenizerFast(tokenizer_object=tok)


PH = "<|vision_start|><|image_pad|><|vision_end|>"


def png_bytes(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("model_type,pp", [("qwen3_vl", QWEN3_PP), ("qwen2_5_vl", QWEN25_PP)])
def test_process_expands_placeholders(tokenizer, model_type, pp):
    proc = QwenVLProcessor.from_config_dicts({"model_type": model_type}, pp, tokenizer)
    images = [make_image(64, 64, "RGB"), make_image(300, 120, "RGBA", 1), make_image(33, 47, "L", 2)]
    prompt = f"<|im_start|>user\nA {PH} B {PH}{PH} what?<|im_end|>"
    ids, mm = proc.process(prompt, [png_bytes(images[0]), images[1], images[2]])
    assert isinstance(mm, MultimodalInputs)
    assert len(mm.mm_items) == 3
    _, ours = get_pair("qwen3" if model_type == "qwen3_vl" else "qwen25")
    base_ids = tokenizer.encode(prompt, add_special_tokens=False)
    total = 0
    for item, im in zip(mm.mm_items, images):
        assert item.modality == Modality.IMAGE
        pv, grid = process_image(im, ours)
        assert item.image_grid_thw == grid
        assert torch.is_tensor(item.feature) and item.feature.dtype == torch.float32
        assert torch.equal(item.feature, torch.from_numpy(pv))
        assert item.num_tokens == grid[0] * grid[1] * grid[2] // 4
        ((s, e),) = item.offsets
        assert e - s == item.num_tokens
        assert all(t == IMG for t in ids[s:e])
        assert ids[s - 1] == VS and ids[e] == VE
        total += e - s
        assert item.hash is None and item.pad_value is None
    assert sum(t == IMG for t in ids) == total
    assert len(ids) == len(base_ids) - 3 + total
    assert [t for t in ids if t != IMG] == [t for t in base_ids if t != IMG]
    # mrope
    assert mm.mrope_positions.shape == (3, len(ids)) and mm.mrope_positions.dtype == torch.int64
    pos, delta = compute_mrope_positions(ids, [it.image_grid_thw for it in mm.mm_items], 2, model_type=model_type)
    assert torch.equal(pos, mm.mrope_positions) and delta == mm.mrope_position_delta
    assert mm.mrope_position_delta == int(pos.max()) + 1 - len(ids)
    assert (mm.im_token_id, mm.im_start_id, mm.im_end_id, mm.video_token_id) == (IMG, VS, VE, VID)
    # plain, picklable
    mm2 = pickle.loads(pickle.dumps(mm))
    assert torch.equal(mm2.mrope_positions, mm.mrope_positions)
    assert mm2.mm_items[1].offsets == mm.mm_items[1].offsets


def test_process_with_token_ids_and_executor(tokenizer):
    proc = QwenVLProcessor(None, QwenVLImageProcessor.from_dict(QWEN25_PP), model_type="qwen2_5_vl")
    prompt_ids = [1, 2, VS, IMG, VE, 3, VS, IMG, VE]
    images = [make_image(50, 80, "RGB"), make_image(90, 40, "RGB", 3)]
    ids, mm = proc.process(prompt_ids, images)
    with ThreadPoolExecutor(2) as ex:
        ids2, mm2 = proc.process(torch.tensor(prompt_ids), images, executor=ex)
    assert ids == ids2
    for a, b in zip(mm.mm_items, mm2.mm_items):
        assert a.offsets == b.offsets and torch.equal(a.feature, b.feature)
    assert ids[:3] == [1, 2, VS]
    assert ids[-1] == VE


def test_text_only_prompt(tokenizer):
    proc = QwenVLProcessor(tokenizer, model_type="qwen3_vl")
    ids, mm = proc.process("hello there")
    assert mm.mm_items == [] and mm.mrope_position_delta == 0
    assert torch.equal(mm.mrope_positions, torch.arange(len(ids)).expand(3, -1))


def test_placeholder_count_mismatch(tokenizer):
    proc = QwenVLProcessor(tokenizer, model_type="qwen3_vl")
    img = make_image(32, 32, "RGB")
    with pytest.raises(MultimodalInputError, match=r"1 image placeholder.*2 image\(s\)"):
        proc.process(f"x {PH}", [img, img])
    with pytest.raises(MultimodalInputError, match=r"2 image placeholder.*1 image\(s\)"):
        proc.process(f"{PH} x {PH}", [img])
    with pytest.raises(MultimodalInputError, match=r"0 image placeholder"):
        proc.process("no placeholder", [img])
    with pytest.raises(MultimodalInputError, match="video"):
        proc.process("<|vision_start|><|video_pad|><|vision_end|>", [])


def test_bad_image_in_request_names_index(tokenizer):
    proc = QwenVLProcessor(tokenizer, model_type="qwen3_vl")
    img = make_image(32, 32, "RGB")
    with pytest.raises(ImageLoadError, match=r"image 1: .*not valid base64"):
        proc.process(f"{PH}{PH}", [img, "!!!garbage!!!"])
    with ThreadPoolExecutor(2) as ex:
        with pytest.raises(ImageLoadError, match=r"image 0: invalid base64"):
            proc.process(f"{PH}{PH}", ["QUJD" * 3000 + "$", img], executor=ex)
    with pytest.raises(ImageLoadError, match=r"^unsupported or unrecognized image format"):
        proc.process(PH, [b"GIF89a-not-really"])


def test_from_pretrained(tmp_path, tokenizer):
    cfg = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "image_token_id": IMG,
        "video_token_id": VID,
        "vision_start_token_id": VS,
        "vision_end_token_id": VE,
        "vision_config": {"spatial_merge_size": 2, "tokens_per_second": 2},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(QWEN25_PP))
    cls = get_processor_class(cfg["architectures"], cfg["model_type"])
    assert cls is QwenVLProcessor
    proc = cls.from_pretrained(str(tmp_path), tokenizer)
    assert proc.model_type == "qwen2_5_vl" and proc.tokens_per_second == 2
    assert proc.image_processor == QwenVLImageProcessor.from_dict(QWEN25_PP)
    ids, mm = proc.process(f"hi {PH}", [make_image(56, 56, "RGB")])
    assert mm.mm_items[0].image_grid_thw == (1, 4, 4)


def test_registry():
    assert get_processor_class(["Qwen3VLForConditionalGeneration"]) is QwenVLProcessor
    assert get_processor_class(None, "qwen2_5_vl") is QwenVLProcessor
    assert get_processor_class(["Unknown"], "qwen3_vl") is QwenVLProcessor
    assert issubclass(QwenVLProcessor, BaseMultimodalProcessor)
    assert is_multimodal_model(["Qwen2_5_VLForConditionalGeneration"])
    assert not is_multimodal_model(["LlamaForCausalLM"], "llama")
    with pytest.raises(KeyError, match="no multimodal processor"):
        get_processor_class(["LlamaForCausalLM"], "llama")


def test_mm_item_defaults():
    item = MultimodalDataItem(modality=Modality.IMAGE, image_grid_thw=(1, 6, 8))
    assert item.num_tokens == 12 and item.offsets == [] and item.model_specific_data == {}
    assert MultimodalDataItem(modality=Modality.VIDEO, image_grid_thw=(2, 4, 4)).num_tokens == 8


def test_processor_import_does_not_pull_model_code():
    code = (
        "import sys\n"
        "import sglang.srt.multimodal.processors.qwen_vl\n"
        "from sglang.srt.multimodal.processors.base import get_processor_class\n"
        "get_processor_class(['Qwen3VLForConditionalGeneration'])\n"
        "bad = [m for m in sys.modules if m.startswith('sglang.srt.models') or m.startswith('sglang.srt.layers')\n"
        "       or (m.startswith('transformers.models.') and '.modeling_' in m)]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(_repo_root()))


def _repo_root():
    import pathlib

    return pathlib.Path(__file__).resolve().parents[4]


@pytest.mark.parametrize("model_type", ["qwen3_vl", "qwen2_5_vl"])
def test_frame_list_rate_changes_only_with_a_request_fps(tokenizer, model_type):
    """A list of frames carries no rate: it is timed at transformers' 24 fps unless the request gives
    fps. Another per-request setting (max_pixels) changes the frames' size, never their times
    (Qwen3-VL's timestamp text, Qwen2.5-VL's second_per_grid_t)."""
    proc = QwenVLProcessor.from_config_dicts({"model_type": model_type}, None, tokenizer)
    frames = [make_image(320, 480, "RGB", s) for s in range(4)]
    prompt = "<|vision_start|><|video_pad|><|vision_end|>"

    def run(kwargs):
        _, vcfg = proc.media_config(kwargs)
        ids, mm = proc.process(prompt, [], videos=[frames], video_config=vcfg)
        (item,) = mm.mm_items
        return [t for t in ids if t != VID], item.model_specific_data["second_per_grid_t"], item.image_grid_thw

    base = run({})
    small = run({"max_pixels": 65536})
    assert small[2][1:] < base[2][1:]  # the setting took effect
    assert small[:2] == base[:2]
    assert base[1] == pytest.approx(2 / 24)  # two frames a temporal patch, at 24 fps
    timed = run({"fps": 2})
    assert timed[1] == pytest.approx(1.0)
    if model_type == "qwen3_vl":
        assert timed[0] != base[0]
