"""Plain data types describing the multimodal part of a request.

These objects are produced in the tokenizer process and shipped to the
scheduler / model workers (pickled), so they hold only plain Python values,
numpy arrays and torch tensors -- never modules or model code.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

# Default Qwen-VL special token ids (Qwen2.5-VL and Qwen3-VL share them).
QWEN_VISION_START_TOKEN_ID = 151652
QWEN_VISION_END_TOKEN_ID = 151653
QWEN_IMAGE_TOKEN_ID = 151655
QWEN_VIDEO_TOKEN_ID = 151656


class Modality(enum.Enum):
    IMAGE = "image"
    VIDEO = "video"


@dataclass
class EncodedImage:
    """A still image whose pixels are produced where the vision tower runs (SGLANG_GPU_IMAGE_DECODE):
    the compressed file, plus what the tokenizer read from its header.

    ``data`` is the JPEG file as received; ``target_hw`` the size it is resized to (``smart_resize``
    of the EXIF-oriented size), so ``grid_thw`` and the placeholder count are fixed before any pixel
    is decoded; ``orientation`` the EXIF orientation (1-8); ``processor`` the image processor
    config (rescale, normalize, patchify) the decoding side applies. Only plain JPEGs are deferred
    (8-bit sequential Huffman, gray or YCbCr, common chroma layout: see ``JpegHeader.simple_reason``).
    """

    data: bytes
    target_hw: tuple[int, int]
    grid_thw: tuple[int, int, int]
    orientation: int = 1
    processor: Any = None

    @property
    def nbytes(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class PixelNorm:
    """How an item's uint8 pixels (SGLANG_MM_UINT8_PIXELS: after the resize, before rescale, normalize and
    patchify) become the vision tower's float32 input; rebuilt bit for bit where the tower runs
    (``multimodal/raw_pixels.py``).

    ``kind`` "image": the feature is (H, W, 3) and follows the image processor (``x * rescale_factor``
    in float64 stored as float32, then ``(x - mean) / std`` in float32; the still image repeated over the
    temporal patch). ``kind`` "video": (F, H, W, 3) frames following the video processors (transformers'
    fused ``(x - mean / rescale) / (std / rescale)`` in float32; the last frame repeated up to a multiple
    of the temporal patch). Both lay patches out in merge-window order. Hashable: the normalize table is
    cached per value."""

    kind: str
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool

    def __post_init__(self):
        if self.kind not in ("image", "video"):
            raise ValueError(f"PixelNorm.kind must be 'image' or 'video', got {self.kind!r}")

    @classmethod
    def of(cls, kind: str, cfg) -> "PixelNorm":
        """From an image or video processor config (the fields above, by name)."""
        return cls(kind, int(cfg.patch_size), int(cfg.temporal_patch_size), int(cfg.merge_size),
                   tuple(float(v) for v in cfg.image_mean), tuple(float(v) for v in cfg.image_std),
                   bool(cfg.do_rescale), float(cfg.rescale_factor), bool(cfg.do_normalize))

    def key(self) -> str:
        """Everything the float32 values depend on besides the bytes: part of the item's hash."""
        return f"u8|{self!r}|"


@dataclass
class MultimodalDataItem:
    """One image (or video) of a request.

    Attributes:
        modality: IMAGE or VIDEO.
        feature: ``pixel_values`` for this item, shape
            ``(num_patches, C * temporal_patch_size * patch_size * patch_size)``,
            float32 (a torch tensor or numpy array; a still image's rows hold one frame, C * P * P values,
            under SGLANG_MM_COMPACT_STILL_IMAGES); or an :class:`EncodedImage` (compressed JPEG,
            decoded where the vision tower runs: ``multimodal/deferred_decode.py``); or, with
            ``pixel_norm`` set, uint8 pixels after the resize: (H, W, 3) for an image, (F, H, W, 3)
            for a video's sampled frames.
        image_grid_thw: ``(t, h, w)`` of the item in patches (before the spatial merge).
        offsets: half-open ``(start, end)`` token ranges in the request's input ids
            covered by this item's placeholder (``<|image_pad|>``) tokens.
        hash: content hash, filled later by the hashing code.
        pad_value: the pad value substituted into input ids for prefix caching,
            filled later by the hashing code.
        spatial_merge_size: the vision tower's spatial merge size (tokens = patches / merge^2).
        model_specific_data: free-form extra per-item data for a model.
        pixel_norm: None for float32 pixel_values (the baseline); else how the uint8 ``feature``
            becomes them (SGLANG_MM_UINT8_PIXELS).
        precomputed_embeddings: encoder disaggregation (``--language-only``): the vision tower's output
            for this item, (tokens, out_hidden * (1 + deepstack)), computed by an encoder server; the
            ``feature`` is then None. None everywhere else.
        decode_error: set where the vision tower runs when a deferred JPEG (SGLANG_GPU_IMAGE_DECODE) turned
            out broken past its header: the tower saw a blank image, the request ends with a 400 naming this,
            and nothing computed from it is cached.
    """

    modality: Modality
    feature: Any = None
    image_grid_thw: tuple[int, int, int] = (0, 0, 0)
    offsets: list[tuple[int, int]] = field(default_factory=list)
    hash: int | None = None
    pad_value: int | None = None
    spatial_merge_size: int = 2
    model_specific_data: dict[str, Any] = field(default_factory=dict)
    pixel_norm: PixelNorm | None = None
    precomputed_embeddings: Any = None
    decode_error: str | None = None

    @property
    def grid_thw(self) -> tuple[int, int, int]:
        return self.image_grid_thw

    @property
    def num_patches(self) -> int:
        t, h, w = self.image_grid_thw
        return int(t) * int(h) * int(w)

    @property
    def num_tokens(self) -> int:
        """Number of LLM tokens (placeholder tokens) this item expands to."""
        return self.num_patches // (self.spatial_merge_size**2)

@dataclass
class MultimodalInputs:
    """All multimodal data of one request.

    ``mrope_positions`` is the ``(3, seq_len)`` int64 M-RoPE position tensor of the
    prompt. ``mrope_position_delta`` follows transformers' ``rope_deltas``:
    ``max(mrope_positions) + 1 - seq_len``, so the token at absolute index ``i``
    (``i >= seq_len``, i.e. any decoded token) has position ``i + delta`` in all
    three rows.
    """

    mm_items: list[MultimodalDataItem] = field(default_factory=list)
    mrope_positions: Any = None
    mrope_position_delta: int = 0
    im_token_id: int = QWEN_IMAGE_TOKEN_ID
    im_start_id: int = QWEN_VISION_START_TOKEN_ID
    im_end_id: int = QWEN_VISION_END_TOKEN_ID
    video_token_id: int = QWEN_VIDEO_TOKEN_ID
