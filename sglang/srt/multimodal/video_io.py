"""Video loading: an encoded file (bytes, base64, data URL, allowed local file; http(s) URLs are fetched by
the caller) decoded with PyAV, or a list of frames given as images; only the sampled frames are kept, each
resized to the model's size as it is decoded when the caller says how (`FrameFit`).

Memory: a clip's size is known before its frames are (the header gives the frame count and size, the
sampler the frames kept, `FrameFit` their size at the model's resolution), so the byte budget is checked
before the first frame is decoded; each frame is checked against the per-frame pixel limit before it is
converted, then resized and written into the one array that holds the clip. So what is held at any time is
the kept clip at the model's size plus one frame at full size: the resize reads that frame in bands of rows
and makes no full-size copy of it (`processors/video_pixels.py`), and a frame given as an image is resized
from the decoded PIL image itself, never copied out to an array first.

Blocking by design: callers run it in worker threads, never on an event loop (PyAV releases the GIL while
it demuxes and decodes). Every failure raises :class:`VideoLoadError` (an ``ImageLoadError``, so the API
answers 400) naming the problem: no video stream, an image or animated GIF sent as a video, frames that
cannot be decoded, a frame or clip over the size limits, a clip longer than the duration limit; the
`FrameFit`'s own refusals (a processor's MultimodalInputError, also a 400) pass through unchanged.
"""

from __future__ import annotations

import io
import os
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from sglang.srt.multimodal.image_io import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageLoadError,
    _check_allowed_path,
    decode_base64,
    load_image,
    read_local_file,
)

if TYPE_CHECKING:
    from PIL import Image

# (total decoded frames, stream frame rate or None) -> indices of the frames to keep
FrameSampler = Callable[[int, "float | None"], np.ndarray]

# decoded frames frame-threaded decoding may hold at once (a 1080p stream on 16 threads: ~100 MiB)
_FRAME_THREAD_BYTES = 256 << 20
# containers ffmpeg opens that hold a still image (or an animated GIF): refused as videos
_IMAGE_FORMATS = ("gif", "image2", "apng", "webp", "tiff", "bmp")


class VideoLoadError(ImageLoadError):
    """A video could not be loaded; the message says why."""


class FrameFit(Protocol):
    """The size the model takes a clip's frames at, and the resize to it (a QwenVLVideoProcessor)."""

    def resized_size(self, num_frames: int, height: int, width: int) -> tuple[int, int]: ...

    def resize_frame(self, frame: "np.ndarray | Image.Image", size: tuple[int, int]) -> np.ndarray:
        """(H, W, 3) uint8 at `size`; `frame` is an array (any strides) or an RGB PIL image."""


@dataclass(frozen=True)
class VideoLimits:
    """Per-video bounds; the server sets them from SGLANG_VIDEO_MAX_FRAME_PIXELS, SGLANG_VIDEO_MAX_SECONDS
    and SGLANG_VIDEO_MAX_BYTES (refusals name the variable)."""

    max_frame_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # width * height of one frame as decoded
    max_duration_s: float = 3600.0  # length of the clip
    # the sampled frames' float32 pixel values at the model's size (what the vision tower gets; the uint8
    # frames kept on the way are a quarter of it)
    max_sampled_bytes: int = 4 << 30


@dataclass
class DecodedVideo:
    """The sampled frames of one video and what the prompt needs to know about them."""

    frames: np.ndarray  # (T, H, W, 3) uint8
    indices: np.ndarray  # index of each kept frame among the decoded frames
    fps: float | None  # the stream's average frame rate; None when unknown (frames given as images)
    total_frames: int  # frames in the stream (or given)
    source_digest: str | None = None  # xxh3-128 of the encoded file (None: frames given decoded)
    resized: bool = False  # the frames are at the model's size already (resized on decode by a FrameFit)


@dataclass(frozen=True)
class RawVideo:
    """Every frame of a clip already decoded, with its frame rate (`sglang.Engine` callers and tests):
    sampled like a file, without PyAV."""

    frames: np.ndarray  # (T, H, W, 3) uint8
    fps: float | None = None


def is_frame_list(source: Any) -> bool:
    return isinstance(source, (list, tuple))


