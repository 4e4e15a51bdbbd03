"""jpeg_header.parse_jpeg_header against PIL: size, EXIF orientation, components, sampling, coding
process, Adobe transform and truncation, read without decoding pixels."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

from sglang.srt.multimodal.image_io import load_image
from sglang.srt.multimodal.jpeg_header import JpegHeaderError, is_jpeg, parse_jpeg_header


def jpeg(w=64, h=48, mode="RGB", orientation=None, seed=0, **save) -> bytes:
    rng = np.random.default_rng(seed)
    bands = {"RGB": 3, "L": 1, "CMYK": 4}[mode]
    arr = rng.integers(0, 256, (h, w, bands) if bands > 1 else (h, w), dtype=np.uint8)
    im = Image.fromarray(arr, mode)
    if orientation is not None:
        ex = Image.Exif()
        ex[0x0112] = orientation
        save["exif"] = ex.tobytes()
    buf = io.BytesIO()
    im.save(buf, "JPEG", **save)
    return buf.getvalue()


@pytest.mark.parametrize("ss,name,luma", [(0, "4:4:4", (1, 1)), (1, "4:2:2", (2, 1)), (2, "4:2:0", (2, 2))])
def test_size_sampling_baseline(ss, name, luma):
    h = parse_jpeg_header(jpeg(70, 33, subsampling=ss))
    assert (h.width, h.height, h.components, h.precision) == (70, 33, 3, 8)
    assert h.sampling[0] == luma and h.subsampling == name
    assert not h.progressive and h.has_eoi and h.orientation == 1 and h.simple_reason() is None


def test_gray_progressive_cmyk_flags():
    assert parse_jpeg_header(jpeg(mode="L")).subsampling == "gray"
    assert parse_jpeg_header(jpeg(mode="L")).simple_reason() is None
    prog = parse_jpeg_header(jpeg(progressive=True))
    assert prog.progressive and prog.simple_reason() == "progressive"
    cmyk = parse_jpeg_header(jpeg(mode="CMYK"))
    assert cmyk.is_cmyk and cmyk.adobe_transform is not None and cmyk.simple_reason() == "CMYK/YCCK"


@pytest.mark.parametrize("o", range(1, 9))
def test_orientation_and_oriented_size_match_pil(o):
    data = jpeg(50, 20, orientation=o)
    h = parse_jpeg_header(data)
    assert h.orientation == o
    assert h.oriented_size == load_image(data).size


def test_big_endian_exif_and_first_exif_segment_wins():
    tiff = b"MM\x00*" + struct.pack(">I", 8) + struct.pack(">H", 1) + struct.pack(">HHI", 0x0112, 3, 1) \
        + struct.pack(">H", 6) + b"\x00\x00" + struct.pack(">I", 0)
    app1 = b"Exif\x00\x00" + tiff
    seg = b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1
    base = jpeg(40, 30)
    data = base[:2] + seg + seg.replace(struct.pack(">H", 6), struct.pack(">H", 3)) + base[2:]
    assert parse_jpeg_header(data).orientation == 6
    assert parse_jpeg_header(data).oriented_size == load_image(data).size == (30, 40)


def test_truncated_and_malformed():
    data = jpeg(64, 64)
    assert parse_jpeg_header(data[: len(data) // 2]).simple_reason() == "truncated (no EOI marker)"
    with pytest.raises(JpegHeaderError):
        parse_jpeg_header(data[:20])
    with pytest.raises(JpegHeaderError):
        parse_jpeg_header(b"\xff\xd8\xff\xd9")
    assert not is_jpeg(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(JpegHeaderError):
        parse_jpeg_header(b"GIF89a")


def test_adobe_rgb_transform_is_not_simple():
    base = jpeg(16, 16, subsampling=0)
    app14 = b"Adobe" + b"\x00\x64" + b"\x00\x00" + b"\x00\x00" + b"\x00"
    data = base[:2] + b"\xff\xee" + struct.pack(">H", len(app14) + 2) + app14 + base[2:]
    h = parse_jpeg_header(data)
    assert h.adobe_transform == 0 and h.simple_reason() == "RGB-coded (Adobe transform 0)"
