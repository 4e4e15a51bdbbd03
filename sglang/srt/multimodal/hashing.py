"""Content hashes of multimodal items and the pad values derived from them.

A pad value replaces an image's placeholder token ids in the prefix-cache key, so two requests
with the same image share cached KV and a different image never matches.

Where the hash is computed (SGLANG_MM_PRECOMPUTE_HASH):
  1 / auto  the tokenizer process hashes every item in worker threads before the request is pickled
            (`precompute_item_hashes`); the scheduler only checks (`ensure_item_hashes` finds nothing
            to do unless a request reached it by another path).
  0         baseline: the scheduler hashes every item (sha256) in its loop when the request arrives.

Algorithms (SGLANG_MM_HASH_ALGO):
  xxh3_128  default; ~10 GB/s on one core and releases the GIL, so worker threads hash in parallel.
  blake3    cryptographic, releases the GIL.
  sha256    the baseline function, bit for bit (raw bytes only: it ignores dtype, shape and grid).
xxh3_128 and blake3 also digest a header (dtype, shape, grid_thw), so two items whose pixel buffers
are byte-equal but are laid out or sized differently never share a hash: a feature of shape
(num_patches, dim) alone does not tell a 2x8 patch grid from a 4x4 one.

Both switches are resolved together by `MMHashConfig.from_env()`, once, when the tokenizer side and
the scheduler are constructed; the hashing functions themselves take the algorithm as an argument.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import torch

from sglang.srt.multimodal.bounded_fanout import run_bounded
from sglang.srt.multimodal.mm_types import EncodedImage

# Pad values stay below 2**30 (as upstream) so they fit any int32 id tensor.
PAD_VALUE_MODULUS = 1 << 30

HASH_ALGOS = ("xxh3_128", "blake3", "sha256")
BASELINE_HASH_ALGO = "sha256"
DEFAULT_HASH_ALGO = "xxh3_128"


def _as_array(feature) -> np.ndarray:
    """A C-contiguous numpy view of the feature (a copy only if it is not contiguous or not on CPU)."""
    if isinstance(feature, torch.Tensor):
        t = feature.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        # numpy has no bfloat16: hash its bytes as uint16 (the header still says bfloat16).
        return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    return np.ascontiguousarray(feature)


def _as_bytes_view(feature) -> memoryview:
    return memoryview(_as_array(feature)).cast("B")


def _dtype_name(feature) -> str:
    if isinstance(feature, torch.Tensor):
        return str(feature.dtype).removeprefix("torch.")  # torch.float32 and np.float32 both -> "float32"
    return np.asarray(feature).dtype.name


def sha256_feature_hash(feature) -> int:
    """Baseline hash: sha256 over the raw pixel bytes, as upstream computed it in the scheduler."""
    return int.from_bytes(hashlib.sha256(_as_bytes_view(feature)).digest()[:8], "little")


def _header(feature, grid_thw, salt: str = "") -> bytes:
    shape = tuple(int(s) for s in getattr(feature, "shape", np.shape(feature)))
    grid = tuple(int(g) for g in grid_thw) if grid_thw is not None else ()
    return f"{salt}{_dtype_name(feature)}|{shape}|{grid}|".encode()


def feature_hash(feature, algo: str = DEFAULT_HASH_ALGO, grid_thw=None, salt: str = "") -> int:
    """Content hash of one item's feature as a non-negative int (64 bits for sha256, 128 otherwise).

    Pure and thread-safe; xxhash and blake3 release the GIL while they digest the buffer."""
    if isinstance(feature, EncodedImage):
        return encoded_image_hash(feature, algo)
    if algo == "sha256":
        return sha256_feature_hash(feature)
    return _digest(algo, _header(feature, grid_thw, salt), _as_bytes_view(feature))


def _digest(algo: str, header: bytes, data=b"") -> int:
    """`header` then `data` digested by `algo`: 64 bits for sha256, 128 for xxh3_128 and blake3."""
    if algo == "sha256":
        h = hashlib.sha256(header)
        h.update(data)
        return int.from_bytes(h.digest()[:8], "little")
    if algo == "xxh3_128":
        import xxhash

        h = xxhash.xxh3_128(header)
        h.update(data)
        return h.intdigest()
    if algo == "blake3":
        import blake3

        h = blake3.blake3(header)
        h.update(data)
        return int.from_bytes(h.digest(16), "little")
    raise ValueError(f"unknown hash algorithm {algo!r}; choose one of {', '.join(HASH_ALGOS)}")


def content_digest(data: bytes, algo: str = DEFAULT_HASH_ALGO) -> int:
    """Digest of an encoded file's bytes (the single-flight key of an image source, `image_flight.py`)."""
    return _digest(algo, b"content|", data)