def video_bytes(source: Any, allowed_local_media_path: str | None = None) -> bytes:
    """The encoded file behind a video source: bytes, a data URL (`data:video/...;base64,`), a
    `file://` URL or local path (under `allowed_local_media_path` when given), or base64."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, os.PathLike):
        data = _as_video_error(read_local_file, os.fspath(source), allowed_local_media_path)
    elif isinstance(source, str):
        data = _string_to_bytes(source.strip(), allowed_local_media_path)
    else:
        raise VideoLoadError(f"unsupported video input type {type(source).__name__}: expected bytes, a base64 string, "
                             "a data URL, an http(s) URL, a local file path or a list of frames")
    if not data:
        raise VideoLoadError("empty video data")
    return data


def _as_video_error(fn, *args):
    try:
        return fn(*args)
    except VideoLoadError:
        raise
    except ImageLoadError as e:
        raise VideoLoadError(str(e).replace("image", "video")) from None


def _string_to_bytes(source: str, allowed_local_media_path: str | None) -> bytes:
    head = source[:16].lower()
    if head.startswith("data:"):
        comma = source.find(",")
        if comma < 0:
            raise VideoLoadError("malformed data URL: missing ',' separating the header from the data")
        params = [p.strip().lower() for p in source[5:comma].split(";")]
        if params[0] and not params[0].startswith("video/") and params[0] != "application/octet-stream":
            raise VideoLoadError(f"unsupported media type {params[0]!r} in a video data URL: expected video/*")
        if "base64" not in params[1:]:
            raise VideoLoadError("unsupported data URL: only base64-encoded data URLs (';base64,') are supported")
        return _as_video_error(decode_base64, source[comma + 1:])
    if head.startswith(("http://", "https://")):
        raise VideoLoadError("video URLs must be fetched before decoding (internal error)")
    if head.startswith("file://"):
        parsed = urllib.parse.urlparse(source)
        if parsed.netloc not in ("", "localhost"):
            raise VideoLoadError(f"unsupported file URL host {parsed.netloc!r}: only local files are allowed")
        return _as_video_error(read_local_file, urllib.parse.unquote(parsed.path), allowed_local_media_path)
    if len(source) <= 4096 and "\x00" not in source:
        try:
            exists = os.path.exists(os.path.expanduser(source))
        except (OSError, ValueError):
            exists = False
        if exists or source.startswith(("/", "./", "../", "~")):
            if exists:
                return _as_video_error(read_local_file, source, allowed_local_media_path)
            _as_video_error(_check_allowed_path, source, allowed_local_media_path)
            raise VideoLoadError(f"local video file not found: {source[:200]!r}")
    return _as_video_error(decode_base64, source)


def decode_video(data: bytes, sampler: FrameSampler, limits: VideoLimits = VideoLimits(),
                 fit: FrameFit | None = None) -> DecodedVideo:
    """Decode the frames `sampler` picks from the first video stream of an encoded file (resized by `fit`
    as they are decoded; without it, kept at their size)."""
    try:
        import av
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise VideoLoadError(f"video input needs PyAV (pip install av): {e}") from None
    total, fps, size = _probe(av, data, limits)
    if total == 0:
        raise VideoLoadError("the video stream holds no frames")
    indices = _sample(sampler, total, fps)
    frames, decoded = _decode_frames(av, data, indices, size, limits, fit)
    if frames is None and decoded < total and (indices >= decoded).any():
        # the header promised more frames than the stream holds: sample from what is there
        total = decoded
        if total == 0:
            raise VideoLoadError("no frame of the video could be decoded")
        indices = _sample(sampler, total, fps)
        frames, _ = _decode_frames(av, data, indices, size, limits, fit)
    if frames is None:
        raise VideoLoadError(f"the video stream ended before frame {int(indices.max())} of {total} could be decoded")
    return DecodedVideo(frames, indices, fps, total, resized=fit is not None)


def _sample(sampler: FrameSampler, total: int, fps: float | None) -> np.ndarray:
    indices = np.asarray(sampler(total, fps), dtype=np.int64)
    if (indices >= total).any() or (indices < 0).any():
        raise VideoLoadError(f"internal error: frame indices outside the {total} frames of the video")
    return indices


def pixel_bytes(num_frames: int, height: int, width: int) -> int:
    """Bytes of the float32 pixel values of `num_frames` RGB frames (what the byte budget counts)."""
    return num_frames * height * width * 3 * 4


class _Kept:
    """The sampled frames as they are kept: one (n, h, w, 3) uint8 array at the model's size, allocated
    once that size is known and only after the byte budget allows the pixel values it will make, so a
    clip over the budget is refused before a frame is decoded (or, for a list of frames, after its first)."""

    def __init__(self, n: int, source_size: tuple[int, int], fit: FrameFit | None, limits: VideoLimits):
        self.source_size, self.fit, self.filled = tuple(source_size), fit, 0
        self.size = tuple(fit.resized_size(n, *source_size)) if fit is not None else self.source_size
        need = pixel_bytes(n, *self.size)
        if need > limits.max_sampled_bytes:
            h, w = source_size
            raise VideoLoadError(f"video too large: {n} sampled frames of {self.size[1]}x{self.size[0]} (the model's "
                                 f"size for {w}x{h} frames) make {need / 2**20:.0f} MiB of float32 pixel values, above "
                                 f"the limit of {limits.max_sampled_bytes / 2**20:.0f} MiB per video "
                                 "(SGLANG_VIDEO_MAX_BYTES)")
        self.frames = np.empty((n, *self.size, 3), np.uint8)

    def put(self, positions, frame) -> None:
        """`frame`: (H, W, 3) uint8, or an RGB PIL image when there is a `fit` (which reads it)."""
        small = self.fit.resize_frame(frame, self.size) if self.fit is not None else frame
        for k in positions:
            self.frames[k] = small
        self.filled += 1


def _frame_pixels_error(what: str, w: int, h: int, limits: VideoLimits) -> VideoLoadError:
    return VideoLoadError(f"{what} too large: {w}x{h} = {w * h} pixels exceeds the limit of {limits.max_frame_pixels} "
                          "pixels per frame (SGLANG_VIDEO_MAX_FRAME_PIXELS)")


def _open(av, data: bytes):
    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except av.error.FFmpegError as e:
        raise VideoLoadError(f"not a readable video file ({len(data)} bytes, starting with {data[:8]!r}): {e}") from None
    except (ValueError, OSError) as e:
        raise VideoLoadError(f"not a readable video file ({len(data)} bytes): {e}") from None


def _video_stream(container):
    fmt = container.format.name.split(",")[0]
    if fmt in _IMAGE_FORMATS or fmt.endswith("_pipe"):
        what = "an animated GIF" if fmt == "gif" else f"a still image ({fmt})"
        raise VideoLoadError(f"the file is {what}, not a video: send it as an image")
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["none"]
        raise VideoLoadError(f"the file has no video stream (streams: {', '.join(kinds)})")
    return container.streams.video[0]


def _probe(av, data: bytes, limits: VideoLimits) -> tuple[int, float | None, tuple[int, int]]:
    """(frame count, average frame rate, (height, width)) from the header, counting packets when the
    header does not say the count."""
    with _open(av, data) as container:
        stream = _video_stream(container)
        w, h = stream.codec_context.width, stream.codec_context.height
        if w * h > limits.max_frame_pixels:
            raise _frame_pixels_error("video frames", w, h, limits)
        if w < 1 or h < 1:
            raise VideoLoadError(f"the video stream does not say its frame size ({w}x{h})")
        rate = stream.average_rate or stream.guessed_rate
        fps = float(rate) if rate else None
        total = int(stream.frames or 0)
        if total <= 0:
            try:
                total = sum(1 for packet in container.demux(stream) if packet.size)
            except av.error.FFmpegError as e:
                raise VideoLoadError(f"the video stream cannot be read: {e}") from None
        duration = None
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / 1e6
        elif fps:
            duration = total / fps
    if duration is not None and duration > limits.max_duration_s:
        raise VideoLoadError(f"video too long: {duration:.1f} s exceeds the limit of {limits.max_duration_s:g} s "
                             "(SGLANG_VIDEO_MAX_SECONDS)")
    return total, fps, (h, w)


def _decode_frames(av, data: bytes, indices: np.ndarray, size: tuple[int, int], limits: VideoLimits,
                   fit: FrameFit | None) -> tuple[np.ndarray | None, int]:
    """The frames at `indices` (in that order, repeats allowed; None when the stream ends first) and how
    many frames were decoded. `size`: the header's (height, width), which the budget is checked on."""
    wanted: dict[int, list[int]] = {}
    for k, i in enumerate(indices.tolist()):
        wanted.setdefault(i, []).append(k)
    last = max(wanted) if wanted else -1
    kept = _Kept(len(indices), size, fit, limits)
    count = 0
    with _open(av, data) as container:
        stream = _video_stream(container)
        # frame threading holds a decoded frame per thread (ffmpeg starts up to 16): used only while those
        # stay under _FRAME_THREAD_BYTES, else slice threading (one frame in flight)
        threads = min(16, (os.cpu_count() or 1) + 1)
        stream.thread_type = "AUTO" if threads * size[0] * size[1] * 3 <= _FRAME_THREAD_BYTES else "SLICE"
        try:
            for count, frame in enumerate(container.decode(stream), start=1):
                i = count - 1
                if i in wanted:
                    if frame.width * frame.height > limits.max_frame_pixels:
                        raise _frame_pixels_error(f"video frame {i}", frame.width, frame.height, limits)
                    shape = (frame.height, frame.width)
                    if shape != kept.source_size:
                        if kept.filled:
                            raise VideoLoadError(f"the video changes frame size mid-stream ({kept.source_size[1]}x"
                                                 f"{kept.source_size[0]}, then {frame.width}x{frame.height} at "
                                                 f"frame {i}): not supported")
                        kept = _Kept(len(indices), shape, fit, limits)  # the header's size was not the frames'
                    # converted only now, one frame at a time, and resized before the next is decoded; the
                    # array is a view of the RGB frame's plane (rows may be padded), read in place
                    kept.put(wanted[i], frame.to_ndarray(format="rgb24"))
                if i >= last:
                    break
        except av.error.FFmpegError as e:
            raise VideoLoadError(f"video frame {count} cannot be decoded: {e}") from None
    return (kept.frames if kept.filled == len(wanted) else None), count


