"""The tokenizer manager's control requests to the schedulers (flush_cache, server info, load,
profiling): each is sent once and answered by every data-parallel replica; the replies are merged
(data_parallel_messages.py) into one answer. Upstream's `TokenizerCommunicatorMixin` holds the same
concern. `TokenizerManager` (tokenizer_manager.py) mixes this in."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.errors import GenerateError
from sglang.srt.managers.data_parallel_messages import (
    merge_flush_replies,
    merge_profile_replies,
    merge_server_infos,
)
from sglang.srt.managers.io_struct import (
    FlushCacheReq,
    FlushCacheReqOutput,
    GetLoadReq,
    GetServerInfoReq,
    ProfileReq,
    ProfileReqOutput,
)
from sglang.srt.multimodal import deferred_decode

logger = logging.getLogger(__name__)

CONTROL_TIMEOUT_S = 30.0


@dataclass
class _ControlWait:
    """A control request in flight: one reply expected from every data-parallel replica."""

    future: asyncio.Future
    expected: int
    replies: list = field(default_factory=list)


class TokenizerCommunicatorMixin:
    """Needs from its host: dp_size, builder, metrics, healthy, _send_sock, _control_ids,
    _control_waiters and _raise_if_unhealthy."""

    async def flush_cache(self, timeout: float = CONTROL_TIMEOUT_S) -> FlushCacheReqOutput:
        """Every replica flushes; success only when all of them did."""
        return merge_flush_replies(await self._control_all(FlushCacheReq(), timeout))

    async def get_server_info(self, timeout: float = CONTROL_TIMEOUT_S) -> dict[str, Any]:
        """The scheduler's figures (at --dp-size > 1: summed, each replica's under "replicas")."""
        outs = await self._control_all(GetServerInfoReq(), timeout)
        info = merge_server_infos([dict(o.info) for o in outs])
        info["shm_fallback_count"] = self.builder.shm_fallback_count
        info["image_decode_tokenizer"] = deferred_decode.stats()  # deferred JPEGs and fallback reasons
        pool = getattr(self.builder, "mm_pool", None)
        if pool is not None:  # --mm-processor-worker-num: each worker's pid, jobs and restarts; its JPEG counts
            info["mm_processor_workers"] = pool.stats()
            for event, n in pool.decode_counts().items():
                info["image_decode_tokenizer"][event] = info["image_decode_tokenizer"].get(event, 0) + n
        # SGLANG_MM_COMPACT_STILL_IMAGES as the request builder resolved it (still images sent as one frame)
        info["mm_compact_still_images"] = bool(getattr(getattr(self.builder, "processor", None),
                                                       "compact_still_images", False))
        # SGLANG_MM_UINT8_PIXELS as the request builder resolved it (the carrier this server sends)
        info["mm_uint8_pixels"] = bool(getattr(getattr(self.builder, "processor", None), "uint8_pixels", False))
        info["mm_uint8_items"] = getattr(self.builder, "num_uint8_items", 0)  # what was sent, not the setting
        if getattr(self.builder, "image_loader", None) is not None:  # single-flight: images processed vs shared
            info.update(self.builder.image_loader.stats())
        if getattr(self.builder, "ipc", None) is not None:
            info.update(self.builder.ipc.stats())
        if getattr(self, "epd", None) is not None:  # --language-only: each encoder's work in flight and failures
            info["encoders"] = self.epd.pool.stats()
            info["encoder_transfer_backend"] = self.epd.backend
        return info

    async def profile(self, req: ProfileReq, timeout: float = CONTROL_TIMEOUT_S) -> ProfileReqOutput:
        """Starts or stops the schedulers' torch profilers (a stop waits for the traces to be written)."""
        return merge_profile_replies(await self._control_all(req, timeout))

    async def get_load(self, timeout: float = CONTROL_TIMEOUT_S) -> list[dict[str, Any]]:
        """Every replica's load (upstream's /get_load list), by dp_rank."""
        outs = await self._control_all(GetLoadReq(), timeout)
        return [{"dp_rank": o.dp_rank, "num_reqs": o.num_reqs, "num_waiting_reqs": o.num_waiting_reqs,
                 "num_tokens": o.num_tokens, "num_pending_tokens": o.num_pending_tokens, "ts_tic": o.ts_tic}
                for o in sorted(outs, key=lambda o: o.dp_rank)]

    async def _control_all(self, req: Any, timeout: float) -> list[Any]:
        """Sends a control request and waits for the reply of every data-parallel replica (the
        data-parallel controller hands control requests to all of them)."""
        self._raise_if_unhealthy()
        req.req_id = next(self._control_ids)
        wait = _ControlWait(asyncio.get_running_loop().create_future(), self.dp_size)
        self._control_waiters[req.req_id] = wait
        await self._send_sock.send_pyobj(req)
        try:
            return await asyncio.wait_for(wait.future, timeout)
        except asyncio.TimeoutError:
            raise GenerateError(
                f"the scheduler did not answer {type(req).__name__} within {timeout:g} s", 504, "timeout"
            ) from None
        finally:
            self._control_waiters.pop(req.req_id, None)

    def _resolve_control(self, msg: Any) -> None:
        """The waiter with the reply's id gets it once every replica answered; a reply whose waiter gave
        up (timed out) is dropped, so it can never answer a later request."""
        wait = self._control_waiters.get(msg.req_id)
        if wait is None:
            logger.debug("dropping a late %s (request %d timed out)", type(msg).__name__, msg.req_id)
            return
        wait.replies.append(msg)
        if len(wait.replies) >= wait.expected:
            self._control_waiters.pop(msg.req_id, None)
            if not wait.future.done():
                wait.future.set_result(wait.replies)



    async def render_metrics(self) -> str:
        """Prometheus text; scheduler gauges are refreshed with a control call per scrape."""
        if self.healthy:
            try:
                self.metrics.update_scheduler_state(await self.get_server_info(timeout=5.0))
            except Exception as e:  # a slow scheduler must not break scraping
                logger.warning("metrics: scheduler state unavailable: %s", e)
        return self.metrics.render()
