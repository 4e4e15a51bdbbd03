"""Video loading: an encoded file (bytes, base64, data URL, allowed local file; http(s) URLs are fetched by
the caller) decoded with PyAV, or a list of frames given as images; only the sampled frames are kept.

Blocking by design: callers run it in worker threads, never on an event loop (PyAV releases the GIL while
it demuxes and decodes). Every failure raises :class:`VideoLoadError` (an ``ImageLoadError``, so the API
answers 400) naming the problem: no video stream, an image or animated GIF sent as a video, frames that
cannot be decoded, a frame or clip over the size limits, a clip longer than the duration limit.
"""

from __future__ import annotations

import io
import os
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from sglang.srt.multimodal.image_io import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageLoadError,
    _check_allowed_path,
    decode_base64,
    load_image,
    read_local_file,
)

# (total decoded frames, stream frame rate or None) -> indices of the frames to keep
FrameSampler = Callable[[int, "float | None"], np.ndarray]

# containers ffmpeg opens that hold a still image (or an animated GIF): refused as videos
_IMAGE_FORMATS = ("gif", "image2", "apng", "webp", "tiff", "bmp")


class VideoLoadError(ImageLoadError):
    """A video could not be loaded; the message says why."""


@dataclass(frozen=True)
class VideoLimits:
    max_frame_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # width * height of one frame
    max_duration_s: float = 3600.0  # length of the clip
    max_sampled_bytes: int = 2 << 30  # the sampled frames as uint8 RGB, before resizing


@dataclass
class DecodedVideo:
    """The sampled frames of one video and what the prompt needs to know about them."""

    frames: np.ndarray  # (T, H, W, 3) uint8
    indices: np.ndarray  # index of each kept frame among the decoded frames
    fps: float | None  # the stream's average frame rate; None when unknown (frames given as images)
    total_frames: int  # frames in the stream (or given)
    source_digest: str | None = None  # xxh3-128 of the encoded file (None: frames given decoded)


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


def decode_video(data: bytes, sampler: FrameSampler, limits: VideoLimits = VideoLimits()) -> DecodedVideo:
    """Decode the frames `sampler` picks from the first video stream of an encoded file."""
    try:
        import av
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise VideoLoadError(f"video input needs PyAV (pip install av): {e}") from None
    total, fps = _probe(av, data, limits)
    if total == 0:
        raise VideoLoadError("the video stream holds no frames")
    indices = np.asarray(sampler(total, fps), dtype=np.int64)
    frames, decoded = _decode_frames(av, data, indices, limits)
    if (indices >= total).any() or (indices < 0).any():
        raise VideoLoadError(f"internal error: frame indices outside the {total} frames of the video")
    if decoded < total and (indices >= decoded).any():
        # the header promised more frames than the stream holds: sample from what is there
        total = decoded
        if total == 0:
            raise VideoLoadError("no frame of the video could be decoded")
        indices = np.asarray(sampler(total, fps), dtype=np.int64)
        frames, _ = _decode_frames(av, data, indices, limits)
    if len(frames) != len(indices):
        raise VideoLoadError(f"the video stream ended before frame {int(indices.max())} of {total} could be decoded")
    return DecodedVideo(frames, indices, fps, total)


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


def _probe(av, data: bytes, limits: VideoLimits) -> tuple[int, float | None]:
    """(frame count, average frame rate) from the header, counting packets when the header does not say."""
    with _open(av, data) as container:
        stream = _video_stream(container)
        w, h = stream.codec_context.width, stream.codec_context.height
        if w * h > limits.max_frame_pixels:
            raise VideoLoadError(f"video frames too large: {w}x{h} = {w * h} pixels exceeds the limit of "
                                 f"{limits.max_frame_pixels} pixels per frame")
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
        raise VideoLoadError(f"video too long: {duration:.1f} s exceeds the limit of {limits.max_duration_s:g} s")
    return total, fps


