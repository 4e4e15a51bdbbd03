"""The tokenizer manager's part of `/update_weights_from_disk`: the gate between requests and weight updates
(upstream's `model_update_lock`), and the two phases sent to every replica.

In flight: a request is in flight from the moment it is registered to be sent until the scheduler reports it
finished (or its caller left, which sends its abort). Whether its caller has read the last output does not
matter: a stream nobody reads holds nothing on any scheduler, so it never holds back an update.

Gate: an update closes the gate (requests prepared meanwhile wait before being sent), then waits for the
requests in flight at most `--weight-update-drain-timeout` seconds. Past that bound it either aborts the
stragglers (`abort_all_requests`, which also aborts everything at once as upstream does, or
`abort_on_drain_timeout`) and waits as long again for the schedulers to confirm, or gives up with a 409
naming how many were still running; either way the gate opens when the update ends. So no request ever runs
on a mix of weights, and no request waits at the gate longer than one update's drain bound (twice it when
aborting) plus its load, even when updates come back to back (a request that waited out one update is let in
while the next one is still draining, and counts in that drain).

Phases: "load" to every replica (each all-or-none over its TP ranks); then "commit" if every replica loaded,
else "rollback", so every rank of every replica ends on the same weights, the new or the old. Once the drain
is over the phases run in a task of their own, shielded from the caller: a caller that leaves (an HTTP client
disconnecting, a cancelled task) cannot stop an update between "load" and "commit"/"rollback", and the gate
and the update lock stay held until that task ends. `weight_version` (upstream's `--weight-version` and
request field) changes only with a committed update."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput

logger = logging.getLogger(__name__)

# loading a checkpoint reads every weight file: far longer than a control call may take
LOAD_TIMEOUT_S = 3600.0
DEFAULT_DRAIN_TIMEOUT_S = 30.0  # --weight-update-drain-timeout

LANGUAGE_ONLY_REFUSAL = (
    "/update_weights_from_disk is not available on a --language-only server: its vision tower runs in the "
    "--encoder-urls servers, which would keep the old vision weights and the embeddings they cached. Start the "
    "encoders on the new checkpoint first, then restart the language servers on it")


@dataclass
class _UpdateGate:
    """One update's hold on new requests."""

    done: asyncio.Event = field(default_factory=asyncio.Event)  # set when the update is over, whatever happened
    # drained: "load" is (about to be) sent, so nothing may be sent until `done`; set in the same event-loop step
    # that saw nothing in flight, so no request can slip in between that check and the load
    loading: bool = False


