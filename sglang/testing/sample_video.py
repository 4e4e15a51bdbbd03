"""Deterministic test clips encoded with PyAV: a white bar sweeping left to right over fixed noise, so every
frame differs from its neighbours and a wrong frame index shows in the pixels; and solid clips and PNGs
that cost far more decoded than encoded (the memory tests and benchmark)."""

from __future__ import annotations

import io

import numpy as np

# container -> (codec, pixel format); yuv444p keeps odd frame sizes legal for x264
FORMATS = {
    "mp4": ("libx264", "yuv444p"),
    "mkv": ("libx264", "yuv444p"),
    "avi": ("mpeg4", "yuv420p"),  # even sizes only
    "webm": ("libvpx-vp9", "yuv420p"),  # even sizes only; no frame count in the header
}
_MUXER = {"mkv": "matroska"}


def bar_frames(width: int, height: int, num_frames: int, seed: int = 0) -> np.ndarray:
    """(num_frames, height, width, 3) uint8: noise with a 3-pixel white bar at x = i * (width - 3) / (n - 1)."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    frames = np.repeat(noise[None], num_frames, axis=0)
    for i in range(num_frames):
        x = int(i * (width - 3) / max(1, num_frames - 1))
        frames[i, :, x : x + 3] = 255
    return frames


def make_clip(width: int, height: int, fps: float, seconds: float, container: str = "mp4", seed: int = 0) -> bytes:
    """An encoded clip of round(fps * seconds) frames at `fps` (lossless enough that frames stay distinct)."""
    import av
    from fractions import Fraction

    codec, pix_fmt = FORMATS[container]
    frames = bar_frames(width, height, max(1, int(round(fps * seconds))), seed)
    buf = io.BytesIO()
    with av.open(buf, "w", format=_MUXER.get(container, container)) as out:
        stream = out.add_stream(codec, rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if codec == "libx264":
            stream.options = {"crf": "12", "preset": "ultrafast"}
        for f in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def clip_data_url(data: bytes, container: str = "mp4") -> str:
    import base64

    return f"data:video/{container};base64," + base64.b64encode(data).decode()


def solid_png(size: int, color) -> bytes:
    """A size x size PNG of one color: a few KB that decode to size^2 x 3 bytes."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buf, "PNG")
    return buf.getvalue()


def solid_clip(width: int, height: int, fps: float, frames: int) -> bytes:
    """An H.264 mp4 of `frames` identical two-color frames: tiny encoded, full-size frames decoded."""
    import av
    from fractions import Fraction

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        s = out.add_stream("libx264", rate=Fraction(fps).limit_denominator(100))
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"preset": "ultrafast", "crf": "30"}
        img = np.zeros((height, width, 3), np.uint8)
        img[:, : width // 2] = (40, 120, 200)
        frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
        del img  # the encoder needs only the one converted frame
        for i in range(frames):
            frame.pts = i
            for p in s.encode(frame):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    return buf.getvalue()
