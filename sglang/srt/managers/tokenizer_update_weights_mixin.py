"""The tokenizer manager's part of `/update_weights_from_disk`: the gate between requests and weight
updates (upstream's `model_update_lock`), and the two phases sent to every replica.

Gate: a request counts as in flight from the moment it is registered to be sent until its caller has its
last output (or left). An update closes the gate (requests prepared meanwhile wait before being sent), waits
until nothing is in flight (with `abort_all_requests` it first aborts everything, as upstream does; the
aborted requests end with finish reason abort), runs, and opens the gate again whatever happened. So no
request ever runs on a mix of weights, and none is refused because of an update.

Phases: "load" to every replica (each all-or-none over its TP ranks); then "commit" if every replica
loaded, else "rollback", so every rank of every replica ends on the same weights, the new or the old.
`weight_version` (upstream's `--weight-version` and request field) changes only with a committed update."""

from __future__ import annotations

import asyncio
import logging

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput

logger = logging.getLogger(__name__)

# loading a checkpoint reads every weight file: far longer than a control call may take
LOAD_TIMEOUT_S = 3600.0


class TokenizerUpdateWeightsMixin:
    """Needs from its host: _control_all, abort_request, model_path. Call `_init_weight_updates` in
    __init__; generate paths call `_wait_weights_ready` before registering a request and
    `_request_started` / `_request_ended` around its life."""

    weight_version = "default"
    _in_flight = 0  # requests registered to be sent and not yet over
    # made by the first update (class defaults: a host built without __init__ still serves requests)
    _weights_open: asyncio.Event | None = None  # cleared while an update runs: requests wait before sending
    _drained: asyncio.Event | None = None  # set while nothing is in flight
    _update_lock: asyncio.Lock | None = None

    def _init_weight_updates(self, weight_version: str) -> None:
        self.weight_version = weight_version

    def _gate(self) -> None:
        if self._update_lock is None:
            self._weights_open, self._drained, self._update_lock = asyncio.Event(), asyncio.Event(), asyncio.Lock()
            self._weights_open.set()
            if self._in_flight == 0:
                self._drained.set()

    async def _wait_weights_ready(self) -> None:
        while self._weights_open is not None and not self._weights_open.is_set():
            await self._weights_open.wait()

    def _request_started(self) -> None:
        self._in_flight += 1
        if self._drained is not None:
            self._drained.clear()

    def _request_ended(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._drained is not None:
            self._drained.set()

    async def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                       abort_all_requests: bool = False, weight_version: str | None = None,
                                       flush_cache: bool = True) -> tuple[bool, str]:
        """(success, message). One update at a time; requests wait at the gate meanwhile."""
        self._gate()
        async with self._update_lock:
            self._weights_open.clear()
            try:
                if abort_all_requests:
                    self.abort_request(abort_all=True)
                await self._drained.wait()
                return await self._update(model_path, load_format, weight_version, flush_cache)
            finally:
                self._weights_open.set()

    async def _update(self, model_path: str, load_format: str | None, weight_version: str | None,
                      flush_cache: bool) -> tuple[bool, str]:
        try:
            loads = await self._control_all(UpdateWeightFromDiskReqInput(model_path, load_format, "load"),
                                            LOAD_TIMEOUT_S)
        except GenerateError:
            # no answer in time: whatever a replica loaded is undone once its load ends (messages keep order)
            await self._control_all(UpdateWeightFromDiskReqInput(phase="rollback"), LOAD_TIMEOUT_S)
            raise
        failed = [o for o in sorted(loads, key=lambda o: o.dp_rank) if not o.success]
        await self._control_all(UpdateWeightFromDiskReqInput(phase="rollback" if failed else "commit",
                                                             flush_cache=flush_cache), LOAD_TIMEOUT_S)
        if failed:
            return False, " | ".join(o.message for o in failed)
        self.model_path = model_path
        message = loads[0].message
        if weight_version is not None:
            self.weight_version = weight_version
            message += f" Weight version updated to {weight_version}."
        logger.info("weights updated from %s (weight version %s)", model_path, self.weight_version)
        return True, message