def encoded_image_hash(enc: EncodedImage, algo: str = DEFAULT_HASH_ALGO) -> int:
    """Hash of a deferred image (SGLANG_GPU_IMAGE_DECODE): its compressed bytes plus the target grid
    and the preprocessing config, so the same file sized or normalized differently never matches."""
    cfg = enc.processor
    params = (cfg.patch_size, cfg.temporal_patch_size, cfg.merge_size, cfg.image_mean, cfg.image_std,
              cfg.do_rescale, cfg.rescale_factor, cfg.do_normalize, cfg.resample) if cfg is not None else ()
    header = f"encoded-jpeg|{tuple(enc.target_hw)}|{tuple(enc.grid_thw)}|{params}|".encode()
    return _digest(algo, header, enc.data)


def item_hash(item, algo: str = DEFAULT_HASH_ALGO) -> int:
    grid = getattr(item, "image_grid_thw", None)
    key = (getattr(item, "model_specific_data", None) or {}).get("source_key")
    if key is not None and algo != "sha256":
        return source_key_hash(key, algo, grid, video_salt(item))
    norm = getattr(item, "pixel_norm", None)
    if norm is not None:  # SGLANG_MM_UINT8_PIXELS: see `uint8_pixels_hash`
        return uint8_pixels_hash(item.feature, norm, algo, grid, video_salt(item))
    return feature_hash(item.feature, algo, grid, video_salt(item))


def uint8_pixels_hash(feature, norm, algo: str, grid_thw=None, salt: str = "") -> int:
    """Hash of an item carried as uint8 after the resize (SGLANG_MM_UINT8_PIXELS): header (dtype, shape,
    grid), the recipe (`PixelNorm.key`: kind, patch sizes, mean, std, rescale) and the bytes, with every
    algorithm (sha256 too, which hashes raw bytes alone only for the float32 baseline). Its pixel values
    are a function of exactly these, and distinct uint8 inputs give distinct values (the normalize table
    is injective per channel), so two items get one hash with the switch on exactly when they would with
    it off: the prefix cache and the ViT cache hit and miss alike both ways. The numbers differ (the bytes
    hashed differ); nothing compares hashes across servers or across a restart with the other setting."""
    return _digest(algo, _header(feature, grid_thw, salt + norm.key()), _as_bytes_view(feature))


def source_key_hash(key: str, algo: str, grid_thw=None, salt: str = "") -> int:
    """A video decoded from a file: its pixels are a pure function of the file's bytes and the processing
    config, both in `key`, so hashing that (plus grid and time step) stands for hashing the pixels, which
    run to hundreds of MB for a long clip. The sha256 baseline keeps hashing pixels."""
    if algo == "sha256":  # item_hash never asks: the sha256 baseline hashes the pixels
        raise ValueError("source_key_hash is for the fast hashes (xxh3_128, blake3)")
    return _digest(algo, f"video-source|{key}|{tuple(int(g) for g in grid_thw or ())}|{salt}".encode())


def video_salt(item) -> str:
    """A video's hash also covers its time step (Qwen2.5-VL's second_per_grid_t): the same frames
    sampled at another rate get other M-RoPE positions, so their KV must not be shared. Images: ""."""
    extra = getattr(item, "model_specific_data", None) or {}
    if "second_per_grid_t" not in extra:
        return ""
    return f"video|{float(extra['second_per_grid_t'])!r}|"


def pad_value_from_hash(h: int) -> int:
    return h % PAD_VALUE_MODULUS


