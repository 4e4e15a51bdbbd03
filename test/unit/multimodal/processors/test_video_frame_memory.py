"""A video frame is resized with no full-size copy of it: the resize reads the decoded frame (a PyAV RGB
plane, padded rows included, or the PIL image of a frame given as an image) in bands of rows, and what it
holds above that frame is the small (H, new W) intermediate and the output. Bit-identical to torch's
resize of the whole frame, on every torch CPU kernel (AVX2's uint8 one and the generic one).

Memory is measured in a child process whose allocator hands every block of 128 KiB or more back to the
kernel on free (MALLOC_MMAP_THRESHOLD_), so its resident peak (VmHWM, reset through clear_refs) is what was
live at once, not what an earlier test left in the heap."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from sglang.srt.multimodal.processors import video_pixels
from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor

av = pytest.importorskip("av")


def whole_frame_resize(frame: np.ndarray, size) -> np.ndarray:
    """The reference: torch's antialiased bicubic on the whole (1, 3, H, W) frame in one call."""
    x = torch.from_numpy(np.ascontiguousarray(frame.transpose(2, 0, 1)))[None]
    out = F.interpolate(x, size=tuple(size), mode="bicubic", antialias=True, align_corners=False)
    return out[0].permute(1, 2, 0).numpy()


def _cases(seed: int, count: int):
    """(frame, size) pairs: random sizes down and up, one side kept, tiny sides, solid and noisy frames."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        h, w, oh, ow = (int(v) for v in rng.integers(1, 160, 4))
        if i % 3 == 0:
            oh = h
        if i % 5 == 0:
            ow = w
        if i % 7 == 0:
            h = int(rng.integers(1, 4))
        frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if i % 4 == 0:
            frame[:] = rng.integers(0, 256, 3, dtype=np.uint8)
        yield frame, (oh, ow)


def _forms(frame: np.ndarray):
    """The frame as the loaders hand it over: a contiguous array, a read-only array with padded rows (a
    PyAV plane's layout), and an RGB PIL image."""
    h, w = frame.shape[:2]
    padded = np.zeros((h, w + 5, 3), np.uint8)
    padded[:, :w] = frame
    view = padded[:, :w]
    view.flags.writeable = False
    return {"array": frame, "padded_read_only": view, "pil": Image.fromarray(frame)}


@pytest.mark.parametrize("band_bytes", [1, 3 * 64, 4 << 20])
def test_banded_resize_equals_the_whole_frame_resize(monkeypatch, band_bytes):
    """One-row bands, a few rows, and the default (one band for these sizes)."""
    monkeypatch.setattr(video_pixels, "_BAND_BYTES", band_bytes)
    for frame, size in _cases(seed=band_bytes, count=120):
        ref = whole_frame_resize(frame, size)
        for form, src in _forms(frame).items():
            got = video_pixels.resize_frame(src, size)
            assert got.shape == (*size, 3) and got.dtype == np.uint8, form
            assert np.array_equal(got, ref), (form, frame.shape, size)


_GENERIC_KERNEL_CHECK = """
import numpy as np, torch, torch.nn.functional as F
from PIL import Image
from sglang.srt.multimodal.processors import video_pixels
assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"
rng = np.random.default_rng(5)
bad = []
for i in range(80):
    h, w, oh, ow = (int(v) for v in rng.integers(1, 160, 4))
    if i % 3 == 0: oh = h
    if i % 5 == 0: ow = w
    frame = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    x = torch.from_numpy(np.ascontiguousarray(frame.transpose(2, 0, 1)))[None]
    ref = F.interpolate(x, size=(oh, ow), mode="bicubic", antialias=True, align_corners=False)[0].permute(1, 2, 0)
    video_pixels._BAND_BYTES = int(rng.integers(1, 4 * w * 3 + 1))
    for src in (frame, Image.fromarray(frame)):
        if not np.array_equal(video_pixels.resize_frame(src, (oh, ow)), ref.numpy()):
            bad.append((h, w, oh, ow))
print("MISMATCHES", bad)
"""


def test_banded_resize_equals_the_whole_frame_resize_on_torchs_generic_kernel():
    """CPUs without AVX2 run torch's generic separable kernel: the banded resize matches there too."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    out = subprocess.run([sys.executable, "-c", _GENERIC_KERNEL_CHECK], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "MISMATCHES []" in out.stdout, out.stdout[-2000:]


# The child: for each source, the growth of the resident peak while loading it with the real resize and
# with a resize that never reads the frame (everything else the same: demuxing, decoding, the RGB
# conversion, PIL's decode), after a small warm-up through both (lazy imports and codec set-up).
_MEMORY_PROBE = """
import json, sys
import numpy as np
from sglang.srt.multimodal.processors.qwen_video import QwenVLVideoProcessor
from sglang.srt.multimodal.video_io import load_video
from sglang.testing.sample_video import solid_clip, solid_png

SIDE, FRAMES = int(sys.argv[1]), int(sys.argv[2])
cfg = QwenVLVideoProcessor.defaults("qwen3")


class NoRead:
    resized_size = staticmethod(cfg.resized_size)

    def resize_frame(self, frame, size):
        return np.zeros((*size, 3), np.uint8)


def status_mib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def peak_growth_mib(source, fit):
    sampler = cfg.sample_indices if isinstance(source, bytes) else (lambda n, fps: np.arange(n))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here
    base = status_mib("VmRSS")
    video = load_video(source, sampler, fit=fit)
    assert video.resized and len(video.frames) >= 2
    return status_mib("VmHWM") - base


sources = {"mp4": solid_clip(SIDE, SIDE, 2, FRAMES),
           "png_list": [solid_png(SIDE, (40 * i, 250 - 40 * i, 128)) for i in range(FRAMES)]}
for warm in (solid_clip(64, 64, 2, 4), [solid_png(64, (1, 2, 3))] * 2):
    peak_growth_mib(warm, NoRead())
    peak_growth_mib(warm, cfg)
result = {name: {"no_read": peak_growth_mib(src, NoRead()), "resize": peak_growth_mib(src, cfg)}
          for name, src in sources.items()}
print("RESULT", json.dumps(result))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc/self/clear_refs")
def test_resizing_a_huge_frame_holds_no_full_size_copy_of_it():
    """2 solid 4000x4000 frames (46 MiB each as uint8), as an mp4 and as PNGs: the resize costs under half
    a frame above the decode (it was 2.3 frames: a (3, H, W) copy, then torch's 4-byte unpack of it), and
    a PNG list peaks under 2 frames in all (PIL's decoded image is 4 bytes a pixel; it peaked near 4)."""
    side, frames = 4000, 2
    frame_mib = side * side * 3 / 2**20
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(side), str(frames)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT", 1)[1])
    print(f"\npeak growth (MiB) over {frames} frames of {frame_mib:.0f} MiB: {result}")
    for name, r in result.items():
        assert r["resize"] - r["no_read"] < 0.5 * frame_mib, (name, r)
    assert result["png_list"]["resize"] < 2 * frame_mib, result


def test_the_processor_resize_takes_a_pil_frame_as_decoded():
    """QwenVLVideoProcessor.resize_frame (the FrameFit the loaders call) takes the PIL image of a frame
    given as an image, as video_io.frames_from_images now hands it over."""
    cfg = QwenVLVideoProcessor.defaults("qwen2")
    frame = np.random.default_rng(1).integers(0, 256, (97, 131, 3), dtype=np.uint8)
    size = cfg.resized_size(2, 97, 131)
    assert np.array_equal(cfg.resize_frame(Image.fromarray(frame), size), whole_frame_resize(frame, size))
