"""image_io: sources, RGB conversion, and clear ImageLoadError messages."""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from sglang.srt.multimodal.image_io import (
    ImageLoadError,
    decode_base64,
    decode_image_bytes,
    load_image,
    to_rgb,
)

try:
    from transformers.image_transforms import convert_to_rgb as hf_convert_to_rgb
except ImportError:  # pragma: no cover
    hf_convert_to_rgb = None


def encode(im: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def rgb_image(h=20, w=30, seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def mode_image(mode: str) -> Image.Image:
    rng = np.random.default_rng(1)
    if mode in ("RGB", "RGBA", "CMYK", "YCbCr", "RGBX", "HSV", "LA", "L", "PA"):
        n = len(Image.new(mode, (1, 1)).getbands())
        a = rng.integers(0, 256, (9, 11, n), dtype=np.uint8)
        if n == 1:
            a = a[..., 0]
        if mode == "PA":
            im = Image.fromarray(a[..., 0], "L").convert("P")
            im = im.convert("PA") if hasattr(im, "convert") else im
            return im
        return Image.fromarray(a, mode)
    if mode == "P":
        return rgb_image(9, 11).quantize(colors=8)
    if mode == "P_transparency":
        im = rgb_image(9, 11).quantize(colors=8)
        im.info["transparency"] = 2
        return im
    if mode == "1":
        return rgb_image(9, 11).convert("1")
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (9, 11), dtype=np.uint16))
    if mode == "I":
        return Image.fromarray(rng.integers(-5, 70000, (9, 11), dtype=np.int32), "I")
    if mode == "F":
        return Image.fromarray(rng.uniform(0, 300, (9, 11)).astype(np.float32), "F")
    raise ValueError(mode)


ALL_MODES = ["RGB", "RGBA", "RGBX", "L", "LA", "P", "PA", "P_transparency", "1", "CMYK", "YCbCr", "HSV",
             "I;16", "I", "F"]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_every_mode_converts_to_rgb_like_transformers(mode):
    im = mode_image(mode)
    out = to_rgb(im)
    assert out.mode == "RGB" and out.size == im.size
    if hf_convert_to_rgb is not None:
        np.testing.assert_array_equal(np.asarray(out), hf_convert_to_rgb(im, return_numpy=True))
    # also through load_image (PIL passthrough)
    assert load_image(im).mode == "RGB"


def test_rgba_is_composited_onto_white():
    a = np.zeros((2, 2, 4), dtype=np.uint8)
    a[0, 0] = (10, 20, 30, 0)  # fully transparent -> white
    a[0, 1] = (10, 20, 30, 255)  # opaque -> unchanged
    a[1, 0] = (0, 0, 0, 128)  # half -> mid grey
    out = np.asarray(to_rgb(Image.fromarray(a, "RGBA")))
    assert tuple(out[0, 0]) == (255, 255, 255)
    assert tuple(out[0, 1]) == (10, 20, 30)
    assert all(120 <= v <= 135 for v in out[1, 0])


def test_i16_saturates_like_reference():
    a = np.array([[0, 100, 255, 256, 65535]], dtype=np.uint16)
    out = np.asarray(to_rgb(Image.fromarray(a)))
    assert out[0, :, 0].tolist() == [0, 100, 255, 255, 255]


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "BMP", "WEBP", "TIFF", "PPM", "TGA", "ICO"])
def test_formats_pil_can_open_are_fine(fmt):
    data = encode(rgb_image(16, 16), fmt)
    im = load_image(data)
    assert im.mode == "RGB" and im.size == (16, 16)


def test_animated_gif_first_frame():
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    im = load_image(buf.getvalue())
    assert im.size == (8, 8) and tuple(np.asarray(im)[0, 0]) == (255, 0, 0)


def test_sources_all_decode_to_same_pixels(tmp_path):
    src = rgb_image()
    data = encode(src)
    b64 = base64.b64encode(data).decode()
    path = tmp_path / "img.png"
    path.write_bytes(data)
    expect = np.asarray(src)
    sources = [
        data,
        bytearray(data),
        memoryview(data),
        b64,
        "\n".join(b64[i : i + 76] for i in range(0, len(b64), 76)),  # MIME line breaks
        b64.rstrip("="),  # missing padding
        base64.urlsafe_b64encode(data).decode(),
        f"data:image/png;base64,{b64}",
        f"data:;base64,{b64}",
        str(path),
        path,
        f"file://{path}",
        src,
    ]
    for s in sources:
        im = load_image(s, allowed_local_media_path=str(tmp_path))
        np.testing.assert_array_equal(np.asarray(im), expect)


def test_exif_orientation_applied():
    im = rgb_image(10, 20)  # w=20, h=10
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW
    data = encode(im, "JPEG", exif=exif.tobytes())
    assert load_image(data).size == (10, 20)
    assert load_image(data, apply_exif_orientation=False).size == (20, 10)


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #


def test_bad_base64():
    with pytest.raises(ImageLoadError, match="invalid base64"):
        load_image("abc$%^&*" * 1000)  # too long to be a path, not base64
    with pytest.raises(ImageLoadError, match="invalid base64"):
        load_image("data:image/png;base64,@@@@")
    with pytest.raises(ImageLoadError, match="invalid base64"):
        decode_base64("abcde")  # impossible length
    with pytest.raises(ImageLoadError, match="invalid base64"):
        load_image("data:image/png;base64,")


