"""Image sizing options beyond the model's preprocessor config: upstream's SGLANG_IMAGE_MAX_PIXELS and
SGLANG_RESIZE_RESAMPLE (server-wide, checked at start-up) and a request's mm_processor_kwargs /
images_config (max_pixels, min_pixels), honoured or refused naming the key."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from sglang.srt.multimodal.processors.base import MultimodalInputError
from sglang.srt.multimodal.processors.image_options import RESAMPLE_FILTERS, request_image_config
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor, process_image
from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor
from sglang.srt.server_args import ServerArgs

IMG, VS, VE = 151655, 151652, 151653
PROMPT = [1, VS, IMG, VE, 2]
QWEN3 = dict(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3, min_pixels=65536, max_pixels=16777216)


def _png(w: int, h: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _grid(proc: QwenVLProcessor, image: bytes, **kw) -> tuple[int, int, int]:
    _, mm = proc.process(PROMPT, [image], **kw)
    return mm.mm_items[0].image_grid_thw


def test_a_requests_max_pixels_gives_a_smaller_grid_and_min_pixels_a_larger_one():
    proc = QwenVLProcessor(None, QwenVLImageProcessor(**QWEN3))
    image = _png(1024, 768)
    assert _grid(proc, image) == (1, 48, 64)  # the model's budget: no resize needed
    small = proc.image_config({"max_pixels": 256 * 256})
    assert _grid(proc, image, image_config=small) == (1, 12, 18)
    t, gh, gw = _grid(proc, _png(64, 64), image_config=proc.image_config({"min_pixels": 512 * 512}))
    assert gh * 16 * gw * 16 >= 512 * 512 and (gh, gw) == (32, 32)
    assert proc.image_processor.max_pixels == 16777216  # the server's config is untouched
    both = proc.image_config({"max_pixels": 256 * 256, "min_pixels": 128 * 128}, "images_config")
    assert (both.min_pixels, both.max_pixels) == (128 * 128, 256 * 256)
    assert proc.image_config(None) is proc.image_processor and proc.image_config({}) is proc.image_processor


@pytest.mark.parametrize("kwargs, name, phrase", [
    ({"image_mode": "gundam"}, "images_config", "images_config.image_mode is not supported: this server takes "
                                                "max_pixels, min_pixels"),
    ({"max_pixels": 1024, "fps": 2}, "mm_processor_kwargs", "mm_processor_kwargs.fps is not supported"),
    ({"max_pixels": "1024"}, "mm_processor_kwargs", "mm_processor_kwargs.max_pixels must be a positive integer"),
    ({"min_pixels": 0}, "images_config", "images_config.min_pixels must be a positive integer"),
    ({"max_pixels": True}, "images_config", "images_config.max_pixels must be a positive integer"),
    ({"max_pixels": 17_000_000}, "images_config", "images_config.max_pixels 17000000 is above this server's limit "
                                                  "of 16777216"),
    ({"min_pixels": 300_000, "max_pixels": 200_000}, "images_config", "min_pixels 300000 is above max_pixels 200000"),
    ([("max_pixels", 5)], "mm_processor_kwargs", "mm_processor_kwargs must be an object"),
])
def test_what_a_request_cannot_set_is_refused_naming_the_key(kwargs, name, phrase):
    with pytest.raises(MultimodalInputError) as e:
        request_image_config(QwenVLImageProcessor(**QWEN3), kwargs, name)
    assert phrase in str(e.value)


def test_image_max_pixels_caps_the_models_budget_never_raises_it(monkeypatch):
    image = _png(1024, 768)
    monkeypatch.setenv("SGLANG_IMAGE_MAX_PIXELS", str(256 * 256))
    proc = QwenVLProcessor(None, QwenVLImageProcessor(**QWEN3))
    assert proc.image_processor.max_pixels == 256 * 256 and _grid(proc, image) == (1, 12, 18)
    with pytest.raises(MultimodalInputError, match="above this server's limit of 65536"):
        proc.image_config({"max_pixels": 512 * 512})  # the cap binds requests too
    monkeypatch.setenv("SGLANG_IMAGE_MAX_PIXELS", str(10**9))
    assert QwenVLProcessor(None, QwenVLImageProcessor(**QWEN3)).image_processor.max_pixels == 16777216
    monkeypatch.setenv("SGLANG_IMAGE_MAX_PIXELS", "1000")
    with pytest.raises(ValueError, match="SGLANG_IMAGE_MAX_PIXELS=1000 is below the model's min_pixels 65536"):
        QwenVLProcessor(None, QwenVLImageProcessor(**QWEN3))


@pytest.mark.parametrize("name", sorted(RESAMPLE_FILTERS))
def test_resize_resample_selects_pils_filter_by_upstreams_name(name, monkeypatch):
    image = Image.open(io.BytesIO(_png(333, 251, seed=3)))
    monkeypatch.setenv("SGLANG_RESIZE_RESAMPLE", name.lower() if name == "LANCZOS" else name)
    proc = QwenVLProcessor(None, QwenVLImageProcessor(min_pixels=3136, max_pixels=200 * 200))
    assert proc.image_processor.resample == int(getattr(Image.Resampling, name))
    got, _ = process_image(image, proc.image_processor)
    want, _ = process_image(image, QwenVLImageProcessor(min_pixels=3136, max_pixels=200 * 200,
                                                        resample=int(getattr(Image.Resampling, name))))
    np.testing.assert_array_equal(got, want)
    if name != "BICUBIC":  # the filter changes the pixels
        bicubic, _ = process_image(image, QwenVLImageProcessor(min_pixels=3136, max_pixels=200 * 200))
        assert not np.array_equal(got, bicubic)


def test_a_non_bicubic_filter_keeps_jpegs_on_the_pil_path(monkeypatch):
    buf = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 120, dtype=np.uint8)).save(buf, "JPEG")
    monkeypatch.setenv("SGLANG_RESIZE_RESAMPLE", "BILINEAR")
    proc = QwenVLProcessor(None, QwenVLImageProcessor(min_pixels=3136, max_pixels=200 * 200))
    proc.deferred_jpeg = True
    assert isinstance(proc.load_and_process_image(buf.getvalue()).pixel_values, np.ndarray)  # not deferred
    monkeypatch.delenv("SGLANG_RESIZE_RESAMPLE")
    proc = QwenVLProcessor(None, QwenVLImageProcessor(min_pixels=3136, max_pixels=200 * 200))
    proc.deferred_jpeg = True
    assert not isinstance(proc.load_and_process_image(buf.getvalue()).pixel_values, np.ndarray)


@pytest.mark.parametrize("var, value, phrase", [
    ("SGLANG_RESIZE_RESAMPLE", "CUBIC", "invalid value for SGLANG_RESIZE_RESAMPLE: expected one of NEAREST, BOX, BILINEAR"),
    ("SGLANG_IMAGE_MAX_PIXELS", "12k", "invalid value for SGLANG_IMAGE_MAX_PIXELS: expected a positive integer number of pixels"),
    ("SGLANG_IMAGE_MAX_PIXELS", "-5", "invalid value for SGLANG_IMAGE_MAX_PIXELS: expected a positive integer"),
])
def test_an_invalid_value_stops_start_up_naming_the_variable(var, value, phrase, monkeypatch, capsys):
    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit):
        ServerArgs.from_argv([])
    assert phrase in capsys.readouterr().err
