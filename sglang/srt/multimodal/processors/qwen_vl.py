"""Qwen2.5-VL / Qwen3-VL prompt expansion: a prompt with image and video placeholders -> expanded input
ids, the items' pixel data and M-RoPE positions. Image preprocessing is in qwen_image.py, video sampling
and preprocessing in qwen_video.py."""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Executor
from typing import Any, Mapping, Sequence

import torch

from sglang.srt.multimodal.image_io import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageInput,
    load_image_bytes,
)
from sglang.srt.multimodal.bounded_fanout import run_bounded
from sglang.srt.multimodal.mm_types import (
    QWEN_IMAGE_TOKEN_ID,
    QWEN_VIDEO_TOKEN_ID,
    QWEN_VISION_END_TOKEN_ID,
    QWEN_VISION_START_TOKEN_ID,
    EncodedImage,
    Modality,
    MultimodalDataItem,
    MultimodalInputs,
)
from sglang.srt.multimodal.mrope import (
    DEFAULT_TOKENS_PER_SECOND,
    QWEN2_5_VL_MODEL_TYPES,
    QWEN2_VL_MODEL_TYPES,
    QWEN3_VL_MODEL_TYPES,
    compute_mrope_positions,
)
from sglang.srt.multimodal.processors.base import (
    BaseMultimodalProcessor,
    MultimodalInputError,
)
from sglang.srt.multimodal.transport.shm import ShmPointerMMData, unlink_segments
from sglang.srt.multimodal.video_job import is_worker_video
from sglang.srt.multimodal.processors.image_options import apply_server_overrides, request_image_config
from sglang.srt.multimodal.processors.qwen_video import (
    ProcessedVideo,
    QwenVLVideoProcessor,
    expand_video,
    family_of,
    load_and_process_video,
    request_media_configs,
)
from sglang.srt.multimodal.processors.qwen_image import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    ProcessedImage,
    QwenVLImageProcessor,
    SmartResizeError,
    _RESAMPLE_BICUBIC,
    load_and_process_image,
    process_image,
    smart_resize,
    still_image_config,
)


def _mrope_model_type(model_type: str) -> str:
    if model_type in QWEN3_VL_MODEL_TYPES or model_type in QWEN2_5_VL_MODEL_TYPES or model_type in QWEN2_VL_MODEL_TYPES:
        return model_type
    raise ValueError(f"unsupported Qwen-VL model_type {model_type!r}")