def frames_from_images(frames: Sequence[Any], *,
                       allowed_local_media_path: str | None = None,
                       limits: VideoLimits = VideoLimits(),
                       fetcher: Callable[[str], bytes] | None = None,
                       fit: FrameFit | None = None) -> DecodedVideo:
    """A video given as its frames (any image input each: PIL, bytes, base64, data URL, path): every
    frame is used, in order, and all must have one size. The frame rate is unknown (None). Frames are
    decoded one at a time (each checked against the per-frame pixel limit from its header first) and
    resized by `fit` before the next; the byte budget is checked once the first frame gives the size."""
    if not frames:
        raise VideoLoadError("a video given as a list of frames needs at least one frame")
    n, kept = len(frames), None
    for i, src in enumerate(frames):
        try:
            img = load_image(src, allowed_local_media_path=allowed_local_media_path,
                             max_image_pixels=limits.max_frame_pixels, fetcher=fetcher)
        except ImageLoadError as e:
            hint = " (SGLANG_VIDEO_MAX_FRAME_PIXELS)" if "exceeds the limit" in str(e) else ""
            raise VideoLoadError(f"video frame {i}: {e}{hint}") from None
        shape = (img.height, img.width)
        if kept is None:
            kept = _Kept(n, shape, fit, limits)
        elif shape != kept.source_size:
            h0, w0 = kept.source_size
            raise VideoLoadError(f"video frame {i} is {shape[1]}x{shape[0]} but frame 0 is {w0}x{h0}: all "
                                 "frames must have one size")
        # with a fit the PIL image (4 bytes a pixel) is resized as it is: an array of it first (np.asarray
        # goes through tobytes, two more full-size copies at once) would triple the frame's cost
        kept.put([i], img if fit is not None else np.asarray(img, dtype=np.uint8))
        del img  # freed before the next frame is decoded: one full-size frame at a time
    return DecodedVideo(kept.frames, np.arange(n, dtype=np.int64), None, n, resized=fit is not None)


