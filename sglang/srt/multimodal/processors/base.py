"""Base class and registry for multimodal (tokenizer-side) processors.

A processor turns ``(prompt text or token ids, images)`` into expanded input ids
plus :class:`~sglang.srt.multimodal.mm_types.MultimodalInputs`. It runs in the
tokenizer process, which must never import ``torch.nn`` model code, so the
registry maps HF ``architectures`` / ``model_type`` *names* to processor classes,
with lazy ``"module:Class"`` entries resolved by import only when looked up.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any, Iterable, Sequence

from PIL import Image

from sglang.srt.multimodal.image_io import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageInput,
    ImageLoadError,
    load_image,
)
from sglang.srt.multimodal.mm_types import MultimodalInputs


class MultimodalInputError(ValueError):
    """The prompt and the multimodal inputs do not fit together (bad request)."""


class BaseMultimodalProcessor(ABC):
    """Tokenizer-side multimodal processor contract.

    Subclasses implement :meth:`process`. Image decoding is delegated to
    :mod:`sglang.srt.multimodal.image_io`.
    """

    #: HF ``model_type`` values this processor handles (informational).
    model_types: tuple[str, ...] = ()
    #: SGLANG_GPU_IMAGE_DECODE: plain JPEGs are sized from their header and sent compressed
    #: (set by the request builder; processors that do not support it ignore it).
    deferred_jpeg: bool = False
    #: SGLANG_MM_COMPACT_STILL_IMAGES: a still image is patchified as one temporal frame (patch rows of
    #: C*P*P values, not the pair of identical frames); the vision tower folds its kernel to match.
    compact_still_images: bool = False
    #: SGLANG_MM_UINT8_PIXELS: images and video frames are sent as uint8 after the resize, with the
    #: recipe (`PixelNorm`) that turns them into pixel values where the vision tower runs (set by the
    #: request builder).
    uint8_pixels: bool = False
    #: images fetched, decoded, preprocessed and hashed once per distinct image in flight
    #: (`image_flight.SharedImageLoader`, set by the request builder); None: each image on its own.
    image_loader: Any = None

    def __init__(
        self,
        tokenizer: Any = None,
        *,
        allowed_local_media_path: str | None = None,
        max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    ):
        self.tokenizer = tokenizer
        self.allowed_local_media_path = allowed_local_media_path
        self.max_image_pixels = max_image_pixels

    # ------------------------------------------------------------------ #
    def load_image(self, source: ImageInput) -> Image.Image:
        """Decode one image input into an RGB PIL image (raises ImageLoadError)."""
        return load_image(
            source,
            allowed_local_media_path=self.allowed_local_media_path,
            max_image_pixels=self.max_image_pixels,
        )

    def tokenize(self, text: str) -> list[int]:
        """Encode text without adding BOS/EOS (chat templates already contain them)."""
        if self.tokenizer is None:
            raise MultimodalInputError("a tokenizer is required to process a text prompt")
        try:
            out = self.tokenizer.encode(text, add_special_tokens=False)
        except TypeError:  # e.g. a raw `tokenizers.Tokenizer`-like object without that kwarg
            out = self.tokenizer.encode(text)
        ids = getattr(out, "ids", out)  # `tokenizers.Encoding` -> ids
        return [int(i) for i in ids]

    @staticmethod
    def as_id_list(ids: Any) -> list[int]:
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        out = [int(i) for i in ids]
        return out

    @abstractmethod
    def process(
        self,
        prompt: str | Sequence[int],
        images: Sequence[ImageInput] | None = None,
        **kwargs: Any,
    ) -> tuple[list[int], MultimodalInputs]:
        """Return ``(expanded input ids, MultimodalInputs)`` for one request."""


# ---------------------------------------------------------------------- #
# Registry
# ---------------------------------------------------------------------- #

# name (HF architecture or model_type) -> processor class, or "module:Class" resolved lazily.
_PROCESSOR_REGISTRY: dict[str, type[BaseMultimodalProcessor] | str] = {}

_QWEN_VL = "sglang.srt.multimodal.processors.qwen_vl:QwenVLProcessor"
for _name in (
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen2_5_vl",
    "qwen2_vl",
):
    _PROCESSOR_REGISTRY[_name] = _QWEN_VL


def _resolve(entry: type[BaseMultimodalProcessor] | str) -> type[BaseMultimodalProcessor]:
    if isinstance(entry, str):
        module_name, _, cls_name = entry.partition(":")
        return getattr(importlib.import_module(module_name), cls_name)
    return entry


def get_processor_class(
    architectures: Iterable[str] | str | None = None,
    model_type: str | None = None,
) -> type[BaseMultimodalProcessor]:
    """Look up a processor class by HF ``architectures`` (tried first) or ``model_type``."""
    if isinstance(architectures, str):
        architectures = [architectures]
    names = list(architectures or [])
    if model_type:
        names.append(model_type)
    for name in names:
        entry = _PROCESSOR_REGISTRY.get(name)
        if entry is not None:
            return _resolve(entry)
    raise KeyError(
        f"no multimodal processor registered for architectures={list(architectures or [])} "
        f"model_type={model_type!r}; known: {sorted(_PROCESSOR_REGISTRY)}"
    )


def is_multimodal_model(architectures: Iterable[str] | str | None = None, model_type: str | None = None) -> bool:
    if isinstance(architectures, str):
        architectures = [architectures]
    names = list(architectures or []) + ([model_type] if model_type else [])
    return any(n in _PROCESSOR_REGISTRY for n in names)


__all__ = [
    "BaseMultimodalProcessor",
    "ImageLoadError",
    "MultimodalInputError",
    "get_processor_class",
    "is_multimodal_model",
]
