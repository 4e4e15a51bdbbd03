"""Image loading: raw bytes, base64 strings, data URLs, local paths, PIL images.

Every failure raises :class:`ImageLoadError` (a ``ValueError``) whose message
names the problem, so the API layer can turn it into a 400 response.

All functions here are pure (no global state is modified), so they can run in
worker threads.
"""

from __future__ import annotations

import binascii
import io
import os
import urllib.parse
from typing import Callable, Union

from PIL import Image, ImageOps, UnidentifiedImageError

try:  # pybase64 is much faster for multi-megabyte payloads
    import pybase64 as _b64
except ImportError:  # pragma: no cover
    import base64 as _b64  # type: ignore[no-redef]


DEFAULT_MAX_IMAGE_PIXELS = 8192 * 8192

# Longest string that is still considered as a possible filesystem path.
_MAX_PATH_LEN = 4096

# Formats we let PIL decode. Formats that shell out to external programs (EPS via
# Ghostscript), that are only stubs (BUFR, GRIB, HDF5, WMF on non-Windows) or that
# are not images for our purposes (MPEG, IPTC, FITS...) are left out.
_DEFAULT_FORMATS = (
    "PNG",
    "JPEG",
    "GIF",
    "BMP",
    "DIB",
    "WEBP",
    "TIFF",
    "ICO",
    "CUR",
    "PPM",
    "TGA",
    "JPEG2000",
    "AVIF",
    "PCX",
    "SGI",
    "QOI",
    "PSD",
    "ICNS",
    "DDS",
    "IM",
    "XBM",
    "XPM",
    "SUN",
    "MSP",
    "BLP",
)


def _available_formats() -> tuple[str, ...]:
    Image.init()
    return tuple(f for f in _DEFAULT_FORMATS if f in Image.OPEN)


ALLOWED_IMAGE_FORMATS: tuple[str, ...] = _available_formats()

_B64_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_")
_WHITESPACE_TABLE = {ord(c): None for c in " \t\r\n\f\v"}

ImageInput = Union[bytes, bytearray, memoryview, str, os.PathLike, Image.Image]
# fetches an http(s) URL and returns the body (see sglang.srt.multimodal.media_fetch)
UrlFetcher = Callable[[str], bytes]


class ImageLoadError(ValueError):
    """An image could not be loaded; the message says why."""


# --------------------------------------------------------------------------- #
# Public API
# --------------------------------------------------------------------------- #


def load_image(
    source: ImageInput,
    *,
    allowed_local_media_path: str | None = None,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    apply_exif_orientation: bool = True,
    convert_rgb: bool = True,
    allowed_formats: tuple[str, ...] | None = None,
    fetcher: UrlFetcher | None = None,
) -> Image.Image:
    """Load an image from any supported source and return a fully decoded PIL image.

    Sources:
      * ``bytes`` / ``bytearray`` / ``memoryview``: encoded image file contents;
      * ``str`` starting with ``data:``: a base64 data URL (``data:image/png;base64,...``);
      * ``str`` starting with ``http://`` / ``https://``: fetched with ``fetcher`` (refused without one);
      * ``str`` starting with ``file://``, an existing path, or an ``os.PathLike``: a local file,
        which must lie inside ``allowed_local_media_path`` when that is given;
      * any other ``str``: base64-encoded image bytes (whitespace is ignored);
      * ``PIL.Image.Image``: used as is (still checked, loaded and converted).

    The result is converted to RGB exactly like transformers' ``convert_to_rgb``
    (transparency composited onto white) unless ``convert_rgb`` is False, and the
    EXIF orientation is applied (as transformers' ``load_image`` does) unless
    ``apply_exif_orientation`` is False.
    """
    if isinstance(source, Image.Image):
        image = source
        _check_size(image, max_image_pixels)
        try:
            image.load()
        except Exception as e:  # noqa: BLE001
            raise ImageLoadError(f"corrupt or truncated image data: {e}") from e
    elif isinstance(source, (bytes, bytearray, memoryview)):
        image = decode_image_bytes(
            bytes(source), max_image_pixels=max_image_pixels, allowed_formats=allowed_formats
        )
    elif isinstance(source, os.PathLike):
        data = read_local_file(os.fspath(source), allowed_local_media_path)
        image = decode_image_bytes(data, max_image_pixels=max_image_pixels, allowed_formats=allowed_formats)
    elif isinstance(source, str):
        data = _string_to_bytes(source, allowed_local_media_path, fetcher)
        image = decode_image_bytes(data, max_image_pixels=max_image_pixels, allowed_formats=allowed_formats)
    else:
        raise ImageLoadError(
            f"unsupported image input type {type(source).__name__}: expected bytes, a base64 string, "
            "a data URL, a local file path or a PIL image"
        )

    if apply_exif_orientation:
        image = _apply_exif_orientation(image)
    if convert_rgb:
        image = to_rgb(image)
    return image


