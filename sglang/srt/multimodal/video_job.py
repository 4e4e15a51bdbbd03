"""One video as a preprocessing worker's job (`--mm-processor-worker-num`, `mm_worker.py`): fetch (an http(s)
URL), decode the sampled frames, resize, normalize, patchify and hash, exactly as the tokenizer process's
threads do it (`QwenVLProcessor._load_one` -> `qwen_video.load_and_process_video`, with the processor's
video limits, uint8 switch and allowed local path, which the worker's processor has from the same
`ProcessorSpec`). The worker then writes the pixels into a segment (`mm_worker._Jobs`).

Which videos go to a worker (`is_worker_video`): an encoded file given as bytes or a string (an http(s) URL,
a data URL, base64, an allowed local path). A list of frames (PIL images, any image input) and a `RawVideo`
(decoded arrays, `sglang.Engine`) stay on the threads: their frames are client objects or whole decoded
clips, which would have to be pickled or copied to reach a worker.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.multimodal.hashing import item_hash
from sglang.srt.multimodal.processors.qwen_video import ProcessedVideo, load_and_process_video, video_item


def is_worker_video(source: Any) -> bool:
    """Whether a video source is a job for a preprocessing worker (encoded bytes or a string)."""
    return isinstance(source, (bytes, str))


def load_processed_video(processor, fetcher, source: bytes | str, cfg, hash_algo: str | None) -> ProcessedVideo:
    """The `ProcessedVideo` of `source` under `cfg` (None: the processor's video config), with its item hash
    (`hash_algo`, None: left to the tokenizer side or the scheduler). A pure function of the source and the
    config; its failures are the in-process path's (VideoLoadError, MultimodalInputError: the request's 400)."""
    # as the request builder fetches it in-process: the Accept header and the errors say "video"; no fetcher,
    # load_video refuses the URL as the in-process path does
    fetch = (lambda url: fetcher(url, "video")) if fetcher is not None else None
    pv = load_and_process_video(source, cfg or processor.video_processor,
                                allowed_local_media_path=processor.allowed_local_media_path,
                                limits=processor.video_limits, fetcher=fetch, uint8=processor.uint8_pixels)
    if hash_algo is not None:
        # the item the request will carry, hashed as `precompute_item_hashes` hashes it in-process
        pv.hash = item_hash(video_item(pv, [], processor.spatial_merge_size), hash_algo)
    return pv


__all__ = ["is_worker_video", "load_processed_video"]