class QwenVLProcessor(BaseMultimodalProcessor):
    """Prompt + images -> expanded input ids, pixel values, M-RoPE positions.

    Each ``<|image_pad|>`` token in the (tokenized) prompt is one image placeholder,
    normally written as ``<|vision_start|><|image_pad|><|vision_end|>``; the i-th
    placeholder is expanded to ``grid_t * grid_h * grid_w // merge**2`` copies for
    the i-th image.
    """

    model_types = ("qwen3_vl", "qwen3_vl_moe", "qwen2_5_vl", "qwen2_vl")

    def __init__(
        self,
        tokenizer: Any = None,
        image_processor: QwenVLImageProcessor | None = None,
        *,
        model_type: str = "qwen3_vl",
        image_token_id: int = QWEN_IMAGE_TOKEN_ID,
        video_token_id: int = QWEN_VIDEO_TOKEN_ID,
        vision_start_token_id: int = QWEN_VISION_START_TOKEN_ID,
        vision_end_token_id: int = QWEN_VISION_END_TOKEN_ID,
        spatial_merge_size: int | None = None,
        tokens_per_second: float | None = None,
        allowed_local_media_path: str | None = None,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
        video_processor: QwenVLVideoProcessor | None = None,
        video_limits: Any = None,
    ):
        super().__init__(
            tokenizer, allowed_local_media_path=allowed_local_media_path, max_image_pixels=max_image_pixels
        )
        self.model_type = _mrope_model_type(model_type)
        self.video_processor = video_processor or QwenVLVideoProcessor.defaults(family_of(self.model_type))
        self.video_limits = video_limits  # video_io.VideoLimits; None: its defaults
        # the tokenizer is shared with the request builder, which replaces this lock by its own
        self.tokenizer_lock = threading.Lock()
        self._timestamp_ids: dict[str, list[int]] = {}
        if image_processor is None:
            image_processor = (
                QwenVLImageProcessor(
                    patch_size=16,
                    image_mean=(0.5, 0.5, 0.5),
                    image_std=(0.5, 0.5, 0.5),
                    min_pixels=65536,
                    max_pixels=16777216,
                )
                if self.model_type in QWEN3_VL_MODEL_TYPES
                else QwenVLImageProcessor(min_pixels=3136, max_pixels=12845056)
            )
        # SGLANG_IMAGE_MAX_PIXELS / SGLANG_RESIZE_RESAMPLE; a request may narrow it further (image_config)
        self.image_processor = image_processor = apply_server_overrides(image_processor)
        self.image_token_id = int(image_token_id)
        self.video_token_id = int(video_token_id)
        self.vision_start_token_id = int(vision_start_token_id)
        self.vision_end_token_id = int(vision_end_token_id)
        merge = image_processor.merge_size if spatial_merge_size is None else int(spatial_merge_size)
        if merge != image_processor.merge_size:
            raise ValueError(
                f"vision_config.spatial_merge_size={merge} differs from the image processor's "
                f"merge_size={image_processor.merge_size}"
            )
        self.spatial_merge_size = merge
        if self.video_processor.merge_size != merge:
            raise ValueError(f"the video processor's merge_size={self.video_processor.merge_size} differs from the "
                             f"vision tower's spatial_merge_size={merge}")
        self.tokens_per_second = (
            DEFAULT_TOKENS_PER_SECOND if tokens_per_second is None else tokens_per_second
        )

    # ------------------------------------------------------------------ #
    @classmethod
    def from_config_dicts(
        cls,
        hf_config: Mapping[str, Any] | Any,
        preprocessor_config: Mapping[str, Any] | None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> "QwenVLProcessor":
        """Build from ``config.json`` (dict or HF config object) and ``preprocessor_config.json`` dicts."""
        if not isinstance(hf_config, Mapping):
            hf_config = hf_config.to_dict() if hasattr(hf_config, "to_dict") else vars(hf_config)
        model_type = hf_config.get("model_type", "qwen3_vl")
        vision = hf_config.get("vision_config") or {}
        if not isinstance(vision, Mapping):
            vision = vision.to_dict() if hasattr(vision, "to_dict") else vars(vision)
        ids = {}
        for key, default in (
            ("image_token_id", QWEN_IMAGE_TOKEN_ID),
            ("video_token_id", QWEN_VIDEO_TOKEN_ID),
            ("vision_start_token_id", QWEN_VISION_START_TOKEN_ID),
            ("vision_end_token_id", QWEN_VISION_END_TOKEN_ID),
        ):
            v = hf_config.get(key)
            ids[key] = default if v is None else int(v)
        image_processor = (
            QwenVLImageProcessor.from_dict(preprocessor_config) if preprocessor_config is not None else None
        )
        kwargs.setdefault("spatial_merge_size", vision.get("spatial_merge_size"))
        kwargs.setdefault("tokens_per_second", vision.get("tokens_per_second"))
        # transformers reads video_preprocessor_config.json, else preprocessor_config.json
        video_cfg = kwargs.pop("video_preprocessor_config", None) or preprocessor_config
        kwargs.setdefault("video_processor", QwenVLVideoProcessor.from_dict(family_of(model_type), video_cfg))
        return cls(tokenizer, image_processor, model_type=model_type, **ids, **kwargs)

    @classmethod
    def from_pretrained(cls, model_path: str, tokenizer: Any = None, **kwargs: Any) -> "QwenVLProcessor":
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as f:
            hf_config = json.load(f)
        pp_path = os.path.join(model_path, "preprocessor_config.json")
        pp = None
        if os.path.exists(pp_path):
            with open(pp_path, encoding="utf-8") as f:
                pp = json.load(f)
        vp_path = os.path.join(model_path, "video_preprocessor_config.json")
        if os.path.exists(vp_path):
            with open(vp_path, encoding="utf-8") as f:
                kwargs.setdefault("video_preprocessor_config", json.load(f))
        return cls.from_config_dicts(hf_config, pp, tokenizer, **kwargs)

    # ------------------------------------------------------------------ #
    def image_config(self, kwargs: Mapping[str, Any] | None, name: str = "mm_processor_kwargs") -> QwenVLImageProcessor:
        """The image processor config of a request giving `kwargs` (max_pixels, min_pixels) in its field
        `name`; raises MultimodalInputError naming a key it cannot honour."""
        return request_image_config(self.image_processor, kwargs, name)

    def media_config(self, kwargs: Mapping[str, Any] | None, name: str = "mm_processor_kwargs"):
        """(image config, video config) of a request giving `kwargs` in its field `name` (see
        `qwen_video.request_media_configs`)."""
        return request_media_configs(self.image_processor, self.video_processor, kwargs, name)

    def load_and_process_image(self, source: ImageInput, cfg: QwenVLImageProcessor | None = None) -> ProcessedImage:
        """Decode + preprocess one image with `cfg` (default: the server's); pure and thread-safe. With
        `deferred_jpeg`, a plain JPEG is only sized from its header and its pixel_values is an
        `EncodedImage` (decoded where the vision tower runs; the GPU decoder resizes bicubic only);
        everything else takes the full path."""
        cfg = cfg or self.image_processor
        if self.compact_still_images:  # one temporal frame per patch row, on every path below
            cfg = still_image_config(cfg)
        if self.deferred_jpeg and cfg.resample == _RESAMPLE_BICUBIC:
            data = load_image_bytes(source, allowed_local_media_path=self.allowed_local_media_path)
            if data is not None:
                from sglang.srt.multimodal.deferred_decode import defer_jpeg

                enc = defer_jpeg(data, cfg, self.max_image_pixels)
                if enc is not None:
                    return ProcessedImage(enc, enc.grid_thw)
                source = data
        return load_and_process_image(
            source,
            cfg,
            allowed_local_media_path=self.allowed_local_media_path,
            max_image_pixels=self.max_image_pixels,
            uint8=self.uint8_pixels,
        )

    def process(
        self,
        prompt: str | Sequence[int],
        images: Sequence[ImageInput] | None = None,
        *,
        videos: Sequence[Any] | None = None,
        executor: Executor | None = None,
        image_config: QwenVLImageProcessor | None = None,
        video_config: QwenVLVideoProcessor | None = None,
        fetcher: Any = None,
        max_in_flight: int | None = None,
        **kwargs: Any,
    ) -> tuple[list[int], MultimodalInputs]:
        """Tokenize (if needed), preprocess images and videos (with a request's own configs from
        `media_config()`, else the server's) and expand their placeholders, in prompt order.

        Returns ``(input_ids, MultimodalInputs)``; ``mm_items`` follow the prompt, and each item's
        ``offsets`` are the half-open ranges of its placeholder tokens in ``input_ids`` (one per frame
        group for a Qwen3-VL video, whose groups are separated by timestamp text). With an `executor`, at most
        `max_in_flight` of the request's images and videos are loaded at a time (None or 0: all at once;
        `bounded_fanout.run_bounded`).
        """
        images, videos = list(images or []), list(videos or [])
        ids = self.tokenize(prompt) if isinstance(prompt, str) else self.as_id_list(prompt)
        image_pos = [i for i, t in enumerate(ids) if t == self.image_token_id]
        video_pos = [i for i, t in enumerate(ids) if t == self.video_token_id]
        if len(image_pos) != len(images):
            raise MultimodalInputError(
                f"the prompt has {len(image_pos)} image placeholder(s) "
                f"(<|vision_start|><|image_pad|><|vision_end|>) but {len(images)} image(s) were given"
            )
        if len(video_pos) != len(videos):
            raise MultimodalInputError(
                f"the prompt has {len(video_pos)} video placeholder(s) "
                f"(<|vision_start|><|video_pad|><|vision_end|>) but {len(videos)} video(s) were given"
            )
        jobs, alias = self._image_jobs(images)
        n_image_jobs = len(jobs)
        jobs += [(Modality.VIDEO, i, src, None) for i, src in enumerate(videos)]
        one = lambda job: self._load_one(job, len(images), len(videos), image_config, video_config, fetcher)  # noqa: E731
        done = _run_all(executor if len(jobs) > 1 else None, one, jobs, max_in_flight)
        processed = [done[j] for j in alias] + done[n_image_jobs:]  # images (duplicates share), then videos

        out_ids: list[int] = []
        items: list[MultimodalDataItem] = []
        prev = 0
        order = sorted([(p, k) for k, p in enumerate(image_pos)] + [(p, len(images) + k) for k, p in enumerate(video_pos)])
        for pos, k in order:
            out_ids.extend(ids[prev:pos])
            res = processed[k]
            items.append(self._expand_video(res, out_ids) if isinstance(res, ProcessedVideo)
                         else self._expand_image(res, out_ids))
            prev = pos + 1
        out_ids.extend(ids[prev:])

        video_items = [it for it in items if it.modality == Modality.VIDEO]
        positions, delta = compute_mrope_positions(
            out_ids,
            [it.image_grid_thw for it in items if it.modality == Modality.IMAGE],
            spatial_merge_size=self.spatial_merge_size,
            image_token_id=self.image_token_id,
            video_token_id=self.video_token_id,
            vision_start_token_id=self.vision_start_token_id,
            model_type=self.model_type,
            tokens_per_second=self.tokens_per_second,
            video_grid_thw=[it.image_grid_thw for it in video_items],
            second_per_grid_ts=[it.model_specific_data["second_per_grid_t"] for it in video_items] or None,
        )
        mm_inputs = MultimodalInputs(
            mm_items=items,
            mrope_positions=positions,
            mrope_position_delta=delta,
            im_token_id=self.image_token_id,
            im_start_id=self.vision_start_token_id,
            im_end_id=self.vision_end_token_id,
            video_token_id=self.video_token_id,
        )
        return out_ids, mm_inputs

    def _image_jobs(self, images: list) -> tuple[list[tuple], list[int]]:
        """(one load job per distinct image, the job index of every image). With an `image_loader`
        (`image_flight.SharedImageLoader`) each image is identified first (URL, or its bytes' digest) and an
        image identical to an earlier one of the request takes that one's job, so it is processed once;
        without one every image is its own job."""
        loader = self.image_loader
        jobs: list[tuple] = []
        alias: list[int] = []
        first: dict = {}
        for i, src in enumerate(images):
            key = None
            if loader is not None:
                try:
                    key, src = loader.identify(src)
                except ValueError as e:  # unreadable source: the 400 its load would have given
                    if len(images) <= 1:
                        raise
                    raise _named(e, Modality.IMAGE, i) from e
            j = first.get(key) if key is not None else None
            if j is None:
                j = len(jobs)
                jobs.append((Modality.IMAGE, i, src, key))
                if key is not None:
                    first[key] = j
            alias.append(j)
        if loader is not None:
            loader.note_duplicates(len(images) - len(jobs))
        return jobs, alias

    def _load_one(self, job, n_images: int, n_videos: int, image_config, video_config, fetcher):
        kind, idx, src, key = job
        try:
            if kind == Modality.IMAGE:
                if self.image_loader is not None:  # shared with concurrent requests carrying the same image
                    return self.image_loader.load(key, src, image_config)
                return self.load_and_process_image(src, image_config)
            remote = getattr(self.image_loader, "remote", None)  # --mm-processor-worker-num: the worker pool
            if remote is not None and is_worker_video(src):  # an encoded file: decoded in a worker (video_job.py)
                return remote.load_video(src, video_config)
            cfg = video_config or self.video_processor
            return load_and_process_video(src, cfg, allowed_local_media_path=self.allowed_local_media_path,
                                          limits=self.video_limits, fetcher=fetcher, uint8=self.uint8_pixels)
        except ValueError as e:  # ImageLoadError, VideoLoadError, MultimodalInputError, SmartResizeError
            if (n_images if kind == Modality.IMAGE else n_videos) <= 1:
                raise
            raise _named(e, kind, idx) from e

    def _expand_image(self, pim: ProcessedImage, out_ids: list[int]) -> MultimodalDataItem:
        t, gh, gw = pim.grid_thw
        n_tok = t * gh * gw // self.spatial_merge_size**2
        start = len(out_ids)
        out_ids.extend([self.image_token_id] * n_tok)
        pv = pim.pixel_values  # a preprocessing worker's pixels are already in shared memory (a pointer)
        feature = pv if isinstance(pv, (EncodedImage, ShmPointerMMData)) else torch.from_numpy(pv)
        return MultimodalDataItem(modality=Modality.IMAGE, feature=feature, image_grid_thw=(int(t), int(gh), int(gw)),
                                  offsets=[(start, start + n_tok)], spatial_merge_size=self.spatial_merge_size,
                                  pixel_norm=pim.norm, hash=pim.hash)

    def _expand_video(self, pv: ProcessedVideo, out_ids: list[int]) -> MultimodalDataItem:
        return expand_video(pv, out_ids, self.spatial_merge_size, self.video_token_id, self.vision_start_token_id,
                            self.vision_end_token_id,
                            self.timestamp_ids if self.model_type in QWEN3_VL_MODEL_TYPES else None)

    def timestamp_ids(self, seconds: float) -> list[int]:
        """Token ids of Qwen3-VL's `<{seconds:.1f} seconds>` (special tokens on both sides: the text
        tokenizes alone exactly as inside the prompt). Cached: few distinct values ever occur."""
        text = f"<{seconds:.1f} seconds>"
        ids = self._timestamp_ids.get(text)
        if ids is None:
            if self.tokenizer is None:
                raise MultimodalInputError("Qwen3-VL videos need a tokenizer for their timestamp text")
            with self.tokenizer_lock:
                ids = self.tokenize(text)
            if len(self._timestamp_ids) < 65536:
                self._timestamp_ids[text] = ids
        return list(ids)


def _run_all(executor: Executor | None, fn, jobs: list, limit: int | None = None) -> list:
    """`fn` of every job in order (on `executor` when given, at most `limit` jobs at a time), as
    `executor.map` would; when one fails its error is raised at once, and the segments the other jobs'
    results own (a preprocessing worker's pixels) are unlinked, now or when those jobs end: a failed request
    leaves nothing behind."""
    if executor is None:
        results: list = []
        try:
            for job in jobs:
                results.append(fn(job))
        except BaseException:
            _release(results)
            raise
        return results
    return run_bounded(executor, fn, jobs, limit, _release)


def _release(results) -> None:
    unlink_segments([r.pixel_values.name for r in results
                     if isinstance(getattr(r, "pixel_values", None), ShmPointerMMData)])


def _named(e: ValueError, kind: Modality, idx: int) -> ValueError:
    """The same error naming which of a request's images (videos) failed."""
    return type(e)(f"{kind.value} {idx}: {e}")


__all__ = [
    "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD",
    "ProcessedImage",
    "QwenVLImageProcessor",
    "QwenVLProcessor",
    "SmartResizeError",
    "load_and_process_image",
    "process_image",
    "smart_resize",
]