def load_image_bytes(
    source: ImageInput,
    *,
    allowed_local_media_path: str | None = None,
    fetcher: UrlFetcher | None = None,
) -> bytes | None:
    """The encoded file behind ``source`` (the first step of ``load_image``, same sources, same
    errors), or None for a ``PIL.Image.Image``, which has no encoded form."""
    if isinstance(source, Image.Image):
        return None
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, os.PathLike):
        return read_local_file(os.fspath(source), allowed_local_media_path)
    if isinstance(source, str):
        return _string_to_bytes(source, allowed_local_media_path, fetcher)
    raise ImageLoadError(
        f"unsupported image input type {type(source).__name__}: expected bytes, a base64 string, "
        "a data URL, a local file path or a PIL image"
    )


def decode_image_bytes(
    data: bytes,
    *,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    allowed_formats: tuple[str, ...] | None = None,
) -> Image.Image:
    """Decode encoded image bytes into a fully loaded PIL image (mode unchanged)."""
    if not data:
        raise ImageLoadError("empty image data")
    formats = ALLOWED_IMAGE_FORMATS if allowed_formats is None else allowed_formats
    try:
        image = Image.open(io.BytesIO(data), formats=list(formats))
    except UnidentifiedImageError as e:
        raise ImageLoadError(
            f"unsupported or unrecognized image format ({len(data)} bytes, starting with {data[:8]!r}); "
            f"supported formats: {', '.join(formats)}"
        ) from e
    except Image.DecompressionBombError as e:
        raise ImageLoadError(f"image rejected as a decompression bomb: {e}") from e
    except Exception as e:  # noqa: BLE001  (PIL raises many types for broken headers)
        raise ImageLoadError(f"corrupt or truncated image data: {type(e).__name__}: {e}") from e

    _check_size(image, max_image_pixels)
    try:
        image.load()
    except Image.DecompressionBombError as e:
        raise ImageLoadError(f"image rejected as a decompression bomb: {e}") from e
    except Exception as e:  # noqa: BLE001  (OSError "image file is truncated", SyntaxError, ...)
        raise ImageLoadError(
            f"corrupt or truncated image data ({image.format} {image.size[0]}x{image.size[1]}): "
            f"{type(e).__name__}: {e}"
        ) from e
    return image