def combined_hash(hashes: list[int]) -> int:
    """One key for a set of items, order-sensitive (the baseline embedding cache's key).

    64-bit hashes are packed in 8 bytes exactly as the baseline did; wider ones in 16."""
    parts = (h.to_bytes(8 if h < (1 << 64) else 16, "little", signed=False) for h in hashes)
    digest = hashlib.sha256(b"".join(parts)).digest()
    return int.from_bytes(digest[:8], "little")


# ---------------------------------------------------------------------- switches
@dataclass(frozen=True)
class MMHashConfig:
    """Where and how items are hashed, resolved once by the caller at construction (`from_env`) and
    kept: `precompute` (the tokenizer hashes, else the scheduler) and `algo` (one of HASH_ALGOS)."""

    precompute: bool = True
    algo: str = DEFAULT_HASH_ALGO

    def __post_init__(self):
        if self.algo not in HASH_ALGOS:
            raise ValueError(f"unknown hash algorithm {self.algo!r}; choose one of {', '.join(HASH_ALGOS)}")

    @classmethod
    def from_env(cls) -> "MMHashConfig":
        """SGLANG_MM_PRECOMPUTE_HASH (`auto` means on; measured in docs/optimizations/mm-hash-precompute.md:
        no load regime made hashing in the scheduler loop faster, because the tokenizer side hashes in
        worker threads that stall nothing while the scheduler side stalls every running request) and
        SGLANG_MM_HASH_ALGO when set; otherwise xxh3_128, or sha256 (the baseline) when precompute is 0.
        The only reader of these two switches."""
        from sglang.srt.environ import envs

        precompute = envs.SGLANG_MM_PRECOMPUTE_HASH.get() != "0"
        if envs.SGLANG_MM_HASH_ALGO.is_set():
            algo = envs.SGLANG_MM_HASH_ALGO.get()
        else:
            algo = DEFAULT_HASH_ALGO if precompute else BASELINE_HASH_ALGO
        return cls(precompute, algo)


def precompute_hash_enabled() -> bool:
    """`MMHashConfig.from_env().precompute`: resolve once and keep it (a call reads the environment)."""
    return MMHashConfig.from_env().precompute


def configured_hash_algo() -> str:
    """`MMHashConfig.from_env().algo`: resolve once and keep it (a call reads the environment)."""
    return MMHashConfig.from_env().algo


# ---------------------------------------------------------------------- filling items
def ensure_item_hashes(mm_inputs, algo: str | None = None) -> int:
    """Fills `hash` and `pad_value` of every item that lacks them; returns how many were hashed.

    The scheduler's check: with the tokenizer precomputing, every item already has both and this
    costs one attribute test per item. `algo=None` uses the configured algorithm, so an item that
    reaches the scheduler unhashed gets the same hash the tokenizer would have given it."""
    computed = 0
    for item in mm_inputs.mm_items:
        if item.hash is None:
            algo = algo or configured_hash_algo()  # resolved at most once per call, only when needed
            item.hash = item_hash(item, algo)
            computed += 1
        if item.pad_value is None:
            item.pad_value = pad_value_from_hash(item.hash)
    return computed


def precompute_item_hashes(mm_inputs, algo: str, executor: Executor | None = None,
                           max_in_flight: int | None = None) -> int:
    """Tokenizer side: hashes every unhashed item, one task per item on `executor` (a thread pool:
    the digests release the GIL, so items hash in parallel and the event loop keeps running), at most
    `max_in_flight` at a time (None or 0: all at once; `bounded_fanout.run_bounded`).
    Returns how many items were hashed. Must not be called on the event loop thread."""
    todo = [it for it in mm_inputs.mm_items if it.hash is None]
    if executor is not None and len(todo) > 1:
        hashes = run_bounded(executor, lambda it: item_hash(it, algo), todo, max_in_flight)
    else:
        hashes = [item_hash(it, algo) for it in todo]
    for it, h in zip(todo, hashes):
        it.hash = h
    for it in mm_inputs.mm_items:
        if it.pad_value is None:
            it.pad_value = pad_value_from_hash(it.hash)
    return len(todo)