def _decode_frames(av, data: bytes, indices: np.ndarray, limits: VideoLimits) -> tuple[np.ndarray, int]:
    """The frames at `indices` (in that order, repeats allowed) and how many frames were decoded."""
    wanted = set(int(i) for i in indices)
    last = max(wanted) if wanted else -1
    kept: dict[int, np.ndarray] = {}
    count = 0
    with _open(av, data) as container:
        stream = _video_stream(container)
        stream.thread_type = "AUTO"
        budget = limits.max_sampled_bytes
        try:
            for count, frame in enumerate(container.decode(stream), start=1):
                i = count - 1
                if i in wanted:
                    if frame.width * frame.height > limits.max_frame_pixels:
                        raise VideoLoadError(f"video frame {i} too large: {frame.width}x{frame.height}")
                    arr = frame.to_ndarray(format="rgb24")
                    budget -= arr.nbytes
                    if budget < 0:
                        raise VideoLoadError(f"video too large: {len(wanted)} sampled frames of {frame.width}x"
                                             f"{frame.height} exceed {limits.max_sampled_bytes >> 20} MiB")
                    kept[i] = arr
                if i >= last:
                    break
        except av.error.FFmpegError as e:
            raise VideoLoadError(f"video frame {count} cannot be decoded: {e}") from None
    if len(kept) < len(wanted):
        return np.zeros((0, 0, 0, 3), np.uint8), count
    shapes = {a.shape for a in kept.values()}
    if len(shapes) > 1:
        raise VideoLoadError(f"the video changes frame size mid-stream ({sorted(shapes)[:2]}): not supported")
    return np.stack([kept[int(i)] for i in indices]), count


def frames_from_images(frames: Sequence[Any], *,
                       allowed_local_media_path: str | None = None,
                       limits: VideoLimits = VideoLimits(),
                       fetcher: Callable[[str], bytes] | None = None) -> DecodedVideo:
    """A video given as its frames (any image input each: PIL, bytes, base64, data URL, path): every
    frame is used, in order, and all must have one size. The frame rate is unknown (None)."""
    if not frames:
        raise VideoLoadError("a video given as a list of frames needs at least one frame")
    arrays = []
    for i, src in enumerate(frames):
        try:
            img = load_image(src, allowed_local_media_path=allowed_local_media_path,
                             max_image_pixels=limits.max_frame_pixels, fetcher=fetcher)
        except ImageLoadError as e:
            raise VideoLoadError(f"video frame {i}: {e}") from None
        arrays.append(np.asarray(img, dtype=np.uint8))
        if arrays[-1].shape != arrays[0].shape:
            raise VideoLoadError(f"video frame {i} is {arrays[-1].shape[1]}x{arrays[-1].shape[0]} but frame 0 is "
                                 f"{arrays[0].shape[1]}x{arrays[0].shape[0]}: all frames must have one size")
    if sum(a.nbytes for a in arrays) > limits.max_sampled_bytes:
        raise VideoLoadError(f"video too large: {len(arrays)} frames exceed {limits.max_sampled_bytes >> 20} MiB")
    n = len(arrays)
    return DecodedVideo(np.stack(arrays), np.arange(n, dtype=np.int64), None, n)


def load_video(source: Any, sampler: FrameSampler, *, allowed_local_media_path: str | None = None,
               limits: VideoLimits = VideoLimits(), fetcher: Callable[[str], bytes] | None = None) -> DecodedVideo:
    """Any video source: a list of frames, or an encoded file (http(s) URLs through `fetcher`)."""
    if isinstance(source, RawVideo):
        frames = np.asarray(source.frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
            raise VideoLoadError(f"a RawVideo needs (T, H, W, 3) uint8 frames, got {frames.shape} {frames.dtype}")
        indices = np.asarray(sampler(len(frames), source.fps), dtype=np.int64)
        return DecodedVideo(frames[indices], indices, source.fps, len(frames))
    if is_frame_list(source):
        return frames_from_images(source, allowed_local_media_path=allowed_local_media_path, limits=limits,
                                  fetcher=fetcher)
    if isinstance(source, str) and source[:16].lstrip().lower().startswith(("http://", "https://")):
        if fetcher is None:
            raise VideoLoadError("loading videos from http(s) URLs is not enabled here: pass the video as base64, "
                                 "a data URL or raw bytes")
        source = fetcher(source.strip())
    import xxhash

    data = video_bytes(source, allowed_local_media_path)
    video = decode_video(data, sampler, limits)
    video.source_digest = xxhash.xxh3_128_hexdigest(data)  # releases the GIL; a few ms for tens of MB
    return video


__all__ = ["DecodedVideo", "FrameSampler", "RawVideo", "VideoLimits", "VideoLoadError", "decode_video", "frames_from_images",
           "is_frame_list", "load_video", "video_bytes"]