def decode_base64(data: str) -> bytes:
    """Decode standard or URL-safe base64, ignoring whitespace and missing padding."""
    s = data.translate(_WHITESPACE_TABLE)
    if not s:
        raise ImageLoadError("invalid base64 image data: empty string")
    urlsafe = ("-" in s or "_" in s) and "+" not in s and "/" not in s
    rem = len(s.rstrip("=")) % 4
    if rem == 1:
        raise ImageLoadError(f"invalid base64 image data: bad length {len(s)}")
    s = s.rstrip("=") + "=" * ((4 - rem) % 4)
    try:
        if urlsafe:
            return _b64.urlsafe_b64decode(s)
        return _b64.b64decode(s, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageLoadError(f"invalid base64 image data: {e}") from e


def read_local_file(path: str, allowed_local_media_path: str | None = None) -> bytes:
    """Read a local file, refusing paths outside ``allowed_local_media_path`` when given."""
    real = _check_allowed_path(path, allowed_local_media_path)
    if not os.path.exists(real):
        raise ImageLoadError(f"local image file not found: {path!r}")
    if not os.path.isfile(real):
        raise ImageLoadError(f"local image path is not a regular file: {path!r}")
    try:
        with open(real, "rb") as f:
            return f.read()
    except OSError as e:
        raise ImageLoadError(f"cannot read local image file {path!r}: {e}") from e


def _check_allowed_path(path: str, allowed_local_media_path: str | None) -> str:
    """Resolve ``path`` (symlinks too) and refuse it if outside the allowed root; return the real path."""
    if "\x00" in path:
        raise ImageLoadError("invalid local image path: contains a NUL byte")
    real = os.path.realpath(os.path.expanduser(path))
    if allowed_local_media_path is not None:
        root = os.path.realpath(os.path.expanduser(allowed_local_media_path))
        try:
            inside = os.path.commonpath([real, root]) == root
        except ValueError:  # different drives on Windows
            inside = False
        if not inside:
            raise ImageLoadError(
                f"local image path {path!r} is outside the allowed local media path "
                f"{allowed_local_media_path!r}"
            )
    return real


def is_local_path_source(source: str) -> bool:
    """True when ``load_image`` would read ``source`` (a string) from the local filesystem."""
    head = source[:16].lstrip().lower()
    if head.startswith("file://"):
        return True
    if head.startswith(("data:", "http://", "https://")) or len(source) > _MAX_PATH_LEN or "\x00" in source:
        return False
    try:
        if os.path.exists(os.path.expanduser(source)):
            return True
    except (OSError, ValueError):
        pass
    return bool(source.strip()) and _looks_like_path(source)


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert to RGB exactly as transformers' ``convert_to_rgb`` does for PIL images.

    Images with an alpha band (``"A"`` in ``getbands()``, e.g. RGBA, LA, PA) or a
    ``transparency`` entry in ``info`` (palette / color-key transparency) are
    converted to RGBA and alpha-composited onto an opaque white background; all
    other modes go through ``Image.convert("RGB")`` (so 16-bit ``I;16`` values
    above 255 saturate, as in the reference).
    """
    try:
        has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
        if has_alpha:
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(background, rgba).convert("RGB")
        if image.mode == "RGB":
            return image
        return image.convert("RGB")
    except (ValueError, OSError) as e:
        raise ImageLoadError(f"cannot convert image of mode {image.mode!r} to RGB: {e}") from e


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #


def _check_size(image: Image.Image, max_image_pixels: int | None) -> None:
    width, height = image.size
    if width < 1 or height < 1:
        raise ImageLoadError(f"image too small: {width}x{height} (each side must be at least 1 pixel)")
    if max_image_pixels is not None and width * height > max_image_pixels:
        raise ImageLoadError(
            f"image too large (possible decompression bomb): {width}x{height} = {width * height} pixels "
            f"exceeds the limit of {max_image_pixels} pixels"
        )


def _apply_exif_orientation(image: Image.Image) -> Image.Image:
    try:
        orientation = image.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001  (broken EXIF must not fail the request)
        return image
    if orientation in (2, 3, 4, 5, 6, 7, 8):
        try:
            return ImageOps.exif_transpose(image)
        except Exception:  # noqa: BLE001
            return image
    return image


def _parse_data_url(url: str) -> bytes:
    comma = url.find(",")
    if comma < 0:
        raise ImageLoadError("malformed data URL: missing ',' separating the header from the data")
    header = url[5:comma]
    params = [p.strip().lower() for p in header.split(";")]
    media_type = params[0]
    if media_type and not media_type.startswith("image/"):
        raise ImageLoadError(f"unsupported media type {media_type!r} in data URL: expected image/*")
    if "base64" not in params[1:]:
        raise ImageLoadError("unsupported data URL: only base64-encoded data URLs (';base64,') are supported")
    return decode_base64(url[comma + 1 :])


def _looks_like_path(s: str) -> bool:
    """A string that cannot be base64 (has characters outside the alphabet) is taken as a path."""
    stripped = s.translate(_WHITESPACE_TABLE)
    return any(c not in _B64_CHARS for c in stripped) or s.startswith(("./", "../", "~"))


def _string_to_bytes(source: str, allowed_local_media_path: str | None, fetcher: UrlFetcher | None = None) -> bytes:
    head = source[:16].lstrip().lower()
    if head.startswith("data:"):
        return _parse_data_url(source.lstrip())
    if head.startswith(("http://", "https://")):
        if fetcher is None:
            raise ImageLoadError(
                "loading images from http(s) URLs is not enabled here: pass the image as base64, "
                "a data URL or raw bytes"
            )
        return fetcher(source.strip())
    if head.startswith("file://"):
        parsed = urllib.parse.urlparse(source.strip())
        if parsed.netloc not in ("", "localhost"):
            raise ImageLoadError(f"unsupported file URL host {parsed.netloc!r}: only local files are allowed")
        return read_local_file(urllib.parse.unquote(parsed.path), allowed_local_media_path)
    if not source.strip():
        raise ImageLoadError("empty image string")
    if len(source) <= _MAX_PATH_LEN and "\x00" not in source:
        try:
            exists = os.path.exists(os.path.expanduser(source))
        except (OSError, ValueError):
            exists = False
        if exists:
            return read_local_file(source, allowed_local_media_path)
        if _looks_like_path(source):
            _check_allowed_path(source, allowed_local_media_path)
            raise ImageLoadError(
                f"local image file not found: {source[:200]!r} (and the string is not valid base64 "
                "image data either: it contains characters outside the base64 alphabet)"
            )
    elif _looks_like_path(source):
        raise ImageLoadError("invalid base64 image data: contains characters outside the base64 alphabet")
    return decode_base64(source)
