"""Qwen2.5-VL / Qwen3-VL video preprocessing: which frames are taken, how they are sized, and the pixel
tensor the vision tower receives; the same algorithm as transformers' `Qwen2VLVideoProcessor` and
`Qwen3VLVideoProcessor` (which need torchvision, so they are re-implemented here on torch alone).

1. frame sampling (`sample_indices`), from the stream's frame count and frame rate:
   - qwen3: `n = int(total / video_fps * fps)` clamped to [min_frames, max_frames] and to `total`,
     indices `linspace(0, total - 1, n)` rounded;
   - qwen2 (Qwen2/2.5-VL): `n = total / video_fps * fps` clamped to [min_frames, max_frames'] and to
     `total`, floored to a multiple of `temporal_patch_size` (max_frames' = max_frames and total floored
     the same way), indices `arange(0, total, total / n)` truncated (float32 arange, as torch computes it);
2. resize of every frame to one size, multiples of `patch_size * merge_size`:
   - qwen3: `smart_resize` over the whole clip (the pixel budget counts every sampled frame);
   - qwen2: the image `smart_resize` per frame;
   with torch's antialiased bicubic on uint8 (what torchvision's resize runs on CPU tensors), each frame as
   it is decoded (the size is known once the stream is probed), so a clip is never held at full size;
3. `(x - mean * 255) / (std * 255)` in float32 (transformers' fused rescale + normalize);
4. patchify into `(grid_t * grid_h * grid_w, C * T * P * P)` after repeating the last frame up to a
   multiple of `temporal_patch_size` (frames are taken in pairs).

Defaults are the processors' class defaults; a checkpoint's `video_preprocessor_config.json` (else its
`preprocessor_config.json`, as transformers falls back) overrides them. One deliberate difference:
transformers' Qwen2-VL video processor samples no frames unless told to (`do_sample_frames=False`, every
decoded frame is used); here Qwen2/2.5-VL sample at 2 fps like Qwen3-VL (the rate the models were trained
at and qwen-vl-utils' default), unless the config sets `do_sample_frames` itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem, PixelNorm
from sglang.srt.multimodal.processors.base import MultimodalInputError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
FAMILIES = ("qwen3", "qwen2")
# frames whose rate the file does not say (a list of frames): transformers assumes 24 fps
UNKNOWN_FPS = 24.0
# keys a request may set for videos (mm_processor_kwargs / images_config); pixels are shared with images
REQUEST_VIDEO_KEYS = ("fps", "max_frames", "min_frames", "num_frames", "cap_pixels_per_frame")

_DEFAULTS: dict[str, dict[str, Any]] = {
    # transformers' Qwen3VLVideoProcessor class attributes
    "qwen3": dict(patch_size=16, min_pixels=128 * 32 * 32, max_pixels=32 * 32 * 768, image_mean=(0.5, 0.5, 0.5),
                  image_std=(0.5, 0.5, 0.5), fps=2.0, do_sample_frames=True, max_video_tokens=768),
    # Qwen2VLVideoProcessor's, sampling at 2 fps (see the module docstring)
    "qwen2": dict(patch_size=14, min_pixels=128 * 28 * 28, max_pixels=28 * 28 * 768, image_mean=OPENAI_CLIP_MEAN,
                  image_std=OPENAI_CLIP_STD, fps=2.0, do_sample_frames=True, max_video_tokens=128000),
}


def family_of(model_type: str) -> str:
    return "qwen3" if model_type.startswith("qwen3") else "qwen2"


def qwen3_video_smart_resize(num_frames: int, height: int, width: int, temporal_factor: int = 2, factor: int = 32,
                             min_pixels: int = 128 * 32 * 32, max_pixels: int = 32 * 32 * 768) -> tuple[int, int]:
    """Qwen3-VL's video resize rule: the pixel budget counts all `num_frames` frames."""
    if num_frames < temporal_factor:
        raise MultimodalInputError(f"the video has {num_frames} frame(s) to sample from; at least {temporal_factor} "
                                   "are needed")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise MultimodalInputError(f"video aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class QwenVLVideoProcessor:
    """Immutable video preprocessing config of one model family, and the processing itself (pure,
    thread-safe). `min_pixels` / `max_pixels` are per frame for qwen2 and per clip for qwen3, as in
    transformers (`size.shortest_edge` / `size.longest_edge`)."""

    family: str = "qwen3"
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 32 * 32 * 768
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    do_sample_frames: bool = True
    fps: float | None = 2.0
    num_frames: int | None = None
    min_frames: int = 4
    max_frames: int = 768
    # a request's per-frame pixel limits (mm_processor_kwargs min_pixels / max_pixels), within the above
    frame_min_pixels: int | None = None
    frame_max_pixels: int | None = None
    # the rate a list of frames was taken at: set only by a request's own fps (frames carry no rate, and
    # the server's sampling fps is not theirs); None: UNKNOWN_FPS, as transformers assumes
    frame_list_fps: float | None = None
    # transformers' cap_pixels_per_frame (qwen-vl-utils' budget): off by default there and here; on, each
    # frame gets an even share of a clip budget of max_video_tokens (qwen3: tokens per frame at most)
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"video processor family must be one of {FAMILIES}, got {self.family!r}")
        object.__setattr__(self, "image_mean", tuple(float(v) for v in self.image_mean))
        object.__setattr__(self, "image_std", tuple(float(v) for v in self.image_std))

    # ------------------------------------------------------------------ config
    @classmethod
    def defaults(cls, family: str) -> "QwenVLVideoProcessor":
        return cls(family=family, **_DEFAULTS[family])

    @classmethod
    def from_dict(cls, family: str, cfg: Mapping[str, Any] | None) -> "QwenVLVideoProcessor":
        """The family's defaults under a (video_)preprocessor_config.json dict. `size` gives the pixel
        limits; the older top-level `min_pixels` / `max_pixels` override it for qwen2 only (transformers'
        Qwen3-VL video processor reads `size` alone)."""
        base = cls.defaults(family)
        cfg = cfg or {}
        kw: dict[str, Any] = {}
        for key in ("patch_size", "temporal_patch_size", "merge_size", "min_frames", "max_frames", "num_frames",
                    "max_video_tokens"):
            if cfg.get(key) is not None:
                kw[key] = int(cfg[key])
        for key in ("do_resize", "do_rescale", "do_normalize", "do_sample_frames", "cap_pixels_per_frame"):
            if cfg.get(key) is not None:
                kw[key] = bool(cfg[key])
        if cfg.get("rescale_factor") is not None:
            kw["rescale_factor"] = float(cfg["rescale_factor"])
        if cfg.get("fps") is not None:
            kw["fps"] = float(cfg["fps"])
        for key in ("image_mean", "image_std"):
            v = cfg.get(key)
            if v is not None:
                kw[key] = tuple(v) if isinstance(v, (list, tuple)) else (float(v),) * 3
        size = cfg.get("size")
        if isinstance(size, Mapping):
            if size.get("shortest_edge") is not None:
                kw["min_pixels"] = int(size["shortest_edge"])
            if size.get("longest_edge") is not None:
                kw["max_pixels"] = int(size["longest_edge"])
        if family == "qwen2":
            for key in ("min_pixels", "max_pixels"):
                if cfg.get(key) is not None:
                    kw[key] = int(cfg[key])
        return dataclasses.replace(base, **kw)

    @classmethod
    def from_pretrained(cls, model_path: str, family: str) -> "QwenVLVideoProcessor":
        """From video_preprocessor_config.json, else preprocessor_config.json, else the defaults."""
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            path = os.path.join(model_path, name)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    return cls.from_dict(family, json.load(f))
        return cls.defaults(family)

    def for_request(self, kwargs: Mapping[str, Any], name: str) -> "QwenVLVideoProcessor":
        """This config with one request's video settings (fps, num_frames, min_frames, max_frames,
        min_pixels, max_pixels: keys already known to be present or absent); a value this server cannot
        honour is a MultimodalInputError naming `name.key`."""
        changes: dict[str, Any] = {}
        if kwargs.get("fps") is not None:
            fps = kwargs["fps"]
            if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 60:
                raise MultimodalInputError(f"{name}.fps must be a number of frames per second in (0, 60], got {fps!r}")
            changes["fps"] = changes["frame_list_fps"] = float(fps)
        for key in ("num_frames", "min_frames", "max_frames"):
            v = kwargs.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise MultimodalInputError(f"{name}.{key} must be a positive integer, got {v!r}")
            if v > self.max_frames:
                raise MultimodalInputError(f"{name}.{key} {v} is above this server's limit of {self.max_frames} "
                                           "frames per video (max_frames of the model's video_preprocessor_config"
                                           ".json)")
            changes[key] = v
        if changes.get("num_frames") is not None and changes.get("fps") is not None:
            raise MultimodalInputError(f"{name}: give fps or num_frames for videos, not both")
        if "num_frames" in changes:
            changes["fps"] = changes["frame_list_fps"] = None
        lo, hi = changes.get("min_frames", self.min_frames), changes.get("max_frames", self.max_frames)
        if lo > hi:
            raise MultimodalInputError(f"{name}: min_frames {lo} is above max_frames {hi}")
        cap = kwargs.get("cap_pixels_per_frame")
        if cap is not None:
            if not isinstance(cap, bool):
                raise MultimodalInputError(f"{name}.cap_pixels_per_frame must be true or false, got {cap!r}")
            changes["cap_pixels_per_frame"] = cap
        for key in ("min_pixels", "max_pixels"):  # per frame; checked by the image rules (positive int)
            if kwargs.get(key) is not None:
                changes["frame_" + key] = int(kwargs[key])
        return dataclasses.replace(self, **changes) if changes else self

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    # ------------------------------------------------------------------ sampling
    def sample_indices(self, total: int, video_fps: float | None) -> np.ndarray:
        """Indices (int64, ascending) of the frames taken from a stream of `total` decoded frames."""
        if total < 1:
            raise MultimodalInputError("the video has no frames")
        if not self.do_sample_frames:
            return np.arange(total, dtype=np.int64)
        if self.family == "qwen3":
            return self._sample_qwen3(total, video_fps)
        return self._sample_qwen2(total, video_fps)

    def _sample_qwen3(self, total: int, video_fps: float | None) -> np.ndarray:
        n = self.num_frames
        if n is None and self.fps is not None:
            n = int(total / (video_fps or UNKNOWN_FPS) * self.fps)
            n = min(max(n, self.min_frames), self.max_frames, total)
        if n is None:
            n = min(max(total, self.min_frames), self.max_frames)
        return np.linspace(0, total - 1, n).round().astype(np.int64)

    def _sample_qwen2(self, total: int, video_fps: float | None) -> np.ndarray:
        tp = self.temporal_patch_size
        if self.num_frames is not None:
            n = round(self.num_frames / tp) * tp
        elif self.fps is not None:
            if not video_fps:
                raise MultimodalInputError("the video does not say its frame rate, which sampling by fps needs "
                                           "(give num_frames instead)")
            max_frames = math.floor(min(self.max_frames, total) / tp) * tp
            n = total / video_fps * self.fps
            n = min(max(n, self.min_frames), max_frames, total)
            n = math.floor(n / tp) * tp
        else:
            return np.arange(total, dtype=np.int64)
        if n < 1:
            raise MultimodalInputError(f"the video has {total} frame(s); at least {tp} are needed")
        if n > total:
            raise MultimodalInputError(f"cannot take {n} frames from a video of {total} frames")
        idx = torch.arange(0, total, total / n).int().numpy().astype(np.int64)
        # float32 steps can overshoot by one element past the stream (e.g. 424 of 425 frames): transformers
        # would fail indexing it; that index is dropped here
        return idx[idx < total]

    # ------------------------------------------------------------------ sizes
    def pixel_limits(self, num_frames: int) -> tuple[int, int]:
        """(min, max) pixels smart_resize works with: per frame (qwen2) or per clip (qwen3), a request's
        per-frame limits applied inside the server's."""
        scale = num_frames if self.family == "qwen3" else 1
        hi = self.max_pixels
        if self.cap_pixels_per_frame:  # transformers' resize(cap_pixels_per_frame=True), per family
            f2 = self.factor * self.factor
            if self.family == "qwen3":
                per_frame = max(min(self.max_video_tokens * f2, hi // num_frames), int(self.min_pixels * 1.05))
                hi = per_frame * num_frames
            else:
                total = int(self.max_video_tokens * f2 * 0.9)
                hi = max(min(hi, total * self.temporal_patch_size // num_frames), int(self.min_pixels * 1.05))
        if self.frame_max_pixels is not None:
            hi = min(hi, self.frame_max_pixels * scale)
        lo = self.min_pixels if self.frame_min_pixels is None else self.frame_min_pixels * scale
        return min(lo, hi), hi

    def resized_size(self, num_frames: int, height: int, width: int) -> tuple[int, int]:
        if not self.do_resize:
            return height, width
        lo, hi = self.pixel_limits(num_frames)
        if self.family == "qwen3":
            return qwen3_video_smart_resize(num_frames, height, width, self.temporal_patch_size, self.factor, lo, hi)
        from sglang.srt.multimodal.processors.qwen_image import smart_resize

        return smart_resize(height, width, self.factor, lo, hi)

    def grid_thw(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        rh, rw = self.resized_size(num_frames, height, width)
        t = -(-num_frames // self.temporal_patch_size)
        return t, rh // self.patch_size, rw // self.patch_size

    def timestamps(self, indices, video_fps: float | None) -> list[float]:
        """Qwen3-VL: the time (s) of each temporal patch, the mean of its first and last frame's time."""
        idx = [int(i) for i in indices]
        tp = self.temporal_patch_size
        if len(idx) % tp:
            idx += [idx[-1]] * (tp - len(idx) % tp)
        fps = video_fps or UNKNOWN_FPS
        ts = [i / fps for i in idx]
        return [(ts[i] + ts[i + tp - 1]) / 2 for i in range(0, len(ts), tp)]

    def second_per_grid_t(self, num_sampled: int, total: int, video_fps: float | None) -> float:
        """Qwen2.5-VL: seconds one temporal patch spans, `temporal_patch_size / sampled fps`."""
        fps = video_fps or UNKNOWN_FPS
        sampled_fps = num_sampled / total * fps if total else fps
        return self.temporal_patch_size / sampled_fps

    # ------------------------------------------------------------------ pixels (video_pixels.py)
    def resize_frame(self, frame, size: tuple[int, int]) -> np.ndarray:
        """One (H, W, 3) uint8 frame (an array, or an RGB PIL image) at `size` (from `resized_size`): the
        loader resizes each frame as it is decoded, so a clip is never held at its full size, and the
        resize makes no full-size copy of the frame (video_pixels.resize_frame)."""
        from sglang.srt.multimodal.processors.video_pixels import resize_frame

        return resize_frame(frame, size)

    def process(self, frames: np.ndarray, resized: bool = False, uint8: bool = False
                ) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """(T, H, W, 3) uint8 sampled frames -> (pixel_values float32 (t*h*w, 3*T*P*P), (t, h, w)).
        `resized`: the frames are at the model's size already (resized on decode). `uint8`
        (SGLANG_MM_UINT8_PIXELS): the frames at the model's size, (T, H, W, 3) uint8, instead of the
        pixel values (normalized where the vision tower runs, `PixelNorm.of("video", self)`)."""
        from sglang.srt.multimodal.processors.video_pixels import frame_grid, pixel_values, resize_frames

        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise MultimodalInputError(f"video frames must be (T, H, W, 3) uint8, got {frames.shape} {frames.dtype}")
        if not resized:
            frames = resize_frames(frames, self.resized_size(*frames.shape[:3]))
        if uint8:
            return torch.from_numpy(np.ascontiguousarray(frames)), frame_grid(frames.shape[:3], self)
        return pixel_values(np.ascontiguousarray(frames), self)

    def patchify(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """(T, C, H, W) -> (t*h*w, C*T*P*P) in transformers' layout (the last frame repeated to a pair)."""
        from sglang.srt.multimodal.processors.video_pixels import patchify

        return patchify(x, self.temporal_patch_size, self.patch_size, self.merge_size)


@dataclass
class ProcessedVideo:
    """One video ready for the prompt and the vision tower."""

    # (t*h*w, 3*T*P*P) float32, or (F, H, W, 3) uint8 frames when `norm` is set; from a preprocessing worker, a
    # ShmPointerMMData to that tensor in a segment the caller owns
    pixel_values: Any
    grid_thw: tuple[int, int, int]
    timestamps: list[float]  # seconds of each temporal patch (Qwen3-VL's prompt text)
    second_per_grid_t: float  # Qwen2.5-VL's M-RoPE time step
    num_frames: int  # sampled frames (before the pair padding)
    decode_ms: float = 0.0  # fetch-free wall time of demuxing, decoding and resizing the sampled frames
    preprocess_ms: float = 0.0  # normalize, patchify (and the resize of frames not resized on decode)
    # what the pixels are a pure function of: the file's digest and the whole config (None: frames given)
    source_key: str | None = None
    norm: PixelNorm | None = None  # SGLANG_MM_UINT8_PIXELS: how the uint8 frames become pixel values
    hash: int | None = None  # the item hash, when computed where the video was processed (a worker)


def load_and_process_video(source: Any, cfg: QwenVLVideoProcessor, *, allowed_local_media_path: str | None = None,
                           limits=None, fetcher=None, uint8: bool = False) -> ProcessedVideo:
    """Decode, sample and preprocess one video source (pure, thread-safe). A list of frames is timed at
    `cfg.frame_list_fps` (a request's fps), since frames carry no rate. `uint8`: the frames stay uint8
    at the model's size (SGLANG_MM_UINT8_PIXELS)."""
    from sglang.srt.multimodal.video_io import VideoLimits, is_frame_list, load_video

    t0 = time.perf_counter()
    # frames are resized as they are decoded (cfg.resized_size / cfg.resize_frame): what is kept is what
    # the model sees, and the byte budget counts that
    video = load_video(source, cfg.sample_indices, allowed_local_media_path=allowed_local_media_path,
                       limits=limits or VideoLimits(), fetcher=fetcher, fit=cfg)
    fps = video.fps
    if is_frame_list(source) and cfg.frame_list_fps is not None:
        fps = cfg.frame_list_fps
    t1 = time.perf_counter()
    pixel_values, grid = cfg.process(video.frames, resized=video.resized, uint8=uint8)
    # the key names the file and the config, not the carrier: a video hashes the same both ways
    key = f"{video.source_digest}|{cfg!r}" if video.source_digest else None
    return ProcessedVideo(pixel_values, grid, cfg.timestamps(video.indices, fps),
                          cfg.second_per_grid_t(len(video.indices), video.total_frames, fps), len(video.indices),
                          (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3, key,
                          PixelNorm.of("video", cfg) if uint8 else None)


def request_media_configs(image_processor, video_processor: QwenVLVideoProcessor, kwargs: Mapping[str, Any] | None,
                          name: str = "mm_processor_kwargs"):
    """(image config, video config) of a request giving `kwargs` in its field `name`: max_pixels and
    min_pixels for images and video frames, fps / num_frames / min_frames / max_frames for videos.
    Raises MultimodalInputError naming a key or value it cannot honour."""
    from sglang.srt.multimodal.processors.image_options import request_image_config

    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise MultimodalInputError(f"{name} must be an object, got {type(kwargs).__name__}")
    kwargs = dict(kwargs or {})
    video_only = {k: kwargs.pop(k) for k in REQUEST_VIDEO_KEYS if k in kwargs}
    try:
        image_cfg = request_image_config(image_processor, kwargs, name)
    except MultimodalInputError as e:
        if "is not supported" in str(e):
            keys = ", ".join(("max_pixels", "min_pixels") + REQUEST_VIDEO_KEYS)
            raise MultimodalInputError(f"{str(e).split(':')[0]}: this server takes {keys}") from None
        raise
    return image_cfg, video_processor.for_request({**kwargs, **video_only}, name)


def expand_video(pv: ProcessedVideo, out_ids: list[int], merge: int, video_token_id: int, vision_start_id: int,
                 vision_end_id: int, timestamp_ids: Callable[[float], list[int]] | None) -> MultimodalDataItem:
    """Appends one video's placeholder tokens to `out_ids` and returns its item. With `timestamp_ids`
    (Qwen3-VL): `<t seconds><|vision_start|>pads<|vision_end|>` per temporal patch, in place of the one
    `<|video_pad|>` (as transformers' Qwen3VLProcessor does); without (Qwen2/2.5-VL): every frame
    group's pads in one run."""
    t, gh, gw = pv.grid_thw
    per_group = gh * gw // merge**2
    offsets = []
    if timestamp_ids is not None:
        for ts in pv.timestamps[:t]:
            out_ids.extend(timestamp_ids(ts))
            out_ids.append(vision_start_id)
            offsets.append((len(out_ids), len(out_ids) + per_group))
            out_ids.extend([video_token_id] * per_group)
            out_ids.append(vision_end_id)
    else:
        offsets.append((len(out_ids), len(out_ids) + t * per_group))
        out_ids.extend([video_token_id] * (t * per_group))
    return video_item(pv, offsets, merge)


def video_item(pv: ProcessedVideo, offsets: list, merge: int) -> MultimodalDataItem:
    """The item of one processed video: the one form `hashing.item_hash` reads (a worker hashes this, the
    in-process path the item it sends; both must be the same fields)."""
    t, gh, gw = pv.grid_thw
    return MultimodalDataItem(modality=Modality.VIDEO, feature=pv.pixel_values, image_grid_thw=(int(t), int(gh), int(gw)),
                              offsets=offsets, spatial_merge_size=merge,
                              model_specific_data={"second_per_grid_t": pv.second_per_grid_t, "num_frames": pv.num_frames,
                                                   "decode_ms": pv.decode_ms, "preprocess_ms": pv.preprocess_ms,
                                                   **({"source_key": pv.source_key} if pv.source_key else {})},
                              pixel_norm=pv.norm, hash=pv.hash)


__all__ = ["ProcessedVideo", "expand_video", "request_media_configs", "QwenVLVideoProcessor", "load_and_process_video", "REQUEST_VIDEO_KEYS", "UNKNOWN_FPS", "family_of", "qwen3_video_smart_resize", "video_item"]
