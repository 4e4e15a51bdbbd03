"""Per-request wall time of each VLM pipeline stage.

Stages, in pipeline order (ms each):
  processor    image fetch/decode/resize/normalize and placeholder expansion (tokenizer process)
  video_decode      demuxing and decoding the sampled frames of the request's videos, summed (part of processor)
  video_preprocess  resizing, normalizing and patchifying those frames, summed (part of processor)
  hash         image content hashing (wherever it runs: scheduler in the baseline)
  epd_encode   encoder disaggregation: the encoder servers' own time on this request's items (the
               slowest encoder's, cache lookups and the vision tower)
  epd_transfer encoder disaggregation: the tokenizer's wait for the encoders minus epd_encode (items
               out over HTTP, embeddings back over ZMQ, retries on another encoder)
  epd_wait     zmq_to_scheduler: how long scheduler rank 0 held the request for its embeddings
  send         pickling the request and handing it to ZMQ (tokenizer process)
  recv         from the start of `send` until the scheduler holds the request (transfer + unpickle)
  broadcast    the TP broadcast that delivered the request to every rank
  vit_encode   vision-encoder calls that encoded this request's images (a batched call counts fully
               for every request in it)
  embed_merge  scattering image embeddings into the token embeddings
  llm_prefill  prefill forward time of the chunks of this request, ViT and merge excluded
  first_token  from the HTTP request's arrival to its first token leaving the scheduler (server TTFT)
  decode       decode steps of this request, summed

Each finished stage is logged as `[VLM_STAGE_TIMER] <stage> | req=<rid> | wall=<ms> ms` (prefixed
`[TP<rank>] ` in scheduler ranks), returned in `meta_info["stage_timings_ms"]`, and observed into the
`sglang:vlm_stage_seconds` histogram when metrics are on. Off, every hook is one attribute test.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

STAGES = (
    "processor", "video_decode", "video_preprocess", "hash", "epd_encode", "epd_transfer", "send", "epd_wait", "recv", "broadcast", "vit_encode", "embed_merge", "llm_prefill", "first_token",
    "decode",
)

logger = logging.getLogger("sglang.vlm_stage_timer")


def stage_timer_enabled(server_args) -> bool:
    from sglang.srt.environ import envs

    return bool(getattr(server_args, "enable_vlm_stage_timer", False)) or envs.SGLANG_VLM_STAGE_TIMER.get()


class VlmStageTimer:
    def __init__(self, enabled: bool, tp_rank: int | None = None, dp_rank: int | None = None):
        self.enabled = enabled
        self.prefix = f"[TP{tp_rank}] " if tp_rank is not None else ""
        if dp_rank is not None:  # --dp-size > 1: which replica's scheduler measured it
            self.prefix = f"[DP{dp_rank} TP{tp_rank}] "

    def add(self, timings: dict[str, float], stage: str, ms: float) -> None:
        """Accumulates `ms` into `timings[stage]` (stages such as decode add up over steps)."""
        if self.enabled:
            timings[stage] = timings.get(stage, 0.0) + ms

    @contextmanager
    def measure(self, timings: dict[str, float], stage: str):
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(timings, stage, (time.perf_counter() - start) * 1e3)

    def emit(self, rid: str, timings: dict[str, float], stages=STAGES) -> None:
        """Logs the given stages of a request, in pipeline order."""
        if not self.enabled:
            return
        for stage in stages:
            if stage in timings:
                logger.info("%s[VLM_STAGE_TIMER] %s | req=%s | wall=%.3f ms", self.prefix, stage, rid, timings[stage])


def rounded(timings: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in timings.items()}


class EmbedStageClock:
    """`vit_encode` and `embed_merge` of one batch's embedding step, charged to the requests with image
    rows in it (a batched ViT call counts fully for each). Wrap the encoder with `timed`, run the step
    inside the `with` block; the device is synchronised around each measurement so the times are real."""

    def __init__(self, forward_batch, touched: list[int], sync):
        self.fb = forward_batch
        self.touched = touched
        self.sync = sync
        self.vit_ms = 0.0

    def timed(self, encode):
        def run(items):
            self.sync()
            start = time.perf_counter()
            out = encode(items)
            self.sync()
            self.vit_ms += (time.perf_counter() - start) * 1e3
            return out

        return run

    def __enter__(self) -> "EmbedStageClock":
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.sync()
        merge_ms = (time.perf_counter() - self._start) * 1e3 - self.vit_ms
        if exc[0] is not None or not self.fb.forward_mode.is_extend():
            return
        for stage, ms in (("vit_encode", self.vit_ms), ("embed_merge", merge_ms)):
            self.fb.stage_totals[stage] = self.fb.stage_totals.get(stage, 0.0) + ms
            for i in self.touched:
                self.fb.stage_timings[i][stage] = self.fb.stage_timings[i].get(stage, 0.0) + ms
