"""What a copy of the server's multimodal processor is built from: the model directory and every switch that
changes how media are preprocessed, resolved once from the server arguments and the environment.

The request builder builds its processor from it, and each preprocessing worker process
(`mm_worker.py`) builds its own copy from the same spec, so a worker preprocesses exactly as the
in-process path would. Picklable: a spec travels to a spawned worker as its start-up argument.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from sglang.srt.environ import envs
from sglang.srt.multimodal.media_fetch import HostPolicy, MediaFetcher
from sglang.srt.multimodal.video_io import VideoLimits


@dataclass(frozen=True)
class ProcessorSpec:
    model_path: str
    tokenizer_path: str
    allowed_local_media_path: str | None
    deferred_jpeg: bool  # SGLANG_GPU_IMAGE_DECODE (or --language-only): plain JPEGs travel compressed
    uint8_pixels: bool  # SGLANG_MM_UINT8_PIXELS
    compact_still_images: bool  # SGLANG_MM_COMPACT_STILL_IMAGES
    video_limits: VideoLimits
    cap_pixels_per_frame: bool  # SGLANG_VIDEO_CAP_PIXELS_PER_FRAME
    fetcher: MediaFetcher  # --media-fetch-timeout, --media-max-bytes, --allowed-media-domains, ...

    @classmethod
    def from_server_args(cls, server_args, model_path: str) -> "ProcessorSpec":
        from sglang.srt.multimodal.deferred_decode import deferred_decode_enabled

        deferred = server_args.language_only or deferred_decode_enabled(server_args.resolved_device())
        return cls(
            model_path=model_path,
            tokenizer_path=server_args.tokenizer_path or model_path,
            allowed_local_media_path=server_args.allowed_local_media_path,
            deferred_jpeg=bool(deferred),
            uint8_pixels=envs.SGLANG_MM_UINT8_PIXELS.get(),
            compact_still_images=envs.SGLANG_MM_COMPACT_STILL_IMAGES.get(),
            video_limits=VideoLimits(max_frame_pixels=envs.SGLANG_VIDEO_MAX_FRAME_PIXELS.get(),
                                     max_duration_s=envs.SGLANG_VIDEO_MAX_SECONDS.get(),
                                     max_sampled_bytes=envs.SGLANG_VIDEO_MAX_BYTES.get()),
            cap_pixels_per_frame=envs.SGLANG_VIDEO_CAP_PIXELS_PER_FRAME.get(),
            fetcher=MediaFetcher(server_args.media_fetch_timeout, server_args.media_max_bytes,
                                 HostPolicy(tuple(server_args.allowed_media_domains or ()),
                                            server_args.allow_private_media_urls)),
        )

    def hf_config(self) -> dict[str, Any]:
        with open(os.path.join(self.model_path, "config.json"), encoding="utf-8") as f:
            return json.load(f)

    def build(self, tokenizer: Any, hf_config: dict[str, Any] | None = None):
        """The processor (None for a text-only model), its switches set as the spec says."""
        from sglang.srt.multimodal.processors.base import get_processor_class, is_multimodal_model

        cfg = hf_config if hf_config is not None else self.hf_config()
        archs, model_type = cfg.get("architectures"), cfg.get("model_type")
        if not is_multimodal_model(archs, model_type):
            return None
        processor = get_processor_class(archs, model_type).from_pretrained(
            self.model_path, tokenizer, allowed_local_media_path=self.allowed_local_media_path)
        processor.deferred_jpeg = self.deferred_jpeg
        processor.uint8_pixels = self.uint8_pixels
        processor.compact_still_images = self.compact_still_images  # one frame per still image
        processor.video_limits = self.video_limits
        if self.cap_pixels_per_frame:
            processor.video_processor = dataclasses.replace(processor.video_processor, cap_pixels_per_frame=True)
        return processor


__all__ = ["ProcessorSpec"]
