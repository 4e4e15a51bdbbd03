"""Synthetic multimodal datasets for the serving benchmark.

- `random-mm` follows `vllm bench serve --dataset-name random-mm`: a shared random prefix, a per-request item
  count drawn from [floor(b*(1-r_mm)), ceil(b*(1+r_mm))] capped by the per-prompt limits, each item's
  (H, W, T) bucket drawn from the normalized bucket probabilities (once a modality's limit is used up, from
  the other modality's buckets), uniform-noise JPEG images (T = 1) and noise mp4 videos of T frames at 2 fps
  (T > 1: the rate both Qwen-VL families sample at, so the server keeps every frame); text first.
- `image` follows sglang's image dataset: `--image-count` images (uniform in [1, count] with
  `--random-image-count`) of one resolution, format and content; images first.

Text lengths follow vLLM's rule for `random-mm` and SGLang's for `image` (see `common`); prompt lengths count
text tokens only (prefix included). The server's prompt token count (image tokens included) comes back in
`usage`; the metrics take the difference as the vision tokens.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import math
from dataclasses import dataclass, field

import numpy as np

from sglang.benchmark.datasets.common import RandomText, SampleRequest, TextLenConfig, len_range, random_texts

DEFAULT_BUCKETS: dict[tuple[int, int, int], float] = {(256, 256, 1): 0.5, (720, 1280, 1): 0.5, (720, 1280, 16): 0.0}
DEFAULT_LIMIT_MM = {"image": 255, "video": 0}
RESOLUTIONS = {"4k": (2160, 3840), "1080p": (1080, 1920), "720p": (720, 1280), "360p": (360, 640)}
IMAGE_FORMATS = ("jpeg", "png")


# ----------------------------------------------------------------------------- config parsing
def parse_bucket_config(spec: str | dict) -> dict[tuple[int, int, int], float]:
    """'{(H, W, T): p, ...}' -> normalized probabilities, zero-probability buckets removed."""
    raw = ast.literal_eval(spec) if isinstance(spec, str) else dict(spec)
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"bucket config must be a non-empty dict {{(H, W, T): prob}}, got {spec!r}")
    kept: dict[tuple[int, int, int], float] = {}
    for key, p in raw.items():
        if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(v, int) and v > 0 for v in key)):
            raise ValueError(f"bucket key must be an (H, W, T) tuple of positive ints, got {key!r}")
        if not isinstance(p, (int, float)) or p < 0 or not math.isfinite(p):
            raise ValueError(f"bucket {key} has invalid probability {p!r}")
        if p > 0:
            kept[key] = float(p)
    if not kept:
        raise ValueError("every bucket has probability 0")
    total = sum(kept.values())
    return {k: p / total for k, p in kept.items()}


def parse_limit_mm(spec: str | dict) -> dict[str, int]:
    raw = json.loads(spec) if isinstance(spec, str) else dict(spec)
    if not isinstance(raw, dict) or not all(isinstance(v, int) and v >= 0 for v in raw.values()):
        raise ValueError(f"limit-mm-per-prompt must map modality -> non-negative int, got {spec!r}")
    return {str(k): int(v) for k, v in raw.items()}


def parse_image_resolution(spec: str) -> tuple[int, int]:
    """'4k'/'1080p'/'720p'/'360p' or 'HxW' -> (H, W)."""
    s = spec.strip().lower()
    if s in RESOLUTIONS:
        return RESOLUTIONS[s]
    parts = s.split("x")
    if len(parts) == 2 and all(p.isdigit() and int(p) > 0 for p in parts):
        return int(parts[0]), int(parts[1])
    raise ValueError(f"image resolution must be one of {sorted(RESOLUTIONS)} or HxW, got {spec!r}")


# ----------------------------------------------------------------------------- images
def encode_image(pixels: np.ndarray, fmt: str = "jpeg") -> str:
    """HxWx3 uint8 -> data URL."""
    from PIL import Image

    fmt = fmt.lower()
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"image format must be one of {IMAGE_FORMATS}, got {fmt!r}")
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format=fmt.upper())
    return f"data:image/{fmt};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


VIDEO_FPS = 2


def make_video(rng: np.random.Generator, height: int, width: int, frames: int) -> str:
    """T noise frames as an H.264 mp4 (yuv444p: odd sizes allowed) at VIDEO_FPS -> data URL."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=VIDEO_FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv444p"
        stream.options = {"preset": "ultrafast", "crf": "23"}
        for _ in range(frames):
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return "data:video/mp4;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def make_image(rng: np.random.Generator, height: int, width: int, content: str = "random", fmt: str = "jpeg") -> str:
    if content == "random":
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    elif content == "blank":
        pixels = np.zeros((height, width, 3), dtype=np.uint8)
    else:
        raise ValueError(f"image content must be 'random' or 'blank', got {content!r}")
    return encode_image(pixels, fmt)