def test_base64_of_non_image():
    s = base64.b64encode(b"hello, this is just some text\n" * 10).decode()
    with pytest.raises(ImageLoadError, match="unrecognized image format"):
        load_image(s)


def test_truncated_jpeg():
    data = encode(rgb_image(64, 64), "JPEG")
    with pytest.raises(ImageLoadError, match="corrupt or truncated"):
        load_image(data[: len(data) // 2])


def test_truncated_png():
    data = encode(rgb_image(64, 64), "PNG")
    with pytest.raises(ImageLoadError, match="corrupt or truncated"):
        load_image(data[: len(data) // 2])
    with pytest.raises(ImageLoadError, match="corrupt or truncated|unrecognized"):
        load_image(data[:20])


def test_corrupt_png_crc():
    data = bytearray(encode(rgb_image(32, 32), "PNG"))
    idat = data.find(b"IDAT")
    data[idat + 10] ^= 0xFF
    with pytest.raises(ImageLoadError, match="corrupt or truncated"):
        load_image(bytes(data))


def test_text_file_is_unrecognized(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("just text, not an image\n")
    with pytest.raises(ImageLoadError, match="unsupported or unrecognized image format"):
        load_image(str(p))
    with pytest.raises(ImageLoadError, match="unsupported or unrecognized image format"):
        load_image(p.read_bytes())


def test_eps_is_refused():
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    with pytest.raises(ImageLoadError, match="unsupported or unrecognized image format"):
        load_image(eps)


def test_empty_inputs():
    with pytest.raises(ImageLoadError, match="empty"):
        load_image(b"")
    with pytest.raises(ImageLoadError, match="empty"):
        load_image("   ")


def test_unsupported_type():
    with pytest.raises(ImageLoadError, match="unsupported image input type int"):
        load_image(123)  # type: ignore[arg-type]


def test_path_outside_allowlist(tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    outside = tmp_path / "secret.png"
    outside.write_bytes(encode(rgb_image()))
    inside = allowed / "ok.png"
    inside.write_bytes(encode(rgb_image()))
    assert load_image(str(inside), allowed_local_media_path=str(allowed)).size == (30, 20)
    with pytest.raises(ImageLoadError, match="outside the allowed local media path"):
        load_image(str(outside), allowed_local_media_path=str(allowed))
    with pytest.raises(ImageLoadError, match="outside the allowed local media path"):
        load_image(str(allowed / ".." / "secret.png"), allowed_local_media_path=str(allowed))
    with pytest.raises(ImageLoadError, match="outside the allowed local media path"):
        load_image(f"file://{outside}", allowed_local_media_path=str(allowed))
    # a sibling directory sharing the prefix is not inside
    sibling = tmp_path / "allowed_evil"
    sibling.mkdir()
    (sibling / "x.png").write_bytes(encode(rgb_image()))
    with pytest.raises(ImageLoadError, match="outside"):
        load_image(str(sibling / "x.png"), allowed_local_media_path=str(allowed))
    # symlink inside the allowlist pointing outside
    link = allowed / "link.png"
    os.symlink(outside, link)
    with pytest.raises(ImageLoadError, match="outside"):
        load_image(str(link), allowed_local_media_path=str(allowed))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ImageLoadError, match="not found"):
        load_image(str(tmp_path / "nope.png"))
    with pytest.raises(ImageLoadError, match="not found"):
        load_image(tmp_path / "nope.png")
    with pytest.raises(ImageLoadError, match="not found.*not valid base64"):
        load_image("relative/missing.jpg")
    with pytest.raises(ImageLoadError, match="outside"):
        load_image("/elsewhere/missing.jpg", allowed_local_media_path=str(tmp_path))
    with pytest.raises(ImageLoadError, match="not a regular file"):
        load_image(str(tmp_path))


def test_decompression_bomb_limit():
    data = encode(Image.new("RGB", (200, 100)))
    assert load_image(data, max_image_pixels=20000).size == (200, 100)
    with pytest.raises(ImageLoadError, match="decompression bomb"):
        load_image(data, max_image_pixels=19999)
    with pytest.raises(ImageLoadError, match="decompression bomb"):
        load_image(Image.new("RGB", (200, 100)), max_image_pixels=100)


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_decompression_bomb_header_is_rejected_before_decoding():
    bomb = _png_header_only(50000, 50000)  # 2.5G pixels claimed by a ~60 byte file
    with pytest.raises(ImageLoadError, match="decompression bomb"):
        load_image(bomb)
    with pytest.raises(ImageLoadError, match="decompression bomb"):
        decode_image_bytes(_png_header_only(9000, 9000))  # 81M > 8192*8192 default


def test_http_not_supported_yet():
    with pytest.raises(ImageLoadError, match="http"):
        load_image("https://example.com/cat.png")


def test_bad_data_urls():
    with pytest.raises(ImageLoadError, match="media type"):
        load_image("data:text/plain;base64,aGVsbG8=")
    with pytest.raises(ImageLoadError, match="only base64"):
        load_image("data:image/png,rawdata")
    with pytest.raises(ImageLoadError, match="malformed data URL"):
        load_image("data:image/png;base64")


def test_image_load_error_is_value_error():
    assert issubclass(ImageLoadError, ValueError)