def load_video(source: Any, sampler: FrameSampler, *, allowed_local_media_path: str | None = None,
               limits: VideoLimits = VideoLimits(), fetcher: Callable[[str], bytes] | None = None,
               fit: FrameFit | None = None) -> DecodedVideo:
    """Any video source: a list of frames, or an encoded file (http(s) URLs through `fetcher`); the kept
    frames resized by `fit` as they are decoded."""
    if isinstance(source, RawVideo):
        frames = np.asarray(source.frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
            raise VideoLoadError(f"a RawVideo needs (T, H, W, 3) uint8 frames, got {frames.shape} {frames.dtype}")
        indices = _sample(sampler, len(frames), source.fps)
        kept = _Kept(len(indices), frames.shape[1:3], fit, limits)
        for k, i in enumerate(indices.tolist()):
            kept.put([k], frames[i])
        return DecodedVideo(kept.frames, indices, source.fps, len(frames), resized=fit is not None)
    if is_frame_list(source):
        return frames_from_images(source, allowed_local_media_path=allowed_local_media_path, limits=limits,
                                  fetcher=fetcher, fit=fit)
    if isinstance(source, str) and source[:16].lstrip().lower().startswith(("http://", "https://")):
        if fetcher is None:
            raise VideoLoadError("loading videos from http(s) URLs is not enabled here: pass the video as base64, "
                                 "a data URL or raw bytes")
        source = fetcher(source.strip())
    import xxhash

    data = video_bytes(source, allowed_local_media_path)
    video = decode_video(data, sampler, limits, fit)
    video.source_digest = xxhash.xxh3_128_hexdigest(data)  # releases the GIL; a few ms for tens of MB
    return video


__all__ = ["DecodedVideo", "FrameFit", "FrameSampler", "RawVideo", "VideoLimits", "VideoLoadError", "decode_video", "frames_from_images",
           "is_frame_list", "load_video", "video_bytes"]