class TokenizerUpdateWeightsMixin:
    """Needs from its host: _control_all, abort_request, _send_abort, model_path. Call `_init_weight_updates` in
    __init__; generate paths call `_wait_weights_ready` before registering a request, `_request_started(state)`
    when registering it and `_request_ended(state)` when the scheduler finished it or its caller left (both may
    happen: the second call is a no-op)."""

    weight_version = "default"
    weight_update_drain_timeout = DEFAULT_DRAIN_TIMEOUT_S
    _weight_update_refusal: str | None = None  # why this server refuses updates (--language-only)
    # class defaults: a host built without __init__ still serves requests
    _in_flight: dict[int, object] | None = None  # id(state) -> state: requests registered and not yet over
    _drained: asyncio.Event | None = None  # set while nothing is in flight (made by the first update)
    _update_lock: asyncio.Lock | None = None  # one update at a time; held until its phases ended
    _update_gate: _UpdateGate | None = None  # the update holding the gate, if any

    def _init_weight_updates(self, weight_version: str, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S,
                             language_only: bool = False) -> None:
        self.weight_version = weight_version
        self.weight_update_drain_timeout = drain_timeout
        self._weight_update_refusal = LANGUAGE_ONLY_REFUSAL if language_only else None

    # ------------------------------------------------------------------ requests
    async def _wait_weights_ready(self) -> None:
        """Returns once this request may be sent: no update holds the gate, or the update it waited for is
        over and the next one is still draining (it then counts in that drain, bounded like any other)."""
        waited = False
        while (gate := self._update_gate) is not None and not (waited and not gate.loading):
            await gate.done.wait()
            waited = True

    def _request_started(self, state: object) -> None:
        """`state` is the request's own object: keyed by identity, so a rid reused after its first request
        finished (while that one's stream is still unread) is a separate entry."""
        if self._in_flight is None:
            self._in_flight = {}
        self._in_flight[id(state)] = state
        if self._drained is not None:
            self._drained.clear()

    def _request_ended(self, state: object) -> None:
        if self._in_flight and self._in_flight.get(id(state)) is state:
            del self._in_flight[id(state)]
            if not self._in_flight and self._drained is not None:
                self._drained.set()

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight or ())

    # ------------------------------------------------------------------ the update
    async def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                       abort_all_requests: bool = False, weight_version: str | None = None,
                                       flush_cache: bool = True, abort_on_drain_timeout: bool = False,
                                       ) -> tuple[bool, str]:
        """(success, message). Raises GenerateError: 400 on a --language-only server, 409 when requests were
        still running at the drain bound (nothing was loaded), 504 when a replica did not answer."""
        if self._weight_update_refusal:
            raise GenerateError(self._weight_update_refusal)
        if self._update_lock is None:  # made on the running loop, by the first update
            self._drained, self._update_lock = asyncio.Event(), asyncio.Lock()
            if not self._in_flight:
                self._drained.set()
        await self._update_lock.acquire()
        gate = self._update_gate = _UpdateGate()
        try:
            if abort_all_requests:
                self.abort_request(abort_all=True)
            await self._drain(abort_all_requests or abort_on_drain_timeout)
        except BaseException:  # gave up, or the caller left while nothing was loaded: the update never ran
            self._end_update(gate)
            raise
        task = asyncio.get_running_loop().create_task(self._update(model_path, load_format, weight_version,
                                                                   flush_cache))
        task.add_done_callback(lambda t: self._update_task_done(t, gate))  # runs before the caller resumes
        return await asyncio.shield(task)

    async def _drain(self, abort_stragglers: bool) -> None:
        """Returns with nothing in flight and the gate marked loading; raises a 409 when requests were still
        running at the bound (after aborting them, if asked, and waiting as long again for their end)."""
        timeout = self.weight_update_drain_timeout
        if await self._wait_drained(timeout):
            return
        if abort_stragglers:
            rids = [getattr(s, "rid", None) for s in (self._in_flight or {}).values()]
            logger.warning("weight update: aborting %d request(s) still running after %g s", len(rids), timeout)
            for rid in rids:
                if rid is not None:
                    self._send_abort(rid, f"aborted for a weight update (running after {timeout:g} s)")
            if await self._wait_drained(timeout):
                return
        n = self.num_in_flight
        what = "aborted but not yet ended" if abort_stragglers else "still running"
        raise GenerateError(
            f"weights not updated: {n} request(s) {what} after {timeout:g} s (--weight-update-drain-timeout); every "
            "rank keeps the weights it had. Retry later, or send abort_all_requests or abort_on_drain_timeout to "
            "abort the requests still running", 409, "conflict")

    async def _wait_drained(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._in_flight:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._drained.wait(), remaining)
            except asyncio.TimeoutError:
                pass  # the loop checks once more: the last request may have ended at the deadline
        self._update_gate.loading = True  # no await since the check above: nothing was sent in between
        return True

    def _end_update(self, gate: _UpdateGate) -> None:
        if self._update_gate is gate:
            self._update_gate = None
        gate.done.set()
        self._update_lock.release()

    def _update_task_done(self, task: asyncio.Task, gate: _UpdateGate) -> None:
        self._end_update(gate)
        if not task.cancelled() and task.exception() is not None:  # retrieved here: its caller may be gone
            logger.warning("weight update failed: %s", task.exception())

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
