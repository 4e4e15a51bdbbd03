"""Qwen2.5-VL / Qwen3-VL image preprocessing (prompt expansion is in qwen_vl.py).

``QwenVLImageProcessor`` reproduces transformers' ``Qwen2VLImageProcessorPil``
(the image processor both Qwen2.5-VL and Qwen3-VL use):

1. convert to RGB (transparency composited onto white);
2. ``smart_resize`` to a multiple of ``patch_size * merge_size`` inside
   ``[min_pixels, max_pixels]``, resized with PIL (bicubic by default);
3. ``x * rescale_factor`` (computed in float64, stored as float32), then
   ``(x - mean) / std`` in float32 -- done here through a per-channel 256-entry
   lookup table, which gives bit-identical values at a fraction of the cost;
4. patchify into ``(grid_h * grid_w, C * T * P * P)`` with merge-window ordering
   ``(gh/m, gw/m, m, m)`` and the still image repeated ``temporal_patch_size`` times.

``process_image`` is a pure function of (PIL image, config), safe to run in
worker threads (PIL resize and numpy release the GIL for the heavy parts).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image

from sglang.srt.multimodal.image_io import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageInput,
    ImageLoadError,
    load_image,
    to_rgb,
)
from sglang.srt.multimodal.mm_types import EncodedImage, PixelNorm


OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

MAX_ASPECT_RATIO = 200

# PIL resample filter ids (same numbering as transformers' PILImageResampling).
_RESAMPLE_BICUBIC = 3


class SmartResizeError(ValueError):
    """The image cannot be resized under the smart_resize rules (e.g. aspect ratio > 200)."""


def smart_resize(
    height: int,
    width: int,
    factor: int = 28,
    min_pixels: int = 56 * 56,
    max_pixels: int = 14 * 14 * 4 * 1280,
) -> tuple[int, int]:
    """Target ``(height, width)``: multiples of ``factor``, area in ``[min_pixels, max_pixels]``.

    Same arithmetic as the reference (Python ``round`` = banker's rounding on
    ``size / factor``; ``floor`` when shrinking, ``ceil`` when growing).
    """
    if height < 1 or width < 1:
        raise SmartResizeError(f"image too small: {height}x{width} (each side must be at least 1 pixel)")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise SmartResizeError(
            f"absolute aspect ratio must be smaller than {MAX_ASPECT_RATIO}, got {ratio} "
            f"(image is {height}x{width})"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    if h_bar < factor or w_bar < factor:
        raise SmartResizeError(
            f"image too small: {height}x{width} resizes to {h_bar}x{w_bar}, less than one "
            f"{factor}x{factor} merged patch (min_pixels={min_pixels})"
        )
    return h_bar, w_bar


@dataclass(frozen=True)
class QwenVLImageProcessor:
    """Immutable Qwen-VL image preprocessing config + the processing itself.

    Defaults are those of transformers' ``Qwen2VLImageProcessorPil`` (Qwen2/2.5-VL
    style: patch 14, CLIP mean/std). Use :meth:`from_dict` / :meth:`from_pretrained`
    with a ``preprocessor_config.json`` for a real model (Qwen3-VL: patch 16,
    mean/std 0.5, size {shortest_edge: 65536, longest_edge: 16777216}).
    """

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = OPENAI_CLIP_STD
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    resample: int = _RESAMPLE_BICUBIC
    _lut: np.ndarray = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        for name in ("patch_size", "temporal_patch_size", "merge_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if len(self.image_mean) != 3 or len(self.image_std) != 3:
            raise ValueError("image_mean and image_std must have 3 values (RGB)")
        object.__setattr__(self, "image_mean", tuple(float(v) for v in self.image_mean))
        object.__setattr__(self, "image_std", tuple(float(v) for v in self.image_std))
        object.__setattr__(self, "_lut", self._build_lut())

    def __reduce__(self):
        """Pickled as its init fields only (it travels inside deferred images): the LUT is rebuilt."""
        names = [f.name for f in fields(self) if f.init]
        return _rebuild_image_processor, (type(self), tuple((n, getattr(self, n)) for n in names))

    # ------------------------------------------------------------------ #
    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> "QwenVLImageProcessor":
        """Build from the contents of ``preprocessor_config.json``.

        ``size`` = {shortest_edge: min_pixels, longest_edge: max_pixels}; legacy
        top-level ``min_pixels`` / ``max_pixels`` override it (as in the reference).
        """
        kw: dict[str, Any] = {}
        for key in (
            "patch_size",
            "temporal_patch_size",
            "merge_size",
            "do_resize",
            "do_rescale",
            "rescale_factor",
            "do_normalize",
            "resample",
        ):
            if cfg.get(key) is not None:
                kw[key] = cfg[key]
        for key in ("image_mean", "image_std"):
            v = cfg.get(key)
            if v is not None:
                kw[key] = tuple(v) if isinstance(v, (list, tuple)) else (float(v),) * 3
        size = cfg.get("size") or {}
        if isinstance(size, Mapping):
            if size.get("shortest_edge") is not None:
                kw["min_pixels"] = size["shortest_edge"]
            elif size.get("min_pixels") is not None:
                kw["min_pixels"] = size["min_pixels"]
            if size.get("longest_edge") is not None:
                kw["max_pixels"] = size["longest_edge"]
            elif size.get("max_pixels") is not None:
                kw["max_pixels"] = size["max_pixels"]
        if cfg.get("min_pixels") is not None:
            kw["min_pixels"] = cfg["min_pixels"]
        if cfg.get("max_pixels") is not None:
            kw["max_pixels"] = cfg["max_pixels"]
        for key in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels", "resample"):
            if key in kw:
                kw[key] = int(kw[key])
        if "rescale_factor" in kw:
            kw["rescale_factor"] = float(kw["rescale_factor"])
        return cls(**kw)

    @classmethod
    def from_pretrained(cls, model_path: str) -> "QwenVLImageProcessor":
        path = os.path.join(model_path, "preprocessor_config.json")
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    # ------------------------------------------------------------------ #
    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def get_resized_size(self, height: int, width: int) -> tuple[int, int]:
        if not self.do_resize:
            return height, width
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def get_grid_thw(self, height: int, width: int) -> tuple[int, int, int]:
        rh, rw = self.get_resized_size(height, width)
        return 1, rh // self.patch_size, rw // self.patch_size

    def get_num_image_tokens(self, height: int, width: int) -> int:
        t, gh, gw = self.get_grid_thw(height, width)
        return t * gh * gw // (self.merge_size**2)

    def _build_lut(self) -> np.ndarray:
        return image_norm_table(self)

    # ------------------------------------------------------------------ #
    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """One image -> ``(pixel_values (N, C*T*P*P) float32, (1, grid_h, grid_w))``."""
        return process_image(image, self)

    def __call__(self, images: Sequence[Image.Image]) -> dict[str, np.ndarray]:
        """Batch API shaped like the reference: concatenated pixel_values + (n, 3) grid."""
        outs = [process_image(im, self) for im in images]
        return {
            "pixel_values": np.concatenate([o[0] for o in outs], axis=0),
            "image_grid_thw": np.asarray([o[1] for o in outs], dtype=np.int64).reshape(-1, 3),
        }


@functools.lru_cache(maxsize=64)
def still_image_config(cfg: QwenVLImageProcessor) -> QwenVLImageProcessor:
    """`cfg` with a temporal patch of one frame (SGLANG_MM_COMPACT_STILL_IMAGES): a still image patchified by
    it gives rows of C*P*P values, the first of the T identical frames of each baseline row; its uint8 carrier's
    `PixelNorm` and a deferred JPEG's config say so too, so every path that finishes the pixels where the tower
    runs produces the same compact rows. The tower's patch embedding takes them with its kernel summed over the
    temporal axis (`layers/vision_blocks.py`). Cached: a server sees a few configs (its own and requests')."""
    if cfg.temporal_patch_size == 1:
        return cfg
    return dataclasses.replace(cfg, temporal_patch_size=1)


def image_norm_table(cfg) -> np.ndarray:
    """(3, 256) float32: the exact per-channel value of every uint8 input under `cfg`'s do_rescale,
    rescale_factor, do_normalize, image_mean, image_std (an image processor config or a PixelNorm)."""
    x = np.arange(256, dtype=np.uint8)
    if cfg.do_rescale:
        xf = (x.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    else:
        xf = x.astype(np.float32)
    xf = np.broadcast_to(xf, (3, 256))
    if cfg.do_normalize:
        mean = np.asarray(cfg.image_mean, dtype=np.float32)[:, None]
        std = np.asarray(cfg.image_std, dtype=np.float32)[:, None]
        lut = (xf - mean) / std
    else:
        lut = xf
    return np.ascontiguousarray(lut, dtype=np.float32)


def _rebuild_image_processor(cls, items):
    return cls(**dict(items))


def process_image(image: Image.Image, cfg: QwenVLImageProcessor) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Pure per-image preprocessing (convert, resize, rescale, normalize, patchify)."""
    image, rh, rw = rgb_and_resized_size(image, cfg)
    return resize_and_patchify(image, cfg, rh, rw)


def rgb_and_resized_size(image: Image.Image, cfg: QwenVLImageProcessor) -> tuple[Image.Image, int, int]:
    """(the image in RGB, the height and width it is resized to); ImageLoadError when no size fits."""
    image = to_rgb(image)
    width, height = image.size
    try:
        rh, rw = cfg.get_resized_size(height, width)
    except SmartResizeError as e:
        raise ImageLoadError(str(e)) from e
    return image, rh, rw


def resize_and_patchify(
    image: Image.Image, cfg: QwenVLImageProcessor, rh: int, rw: int
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """An RGB image resized to ``(rh, rw)`` (unless ``do_resize`` is off), rescaled, normalized, patchified."""
    return normalize_and_patchify(resize_to_uint8(image, cfg, rh, rw), cfg._lut, cfg.patch_size, cfg.merge_size,
                                  cfg.temporal_patch_size)


def resize_to_uint8(image: Image.Image, cfg: QwenVLImageProcessor, rh: int, rw: int) -> np.ndarray:
    """An RGB image resized to ``(rh, rw)`` (unless ``do_resize`` is off): (rh, rw, 3) uint8, what
    SGLANG_MM_UINT8_PIXELS sends instead of the float32 pixel values."""
    p, m = cfg.patch_size, cfg.merge_size
    if rh % (p * m) or rw % (p * m):
        raise ImageLoadError(
            f"image size {rh}x{rw} is not a multiple of patch_size*merge_size={p * m} (do_resize=False?)"
        )
    if cfg.do_resize:
        image = image.resize((rw, rh), resample=cfg.resample)
    arr = np.asarray(image)  # (rh, rw, 3) uint8
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3 or arr.shape[:2] != (rh, rw):
        raise ImageLoadError(f"unexpected decoded image array {arr.dtype} {arr.shape}")
    return arr


def normalize_and_patchify(arr: np.ndarray, lut: np.ndarray, p: int, m: int, T: int
                           ) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(H, W, 3) uint8 -> ``(pixel_values (gh*gw, 3*T*p*p) float32, (1, gh, gw))`` through the (3, 256)
    normalize table ``lut``."""
    rh, rw = arr.shape[:2]
    gh, gw = rh // p, rw // p
    C = 3
    # (gh/m, m, p, gw/m, m, p, C) -> (gh/m, gw/m, m, m, C, p, p)
    u8 = arr.reshape(gh // m, m, p, gw // m, m, p, C).transpose(0, 3, 1, 4, 6, 2, 5)
    # Gather every channel through its LUT straight into the (.., C, T, p, p) output;
    # the still image is repeated along T.
    out = np.empty((*u8.shape[:5], T, p, p), dtype=np.float32)
    for c in range(C):
        vals = np.take(lut[c], u8[:, :, :, :, c])  # (gh/m, gw/m, m, m, p, p)
        out[:, :, :, :, c, 0] = vals
        if T > 1:
            out[:, :, :, :, c, 1:] = vals[:, :, :, :, None]
    return out.reshape(gh * gw, C * T * p * p), (1, gh, gw)


@dataclass
class ProcessedImage:
    pixel_values: np.ndarray | EncodedImage  # float32 patches, or (H, W, 3) uint8 when `norm` is set
    grid_thw: tuple[int, int, int]
    norm: PixelNorm | None = None
    hash: int | None = None  # the item hash, when computed with the image (`image_flight.SharedImageLoader`)


def load_and_process_image(
    source: ImageInput,
    cfg: QwenVLImageProcessor,
    *,
    allowed_local_media_path: str | None = None,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    uint8: bool = False,
) -> ProcessedImage:
    """Pure: decode one image input and preprocess it (thread-safe). `uint8` (SGLANG_MM_UINT8_PIXELS):
    stop after the resize; the pixels travel as uint8 with the recipe that finishes them."""
    image = load_image(
        source, allowed_local_media_path=allowed_local_media_path, max_image_pixels=max_image_pixels
    )
    if not uint8:
        pv, grid = process_image(image, cfg)
        return ProcessedImage(pv, grid)
    image, rh, rw = rgb_and_resized_size(image, cfg)
    arr = resize_to_uint8(image, cfg, rh, rw)
    if not arr.flags.writeable:  # PIL's array export is read-only; the item's tensor must own its bytes
        arr = arr.copy()
    return ProcessedImage(arr, (1, rh // cfg.patch_size, rw // cfg.patch_size), PixelNorm.of("image", cfg))
