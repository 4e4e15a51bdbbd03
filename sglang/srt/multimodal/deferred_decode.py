"""Deferred image decoding (SGLANG_GPU_IMAGE_DECODE): JPEGs travel compressed and are decoded where the
vision tower runs.

Tokenizer side (`defer_jpeg`, in the image worker threads): only the JPEG header is read
(`jpeg_header.py`): EXIF-oriented size -> `smart_resize` target -> grid and placeholder count. The item
carries an `EncodedImage` (the file's bytes, the target size, the orientation, the processor config)
instead of float32 pixels. Anything that is not a plain JPEG, and every image the full decode would
refuse (too large, aspect ratio, truncated...), takes today's path (PIL in the tokenizer), so errors
and their messages are unchanged.

Vision side (`materialize_pixels`, called by the model's `get_image_feature`): the batch's encoded
images are decoded together:
- CUDA with torchvision: `torchvision.io.decode_jpeg(list, device="cuda")` (nvJPEG, batched), then
  on the device: EXIF orientation (flips / transposes), bicubic antialiased resize in two passes
  rounded to uint8 between them like PIL's, the exact per-channel normalize table, patchify;
- otherwise (CPU, or no torchvision, or an image nvJPEG refuses): PIL in this process with the
  tokenizer path's own code (`load_image` + `resize_and_patchify`), so pixel_values are bit-identical
  to the baseline's.
Every fallback reason is counted (`stats()`) and logged once per process.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import threading
from collections import Counter

import numpy as np
import torch

from sglang.srt.multimodal.image_io import ALLOWED_IMAGE_FORMATS, ImageLoadError, load_image
from sglang.srt.multimodal.jpeg_header import JpegHeaderError, is_jpeg, parse_jpeg_header
from sglang.srt.multimodal.mm_types import EncodedImage
from sglang.srt.multimodal.still_images import concat_pixel_rows

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_logged: set[str] = set()


def _note(event: str, fallback: bool = True) -> None:
    """Counts an event; each kind is logged the first time it happens in this process."""
    with _lock:
        _counts[event] += 1
        first = event not in _logged
        if first:
            _logged.add(event)
    if first:
        logger.info("deferred image decode: %s%s (logged once; counts in deferred_decode.stats())", event,
                    " -> falls back" if fallback else "")


def stats() -> dict[str, int]:
    """Counts of deferred / decoded images and of each fallback reason, in this process."""
    with _lock:
        return dict(_counts)


def reset_stats() -> None:
    with _lock:
        _counts.clear()
        _logged.clear()


def torchvision_available() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def deferred_decode_enabled(device: str) -> bool:
    """SGLANG_GPU_IMAGE_DECODE for a model running on `device`: 0 off (baseline), 1 on, auto on where
    the model runs on CUDA and torchvision (nvJPEG) is installed. The only reader of the switch."""
    from sglang.srt.environ import envs

    mode = envs.SGLANG_GPU_IMAGE_DECODE.get()
    if mode == "auto":
        return device == "cuda" and torchvision_available()
    return mode == "1"


# ---------------------------------------------------------------------- tokenizer side
def defer_jpeg(data: bytes, cfg, max_image_pixels: int | None) -> EncodedImage | None:
    """An `EncodedImage` sized from the header alone, or None where today's path must run."""
    if not is_jpeg(data) or "JPEG" not in ALLOWED_IMAGE_FORMATS:
        _note("not a JPEG")
        return None
    try:
        hdr = parse_jpeg_header(data)
    except JpegHeaderError:
        _note("unreadable JPEG header")
        return None
    reason = hdr.simple_reason()
    if reason is not None:
        _note(reason)
        return None
    if max_image_pixels is not None and hdr.width * hdr.height > max_image_pixels:
        return None  # the full path refuses it with its own message
    ow, oh = hdr.oriented_size
    try:
        rh, rw = cfg.get_resized_size(oh, ow)
    except ValueError:  # SmartResizeError: the full path raises it as an ImageLoadError
        return None
    p, m = cfg.patch_size, cfg.merge_size
    if rh % (p * m) or rw % (p * m):
        return None
    orientation = hdr.orientation if 1 <= hdr.orientation <= 8 else 1
    _note("deferred", fallback=False)
    return EncodedImage(data, (rh, rw), (1, rh // p, rw // p), orientation, cfg)


# ---------------------------------------------------------------------- vision side
def materialize_pixels(items: list, device) -> torch.Tensor:
    """The concatenated pixel_values of `items` on `device`: float32 tensors as they are, encoded images
    decoded (batched) first, uint8 ones (SGLANG_MM_UINT8_PIXELS) normalized (`raw_pixels.item_pixels`)."""
    from sglang.srt.multimodal.raw_pixels import item_pixels

    encoded = [it for it in items if isinstance(it.feature, EncodedImage)]
    errors: dict[int, str] = {}
    decoded = iter(decode_images([it.feature for it in encoded], device, errors))
    for i, message in errors.items():
        encoded[i].decode_error = message
    parts = [next(decoded) if isinstance(it.feature, EncodedImage) else item_pixels(it, device) for it in items]
    return concat_pixel_rows(parts)  # compact still images beside full rows are widened (still_images.py)


def decode_images(encs: list[EncodedImage], device, errors: dict[int, str] | None = None) -> list[torch.Tensor]:
    """pixel_values (num_patches, C*T*P*P) float32 on `device` for each encoded image; one that cannot be
    decoded is blank and its index -> reason goes to `errors`."""
    device = torch.device(device)
    out: list[torch.Tensor | None] = [None] * len(encs)
    if encs and device.type == "cuda":
        if torchvision_available():
            for i, u8 in _nvjpeg_decode(encs, device).items():
                out[i] = device_pixels(u8, encs[i], device)
                _note("decoded nvjpeg", fallback=False)
        else:
            _note("no torchvision for nvJPEG")
    for i, enc in enumerate(encs):
        if out[i] is None:
            pixels, error = _pil_or_blank(enc)
            out[i] = pixels.to(device)
            if error is not None and errors is not None:
                errors[i] = error
    return out  # type: ignore[return-value]


def pil_pixels(enc: EncodedImage) -> torch.Tensor:
    """The tokenizer path's own decode and preprocessing, run here: bit-identical pixel_values. A JPEG
    broken past its header gives a blank image (the batch goes on)."""
    return _pil_or_blank(enc)[0]


def _pil_or_blank(enc: EncodedImage) -> tuple[torch.Tensor, str | None]:
    """(pixel_values, None), or (a blank image, the reason) when the scan data is broken."""
    try:
        return strict_pil_pixels(enc), None
    except ImageLoadError as e:  # passed the header checks, broken inside the entropy-coded data
        _note("decode error")
        logger.error("deferred image decode failed (%s); its request ends with a 400", e)
        return _blank(enc), str(e)


def decode_failure(mm_inputs) -> str | None:
    """The 400 message of a request one of whose deferred images could not be decoded, else None."""
    if mm_inputs is None:
        return None
    for k, item in enumerate(mm_inputs.mm_items):
        if item.decode_error is not None:
            return f"image {k} could not be decoded: {item.decode_error}"
    return None


def strict_pil_pixels(enc: EncodedImage) -> torch.Tensor:
    """`pil_pixels`, but a JPEG broken past its header raises ImageLoadError (a ValueError) instead of
    becoming a blank image: where the caller can still answer the request 400 (the EPD encoder)."""
    from sglang.srt.multimodal.processors.qwen_image import resize_and_patchify

    cfg = enc.processor
    rh, rw = enc.target_hw
    image = load_image(enc.data, max_image_pixels=None, allowed_formats=("JPEG",))
    w, h = image.size
    try:
        size = cfg.get_resized_size(h, w)
    except ValueError:
        size = None
    if size != (rh, rw):  # the header said otherwise: keep the placeholder count, resize to the target
        _note("header size differs from the decoded size")
    pv, _ = resize_and_patchify(image, cfg, rh, rw)
    _note("decoded pil", fallback=False)
    return torch.from_numpy(pv)


def _blank(enc: EncodedImage) -> torch.Tensor:
    cfg = enc.processor
    t, gh, gw = enc.grid_thw
    return torch.zeros(t * gh * gw, 3 * cfg.temporal_patch_size * cfg.patch_size**2, dtype=torch.float32)


def _nvjpeg_decode(encs: list[EncodedImage], device: torch.device) -> dict[int, torch.Tensor]:
    """index -> (3, H, W) uint8 RGB on `device` for every image nvJPEG decodes; the others are missing."""
    from torchvision.io import ImageReadMode, decode_jpeg

    datas = [torch.frombuffer(bytearray(e.data), dtype=torch.uint8) for e in encs]
    try:
        return dict(enumerate(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)))
    except Exception:  # noqa: BLE001  one refused image fails the batch: retry one by one
        pass
    out = {}
    for i, d in enumerate(datas):
        try:
            out[i] = decode_jpeg(d, mode=ImageReadMode.RGB, device=device)
        except Exception:  # noqa: BLE001
            _note("nvJPEG refused the image")
    return out


# ---------------------------------------------------------------------- device pipeline
def orient_chw(x: torch.Tensor, orientation: int) -> torch.Tensor:
    """Applies an EXIF orientation to a (C, H, W) tensor, as PIL's `ImageOps.exif_transpose` does."""
    if orientation == 2:
        return x.flip(-1)
    if orientation == 3:
        return x.flip(-1, -2)
    if orientation == 4:
        return x.flip(-2)
    if orientation == 5:
        return x.transpose(-1, -2)
    if orientation == 6:
        return x.transpose(-1, -2).flip(-1)
    if orientation == 7:
        return x.transpose(-1, -2).flip(-1, -2)
    if orientation == 8:
        return x.transpose(-1, -2).flip(-2)
    return x


def resize_like_pil(x: torch.Tensor, rh: int, rw: int) -> torch.Tensor:
    """(C, H, W) uint8 -> (C, rh, rw) uint8: bicubic (a = -0.5) with antialiasing as two 1-D passes, each
    rounded to uint8 like PIL's resampler. The pass order matters where the first pass clips overshoot;
    measured against Pillow 13 on random sizes, it runs the horizontal pass first unless the vertical
    kernel is wider (91-97.5% of shape pairs; the others differ by a few levels near clipped edges). PIL's
    coefficients are fixed-point, so a value may also differ by one level."""
    _, h, w = x.shape
    if (h, w) == (rh, rw):
        return x
    y = x.float()[None]
    vertical_first = _kernel_size(h, rh) > _kernel_size(w, rw)
    sizes = [(rh, w), (rh, rw)] if vertical_first else [(h, rw), (rh, rw)]
    for size in sizes:
        if tuple(y.shape[2:]) != size:
            y = torch.nn.functional.interpolate(y, size=size, mode="bicubic", antialias=True, align_corners=False)
            y = y.round_().clamp_(0, 255)
    return y[0].to(torch.uint8)


def _kernel_size(n_in: int, n_out: int) -> int:
    """Taps of PIL's bicubic kernel (support 2) for one axis, widened by the downscale factor."""
    return math.ceil(2 * max(n_in / n_out, 1.0)) * 2 + 1


_lut_cache: dict = {}


def _device_lut(cfg, device: torch.device) -> torch.Tensor:
    # keyed by what the table depends on: requests with their own max_pixels share one table
    key = (cfg.do_rescale, cfg.rescale_factor, cfg.do_normalize, cfg.image_mean, cfg.image_std, str(device))
    lut = _lut_cache.get(key)
    if lut is None:
        lut = torch.from_numpy(np.ascontiguousarray(cfg._lut)).to(device)
        _lut_cache[key] = lut
    return lut


def device_pixels(rgb: torch.Tensor, enc: EncodedImage, device) -> torch.Tensor:
    """(3, H, W) uint8 RGB as decoded (not oriented) -> pixel_values, all on the tensor's device:
    orient, resize to the target, the processor's exact normalize table, patchify in merge-window order
    with the still image repeated over the temporal patch."""
    cfg = enc.processor
    rh, rw = enc.target_hw
    x = orient_chw(rgb, enc.orientation)
    if cfg.do_resize or x.shape[1:] != (rh, rw):
        x = resize_like_pil(x, rh, rw)
    p, m, T = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    gh, gw = rh // p, rw // p
    lut = _device_lut(cfg, x.device)
    vals = lut.gather(1, x.reshape(3, -1).long()).view(3, gh // m, m, p, gw // m, m, p)
    # (C, gh/m, m, p, gw/m, m, p) -> (gh/m, gw/m, m, m, C, p, p), then T copies
    vals = vals.permute(1, 4, 2, 5, 0, 3, 6).unsqueeze(5).expand(gh // m, gw // m, m, m, 3, T, p, p)
    return vals.reshape(gh * gw, 3 * T * p * p).contiguous()
