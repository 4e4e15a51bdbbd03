"""For any size, EXIF orientation 1-8, chroma subsampling and gray/colour JPEG: the header alone gives the
same oriented size, hence the same Qwen-VL grid and placeholder count, as the full PIL decode."""

from __future__ import annotations

import io

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from sglang.srt.multimodal.deferred_decode import defer_jpeg
from sglang.srt.multimodal.image_io import load_image
from sglang.srt.multimodal.jpeg_header import parse_jpeg_header
from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor, SmartResizeError

QWEN3 = QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                             min_pixels=32 * 32, max_pixels=256 * 256)
QWEN25 = QwenVLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 64)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=st.integers(1, 300), h=st.integers(1, 300), orientation=st.integers(1, 8),
       subsampling=st.sampled_from([0, 1, 2]), gray=st.booleans(), seed=st.integers(0, 3))
def test_header_grid_equals_full_decode_grid(w, h, orientation, subsampling, gray, seed):
    arr = np.random.default_rng(seed).integers(0, 256, (h, w) if gray else (h, w, 3), dtype=np.uint8)
    ex = Image.Exif()
    ex[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(arr, "L" if gray else "RGB").save(buf, "JPEG", exif=ex.tobytes(), subsampling=subsampling)
    data = buf.getvalue()

    hdr = parse_jpeg_header(data)
    full = load_image(data)
    assert hdr.oriented_size == full.size
    for cfg in (QWEN3, QWEN25):
        try:
            want = cfg.get_grid_thw(full.size[1], full.size[0])
        except SmartResizeError:
            assert defer_jpeg(data, cfg, None) is None  # the full path raises the error itself
            continue
        enc = defer_jpeg(data, cfg, None)
        assert enc is not None and enc.grid_thw == want and enc.orientation == orientation