@dataclass(frozen=True)
class RandomMMConfig:
    text: TextLenConfig = TextLenConfig()
    base_items_per_request: int = 1
    num_mm_items_range_ratio: float = 0.0
    limit_mm_per_prompt: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_LIMIT_MM))
    bucket_config: dict[tuple[int, int, int], float] = field(default_factory=lambda: dict(DEFAULT_BUCKETS))


@dataclass(frozen=True)
class ImageDatasetConfig:
    text: TextLenConfig = TextLenConfig()
    image_count: int = 3
    random_image_count: bool = False
    image_resolution: str = "1080p"
    image_format: str = "jpeg"
    image_content: str = "random"


def sample_random_mm(
    tokenizer, num: int, cfg: RandomMMConfig, seed: int = 0, progress: bool = False
) -> list[SampleRequest]:
    rng = np.random.default_rng(seed)
    buckets = parse_bucket_config(cfg.bucket_config)
    limits = parse_limit_mm(cfg.limit_mm_per_prompt)
    r = cfg.num_mm_items_range_ratio
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"random-mm-num-mm-items-range-ratio must be in [0, 1], got {r}")
    # a modality takes items only when some bucket of it has probability and its limit allows
    modality = {k: "image" if k[2] == 1 else "video" for k in buckets}
    cap = sum(limits.get(m, 0) for m in set(modality.values()))
    if cfg.base_items_per_request > cap:
        raise ValueError(f"random-mm-base-items-per-request={cfg.base_items_per_request} exceeds the item "
                         f"limit {cap} of random-mm-limit-mm-per-prompt {limits} for buckets {sorted(buckets)}")
    lo, hi = len_range(cfg.base_items_per_request, r)
    lo, hi = max(0, min(lo, cap)), max(0, min(hi, cap))
    gen = RandomText(tokenizer, rng)
    out = []
    for text, plen, olen in random_texts(gen, cfg.text, rng, num, progress):
        k = int(rng.integers(lo, hi + 1))
        left = {m: limits.get(m, 0) for m in ("image", "video")}
        req = SampleRequest(text, plen, olen, images_first=False)
        for _ in range(k):
            keys = [b for b in buckets if left[modality[b]] > 0]
            probs = np.array([buckets[b] for b in keys])
            h, w, t = keys[int(rng.choice(len(keys), p=probs / probs.sum()))]
            left[modality[(h, w, t)]] -= 1
            if t == 1:
                req.images.append(make_image(rng, h, w, "random", "jpeg"))
                req.image_sizes.append((h, w))
            else:
                req.videos.append(make_video(rng, h, w, t))
                req.video_sizes.append((h, w, t))
        out.append(req)
    return out


def sample_image_dataset(
    tokenizer, num: int, cfg: ImageDatasetConfig, seed: int = 0, progress: bool = False
) -> list[SampleRequest]:
    rng = np.random.default_rng(seed)
    h, w = parse_image_resolution(cfg.image_resolution)
    fmt = cfg.image_format.lower()
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"image format must be one of {IMAGE_FORMATS}, got {cfg.image_format!r}")
    if cfg.image_count < 1:
        raise ValueError(f"image-count must be at least 1, got {cfg.image_count}")
    gen = RandomText(tokenizer, rng)
    out = []
    for text, plen, olen in random_texts(gen, cfg.text, rng, num, progress):
        k = int(rng.integers(1, cfg.image_count + 1)) if cfg.random_image_count else cfg.image_count
        images = [make_image(rng, h, w, cfg.image_content, fmt) for _ in range(k)]
        out.append(SampleRequest(text, plen, olen, images, [(h, w)] * k, images_first=True))
    return out
