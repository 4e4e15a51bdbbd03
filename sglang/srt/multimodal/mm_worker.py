"""One media preprocessing worker process (`sglang-mmproc{k}`), spawned by `mm_worker_pool.MMProcessorPool`.

It builds its own tokenizer and processor from the server's `ProcessorSpec`, then serves jobs from its parent
over a private pipe, on `io_threads` threads: fetch (a URL), decode, preprocess, hash, and write the pixels
into a new shared-memory segment named `<prefix><job id>_<random>`; an image job (`image_flight.
load_processed_image`) or a video job (`video_job.load_processed_video`: the sampled frames decoded, resized,
normalized and patchified). Only the metadata goes back (the `ProcessedImage` or `ProcessedVideo` with a
`ShmPointerMMData` for its pixels; an `EncodedImage` with deferred JPEG decode);
the segment's name belongs to the parent from then on. When /dev/shm is full the pixels go back inline, as
the in-process path then sends them inline too.

Messages (pickled by `multiprocessing.Connection`, between this process and the parent that spawned it):
  parent -> worker  (job id, "image" | "video", source: bytes or a string (URL, data URL, base64, local path),
                    the request's image / video config or None); (job id, "pixels", the ShmPointerMMData of
                    a PIL image's RGB written by the parent, image config or None); None: stop
  worker -> parent  ("ready", pid) | ("error", text) at start-up;
                    ("done", job id, result, decode counts or None) | ("fail", job id, kind, text, counts or None),
                    kind "value" for a problem with the request's media (a 400), "internal" otherwise (a 500)

The worker exits when told to, when its job pipe closes, or when its parent is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sglang.srt.utils.process_name import set_process_name

logger = logging.getLogger(__name__)


class _Jobs:
    def __init__(self, spec, prefix: str, hash_algo: str | None):
        from transformers import AutoTokenizer

        self.spec = spec
        self.prefix = prefix
        self.hash_algo = hash_algo
        # its own copies: nothing is shared with the parent or the other workers
        self.tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_path)
        self.processor = spec.build(self.tokenizer)
        if self.processor is None:
            raise ValueError(f"model {spec.model_path} has no multimodal processor")

    def run(self, job_id: int, kind: str, source: Any, cfg):
        """The job's result (a `ProcessedImage` or `ProcessedVideo`), its pixels in a new segment named
        `<prefix><job id>_...` (the parent unlinks by that prefix the segments of a job it fails)."""
        from sglang.srt.multimodal.image_flight import load_processed_image

        if kind == "image":
            out = load_processed_image(self.processor, self.spec.fetcher, source, cfg, self.hash_algo)
        elif kind == "pixels":  # a PIL image's RGB in the caller's segment (pil_handoff.py): read, never written
            from sglang.srt.multimodal.pil_handoff import from_segment

            out = load_processed_image(self.processor, None, from_segment(source), cfg, self.hash_algo)
        elif kind == "video":
            from sglang.srt.multimodal.video_job import load_processed_video

            out = load_processed_video(self.processor, self.spec.fetcher, source, cfg, self.hash_algo)
        else:
            raise RuntimeError(f"unknown job kind {kind!r}")
        return _to_segment(out, f"{self.prefix}{job_id}_")

    def decode_counts(self) -> dict[str, int] | None:
        if not self.spec.deferred_jpeg:
            return None
        from sglang.srt.multimodal import deferred_decode

        return deferred_decode.stats()


def _to_segment(result, prefix: str):
    """`result` with its pixel array (numpy for an image, a tensor for a video) in a new segment; kept inline
    when /dev/shm is full, as the in-process path then sends it inline too, or when there is none (a
    deferred JPEG)."""
    import numpy as np
    import torch

    from sglang.srt.multimodal.transport.shm import ShmSpaceError, write_segment

    pv = result.pixel_values
    if isinstance(pv, np.ndarray):
        pv = torch.from_numpy(pv)
    if isinstance(pv, torch.Tensor):
        try:
            result.pixel_values = write_segment(pv, prefix)
        except ShmSpaceError:
            pass
    return result


def _exit_with_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _run_job(jobs: _Jobs, msg, results, send_lock: threading.Lock) -> None:
    job_id, kind, source, cfg = msg
    try:
        reply = ("done", job_id, jobs.run(job_id, kind, source, cfg), jobs.decode_counts())
    except ValueError as e:  # Image/VideoLoadError, MediaFetchError, SmartResizeError, MultimodalInputError: a 400
        reply = ("fail", job_id, "value", str(e), jobs.decode_counts())
    except BaseException as e:  # noqa: BLE001  reported to the parent, which fails only this job
        logger.exception("job %d failed", job_id)
        reply = ("fail", job_id, "internal", f"{type(e).__name__}: {e}", None)
    try:
        with send_lock:
            results.send(reply)
    except OSError:  # the parent is gone: nothing left to report to
        os._exit(1)


def worker_main(name: str, spec, prefix: str, hash_algo: str | None, io_threads: int, jobs_conn, results_conn,
                parent_pid: int, log_level: str) -> None:
    set_process_name(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent stops us
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format=f"[%(asctime)s {name}] %(levelname)s %(name)s: %(message)s")
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    try:
        jobs = _Jobs(spec, prefix, hash_algo)
    except BaseException as e:  # noqa: BLE001  the start-up failure goes to the parent as one line
        results_conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    results_conn.send(("ready", os.getpid()))
    send_lock = threading.Lock()
    pool = ThreadPoolExecutor(max(1, io_threads), thread_name_prefix="mmproc-io")
    while True:
        try:
            msg = jobs_conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        pool.submit(_run_job, jobs, msg, results_conn, send_lock)
    os._exit(0)  # jobs still running are the parent's to fail (it is stopping us)


__all__ = ["worker_main"]
