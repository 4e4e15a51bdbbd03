"""Who decides how an image is resized: the model's preprocessor config, then the server's environment
(upstream's SGLANG_IMAGE_MAX_PIXELS and SGLANG_RESIZE_RESAMPLE), then the request
(`mm_processor_kwargs` / `images_config`: max_pixels, min_pixels).

The server's settings are applied once, when the processor is built; a request's settings give that
request its own (frozen) image processor config. A request may lower the pixel budget or raise the floor,
never raise the server's ceiling: a key this server does not know, or a value outside the bounds, is a
`MultimodalInputError` (400) naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from PIL import Image

from sglang.srt.environ import RESAMPLE_NAMES, envs
from sglang.srt.multimodal.processors.base import MultimodalInputError

# SGLANG_RESIZE_RESAMPLE takes the names upstream looks up on PIL.Image
RESAMPLE_FILTERS = {name: int(getattr(Image.Resampling, name)) for name in RESAMPLE_NAMES}
# the keys a request may set, for Qwen-VL image processors
REQUEST_KEYS = ("max_pixels", "min_pixels")


def apply_server_overrides(cfg, max_pixels: int | None = None, resample: str | None = None):
    """The model's image processor config under the server's environment (SGLANG_IMAGE_MAX_PIXELS,
    SGLANG_RESIZE_RESAMPLE unless given): max_pixels capped (it never grows), the resampling filter
    replaced. A cap below the model's min_pixels is refused."""
    max_pixels = envs.SGLANG_IMAGE_MAX_PIXELS.get() if max_pixels is None else max_pixels
    resample = envs.SGLANG_RESIZE_RESAMPLE.get() if resample is None else resample
    changes: dict[str, Any] = {}
    if max_pixels is not None:
        if max_pixels < cfg.min_pixels:
            raise ValueError(f"SGLANG_IMAGE_MAX_PIXELS={max_pixels} is below the model's min_pixels "
                             f"{cfg.min_pixels}: images could not be sized")
        if max_pixels < cfg.max_pixels:
            changes["max_pixels"] = max_pixels
    if resample:
        changes["resample"] = RESAMPLE_FILTERS[resample]
    return dataclasses.replace(cfg, **changes) if changes else cfg


def request_image_config(cfg, kwargs: Mapping[str, Any] | None, name: str = "mm_processor_kwargs"):
    """`cfg` with one request's overrides (None or {}: `cfg` itself). `name` is the request field that
    carried them (`mm_processor_kwargs` or `images_config`), for the error messages."""
    if not kwargs:
        return cfg
    if not isinstance(kwargs, Mapping):
        raise MultimodalInputError(f"{name} must be an object, got {type(kwargs).__name__}")
    unknown = sorted(set(kwargs) - set(REQUEST_KEYS))
    if unknown:
        raise MultimodalInputError(f"{name}.{unknown[0]} is not supported: this server takes "
                                   f"{', '.join(REQUEST_KEYS)} for images")
    changes = {}
    for key in REQUEST_KEYS:
        value = kwargs.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise MultimodalInputError(f"{name}.{key} must be a positive integer number of pixels, got {value!r}")
        changes[key] = value
    if changes.get("max_pixels", 0) > cfg.max_pixels:
        raise MultimodalInputError(f"{name}.max_pixels {changes['max_pixels']} is above this server's limit of "
                                   f"{cfg.max_pixels} pixels (the model's preprocessor config, capped by "
                                   "SGLANG_IMAGE_MAX_PIXELS)")
    lo, hi = changes.get("min_pixels", cfg.min_pixels), changes.get("max_pixels", cfg.max_pixels)
    if lo > hi:
        raise MultimodalInputError(f"{name}: min_pixels {lo} is above max_pixels {hi}")
    return dataclasses.replace(cfg, **changes) if changes else cfg
