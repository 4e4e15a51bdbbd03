"""A PIL image (`sglang.Engine` callers) handed to a preprocessing worker as raw RGB in a shared-memory segment.

A PIL image has no encoded form and is a client object: it is never pickled. The tokenizer process does the
first, cheap steps of `image_io.load_image` on it (the size check, the load, the EXIF orientation and the RGB
conversion: transparency composited onto white), so its refusals are the in-process path's, word for word, and
writes the RGB pixels into a segment of its own (`to_segment`, ~3 ms for 1280x720). The worker maps it and
rebuilds an RGB image (`from_segment`), which `load_image` then leaves as it is (no EXIF, already RGB): the
pixels it preprocesses are exactly those the in-process path would have (docs/optimizations/mm-frontend.md,
`benchmark/multimodal/bench_pil_handoff.py`: 33-34 ms of the tokenizer process's CPU per 1280x720 image
in-process, ~3 ms handed off).

Ownership: the segment is the caller's, from its write to its unlink once the worker has answered or died
(`MMProcessorPool.load_pil`); its name is under the server's prefix, so a crash leaves it to the next start's
sweep. The worker only reads it (a private mapping).
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from sglang.srt.multimodal.image_io import load_image
from sglang.srt.multimodal.transport.shm import ShmPointerMMData, write_segment


def to_segment(image: Image.Image, max_image_pixels: int | None, prefix: str) -> ShmPointerMMData:
    """The RGB pixels of `image` as `load_image` makes them, (H, W, 3) uint8 in a new segment named under
    `prefix`. Raises ImageLoadError (the request's 400) where `load_image` would; ShmSpaceError when
    /dev/shm is full (the caller then processes the image itself)."""
    rgb = load_image(image, max_image_pixels=max_image_pixels)
    # a writable copy: torch refuses to wrap PIL's read-only export without a warning
    arr = np.array(rgb, dtype=np.uint8)
    if arr.ndim != 3 or arr.shape[2] != 3:  # load_image returns RGB: anything else is a bug here
        raise RuntimeError(f"RGB image exported as {arr.shape}")
    return write_segment(torch.from_numpy(arr), prefix)


def from_segment(ptr: ShmPointerMMData) -> Image.Image:
    """The RGB image in a segment written by `to_segment` (read through a private mapping; the caller's
    name is not touched)."""
    if ptr.dtype != "uint8" or len(ptr.shape) != 3 or ptr.shape[2] != 3:
        raise RuntimeError(f"not an RGB image segment: {ptr.shape} {ptr.dtype}")
    return Image.fromarray(ptr.materialize().numpy())  # (H, W, 3) uint8: RGB


__all__ = ["from_segment", "to_segment"]
