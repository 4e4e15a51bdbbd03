"""Each distinct image in flight is fetched, decoded, preprocessed and hashed once.

`SharedImageLoader` sits between a processor and its per-image work (`load_and_process_image`):

- **Identity** (`identify`, cheap, on the request's own thread): an http(s) URL is its own key (the same
  URL in concurrent requests is fetched once); every other encoded source (bytes, base64, data URL, an
  allowed local file) is read to its bytes and keyed by their length and digest, so the same picture sent
  as base64 by one client and as a data URL by another is one image. A PIL image has no encoded form and
  no key: it is processed on its own, as before (with workers: its RGB handed to one in shared memory,
  `pil_handoff.py`). With workers (SGLANG_MM_DATA_URL_TEXT_KEY, default on) a
  data URL is keyed by its base64 text instead and decoded in the worker: the base64 decode was ~11% of the
  tokenizer process's CPU per chat (docs/optimizations/mm-frontend.md); the price is that one picture sent
  as a data URL and as raw bytes by concurrent requests is processed twice. SGLANG_MM_SINGLE_FLIGHT=0: no
  image has a key, every one is processed on its own.
- **Within a request** the processor maps each distinct key once and gives every duplicate the first
  one's result (`QwenVLProcessor.process`), whatever the timing.
- **Across requests** (`load`) a `SingleFlight` keyed by (identity, image processor config) lets the first
  request do the work while concurrent ones wait for its `ProcessedImage`; a failure (a 404, a corrupt
  file) is raised in every one of them, each answering the same 400. Nothing is kept once the work is done.
- **Hash.** With the tokenizer precomputing hashes, the item hash (`hashing.item_hash`, the one
  `precompute_item_hashes` would compute from the same pixels) is computed inside the flight, once.

The digest that keys bytes uses the server's image hash algorithm (SGLANG_MM_HASH_ALGO): the key is as
strong as the cache key the image gets anyway. Shared results are read-only by contract: the pixels of one
`ProcessedImage` may back items of several requests (transports copy them, nothing writes them in place).

**Worker processes** (`--mm-processor-worker-num`, `mm_worker_pool.py`). `identify` and the flight stay where
requests arrive; the per-image work (`load_processed_image`) runs in a worker, which returns the pixels as a
shared-memory segment. A segment name has one owner, so a flight shared by several requests is split: the
leader's request keeps the worker's name and every other one gets a hard link of its own (`split`).

**Spilling** (bounded admission, `bounded_fanout.py`). Without workers, an image loaded here can have its
pixels written to a shared-memory segment as soon as it is processed (`spill_prefix`), exactly as a worker
returns them: a request with many images then holds in this process only the K images being processed, not
every finished one until the request is sent. Ownership is the workers' rule: one name per caller (`split`).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Hashable

import numpy as np
import torch
from PIL import Image

from sglang.srt.multimodal.hashing import content_digest, item_hash
from sglang.srt.multimodal.image_io import ImageLoadError, load_image_bytes
from sglang.srt.multimodal.media_fetch import is_http_url
from sglang.srt.multimodal.mm_types import Modality, MultimodalDataItem
from sglang.srt.multimodal.transport.shm import (
    ShmPointerMMData,
    ShmSpaceError,
    link_segment,
    unlink_segments,
    write_segment,
)
from sglang.srt.utils.single_flight import SingleFlight


class SharedImageLoader:
    def __init__(self, processor, fetcher=None, key_algo: str = "xxh3_128", hash_algo: str | None = None,
                 remote=None, spill_prefix: str | None = None, shared: bool = True, data_url_text_key: bool = False):
        """`processor`: has `load_and_process_image(source, cfg)` and `allowed_local_media_path`; `fetcher`:
        url -> bytes (None: URLs are refused); `key_algo`: digest of the bytes keys; `hash_algo`: the item
        hash computed in the flight (None: left to the caller, e.g. the scheduler's baseline sha256);
        `remote`: the preprocessing worker pool (`load_image(source, cfg)`, `share(result, n)`) that loads
        encoded images and URLs (None: every image is loaded here, in the caller's thread); `spill_prefix`: an
        image loaded here has its pixels written to a shared-memory segment under this prefix as soon as it is
        processed (bounded admission: a request's finished images do not stay in this process; as a worker's,
        each caller owns its segment name), None: they stay in memory until the request is sent; `shared`
        (SGLANG_MM_SINGLE_FLIGHT): False, no image has an identity, so each is processed on its own (no bytes
        read or digested here, nothing shared within a request or across requests); `data_url_text_key`
        (SGLANG_MM_DATA_URL_TEXT_KEY, with `remote` only): a data URL is keyed by a digest of its base64 text
        and sent as it is, the worker decoding it (no base64 decode here)."""
        self.processor = processor
        self.fetcher = fetcher
        self.key_algo = key_algo
        self.hash_algo = hash_algo
        self.remote = remote
        self.spill_prefix = spill_prefix
        self.shared = shared
        self.data_url_text_key = data_url_text_key and remote is not None
        self.flight = SingleFlight()
        self._lock = threading.Lock()
        self.duplicates = 0  # images that reused an identical image of the same request

    def identify(self, source: Any) -> tuple[Hashable | None, Any]:
        """(key or None, the source to load: the bytes read for it when there are any). Raises
        ImageLoadError (a 400) for a source that cannot be read, as loading it would. Single-flight off: (None,
        the source as given), its problems found when it is loaded."""
        if not self.shared:
            return None, source
        if is_http_url(source):
            url = source.strip()
            return ("url", url), url
        if self.data_url_text_key and isinstance(source, str) and source[:16].lstrip().lower().startswith("data:"):
            # its own key space: the same payload as raw bytes is another key (a missed share, never a wrong one)
            payload = source[source.find(",") + 1:].strip().encode("utf-8", "surrogatepass")
            return ("data-url", len(payload), content_digest(payload, self.key_algo)), source
        data = load_image_bytes(source, allowed_local_media_path=self.processor.allowed_local_media_path)
        if data is None:  # a PIL image
            return None, source
        return ("bytes", len(data), content_digest(data, self.key_algo)), data

    def load(self, key: Hashable | None, source: Any, cfg=None):
        """The `ProcessedImage` of `source` under `cfg` (None: the processor's own config), shared with
        concurrent loads of the same key and config (no config and the processor's own are one)."""
        same = cfg if cfg is not None else getattr(self.processor, "image_processor", None)
        key = None if key is None else (key, same)
        remote = self.remote
        if remote is not None and isinstance(source, (bytes, str)):  # encoded bytes or a URL: a worker's job
            return self.flight.run(key, lambda: remote.load_image(source, cfg), split=remote.share)
        if remote is not None and isinstance(source, Image.Image):  # its RGB handed off in shm (pil_handoff.py)
            return self.flight.run(key, lambda: self._load_pil_remote(source, cfg), split=remote.share)
        prefix = self.spill_prefix
        if prefix is not None:
            return self.flight.run(key, lambda: spill_pixels(self._load(source, cfg), prefix),
                                   split=lambda pim, n: share_processed(pim, n, prefix))
        return self.flight.run(key, lambda: self._load(source, cfg))

    def note_duplicates(self, n: int) -> None:
        if n:
            with self._lock:
                self.duplicates += n

    def stats(self) -> dict[str, int]:
        """`mm_images_processed`: images fetched, decoded and preprocessed; `mm_images_shared`: images that
        took another's result (a concurrent request's, or an identical one in the same request)."""
        with self._lock:
            dup = self.duplicates
        return {"mm_images_processed": self.flight.leaders, "mm_images_shared": self.flight.joined + dup}

    def _load_pil_remote(self, image, cfg):
        try:
            return self.remote.load_pil(image, cfg, self.processor.max_image_pixels)
        except ShmSpaceError:  # /dev/shm cannot take its RGB: processed here, as without workers
            return self._load(image, cfg)

    def _load(self, source: Any, cfg):
        return load_processed_image(self.processor, self.fetcher, source, cfg, self.hash_algo)


def load_processed_image(processor, fetcher, source: Any, cfg, hash_algo: str | None):
    """Fetch (an http(s) URL, with `fetcher`), decode, preprocess and hash (with `hash_algo`, if any) one
    image: a pure function of the source and the config, run by the flight's leader or by a worker."""
    if is_http_url(source):
        if fetcher is None:
            raise ImageLoadError("loading images from http(s) URLs is not enabled here: pass the image as "
                                 "base64, a data URL or raw bytes")
        source = fetcher(source)
    pim = processor.load_and_process_image(source, cfg)
    if hash_algo is not None:
        item = MultimodalDataItem(Modality.IMAGE, pim.pixel_values, tuple(pim.grid_thw), pixel_norm=pim.norm)
        pim.hash = item_hash(item, hash_algo)
    return pim


def spill_pixels(pim, prefix: str):
    """`pim` with its pixel array moved into a new shared-memory segment named under `prefix` (the caller owns
    the name); kept inline when /dev/shm is full (the request then sends it inline, as `_to_shm` would) or when
    there is no array (a deferred JPEG)."""
    if isinstance(pim.pixel_values, np.ndarray):
        try:
            pim.pixel_values = write_segment(torch.from_numpy(pim.pixel_values), prefix)
        except ShmSpaceError:
            pass
    return pim


def share_processed(pim, n: int, prefix: str) -> list:
    """`pim` for the n callers of one flight: the first keeps its segment name, every other gets a hard link of
    its own (no pixel copied). All or nothing: on failure every name is unlinked."""
    ptr = pim.pixel_values
    if n == 1 or not isinstance(ptr, ShmPointerMMData):
        return [pim] * n
    parts = [pim]
    try:
        for _ in range(n - 1):
            parts.append(dataclasses.replace(pim, pixel_values=link_segment(ptr, prefix)))
    except BaseException:
        unlink_segments([p.pixel_values.name for p in parts])
        raise
    return parts


__all__ = ["SharedImageLoader", "load_processed_image", "share_processed", "spill_pixels"]
