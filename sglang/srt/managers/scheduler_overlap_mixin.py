"""The overlap scheduler (upstream's default; `--disable-overlap-schedule` turns it off): while decode
step N runs on the forward thread, this thread receives requests, builds step N+1 and launches it with
its decode inputs as future tokens (the ids step N is sampling, filled on the device), then applies
step N's tokens and sends them. The host work of a step hides behind the previous step's forward.

What keeps the outputs equal to the step-by-step scheduler's:
- prefill (EXTEND) batches are applied in the step that launched them: their results decide who
  decodes next (chunk progress, first tokens), so only decode steps are overlapped;
- a request that finishes (stop, length, abort) at step N is still in step N+1: that spare row is
  computed and its token dropped, and its KV, request slot and worker state are released only once
  no launched step uses them (`release_kv`, `release_worker_state`);
- anything that takes KV back from running requests (retraction, priority preemption) or needs a quiet
  rank (flush, profile, weight updates) first applies the step in flight, then decides as without overlap.
"""

from __future__ import annotations

import logging

from sglang.srt.managers.io_struct import AbortReq, GetLoadReq, TokenizedGenerateReqInput
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.tp_worker_overlap_thread import LaunchedBatch, OverlapWorkerThread

logger = logging.getLogger(__name__)

# messages a rank may handle with a step in flight; anything else (flush, profile, weight update) waits
_OVERLAP_SAFE = (TokenizedGenerateReqInput, AbortReq, GetLoadReq)


class SchedulerOverlapMixin:
    """Needs from its host: worker, kv, stage_timer, running, waiting, server_args, recv_requests(),
    process_input_requests(), get_next_batch_to_run(), process_batch_result(), _fail_batch(),
    report_load(), flush_outputs()."""

    enable_overlap = False
    _launched: list[LaunchedBatch] = []  # launched and not yet applied, oldest first (at most two)

    def init_overlap(self, enable: bool) -> None:
        self.enable_overlap = enable
        self._launched = []
        self._kv_held: list[Req] = []  # finished while a launched step still used their KV
        self._step_seq = 0
        self._forward_thread = OverlapWorkerThread(self.worker) if enable else None

    # ------------------------------------------------------------------ releases
    def _in_flight(self, req: Req) -> bool:
        return any(id(req) in b.req_ids for b in self._launched)

    def release_kv(self, req: Req) -> None:
        """The request's KV to the prefix cache and its slots freed, once no launched step uses them."""
        if self._launched and self._in_flight(req):
            self._kv_held.append(req)
        else:
            self.kv.release(req)

    def release_worker_state(self, req: Req) -> None:
        """The worker's per-request state (pending image rows, penalty row): overlapped, on the forward thread
        (the only one that touches that state) after the steps launched so far."""
        if self._forward_thread is None:
            self.worker.release_request(req.rid)
        else:
            rid = req.rid
            self._forward_thread.call_after(lambda: self.worker.release_request(rid))

    def _release_held_kv(self) -> None:
        held, self._kv_held = self._kv_held, []
        for req in held:
            self.release_kv(req)

    # ------------------------------------------------------------------ the loop
    def step_overlap(self) -> bool:
        msgs = self.recv_requests()
        if any(not isinstance(m, _OVERLAP_SAFE) for m in msgs):
            self.resolve_in_flight()
        self.process_input_requests(msgs)
        batch = self.get_next_batch_to_run()
        prev = self._launched[-1] if self._launched else None
        launched = self._launch(batch, prev) if batch is not None else None
        if prev is not None:
            self._apply(prev)
        if launched is not None and batch.mode.is_extend():
            self._apply(launched)
        self._release_held_kv()
        self.report_load()
        self.flush_outputs()
        if not self._launched:  # going idle: the releases queued on the forward thread are done first
            self._forward_thread.barrier()
        return batch is not None or prev is not None

    def resolve_in_flight(self) -> None:
        """Applies every launched step (waiting for it) and makes the releases they held back."""
        while self._launched:
            self._apply(self._launched[0])
        self._release_held_kv()
        if self._forward_thread is not None:
            self._forward_thread.barrier()

    def _launch(self, batch: ScheduleBatch, prev: LaunchedBatch | None) -> LaunchedBatch | None:
        batch.seq = self._step_seq
        self._step_seq += 1
        if prev is not None and not batch.mode.is_extend():
            row_in_prev = {id(r): i for i, r in enumerate(prev.batch.reqs)}
            rows = [(i, row_in_prev[id(r)]) for i, r in enumerate(batch.reqs) if id(r) in row_in_prev]
            if rows:
                batch.future_rows, batch.future_seq = rows, prev.batch.seq
        try:
            launched = self._forward_thread.launch(batch, self.stage_timer.enabled, prev)
        except Exception as e:
            self.batch_failed(batch, e)
            return None
        self._launched.append(launched)
        self.num_overlap_launches = getattr(self, "num_overlap_launches", 0) + 1  # observable in /get_server_info
        return launched

    def batch_failed(self, batch: ScheduleBatch, error: Exception) -> None:
        """A batch's forward (or its preparation) raised: an engine fault ends the process; anything else
        ends the batch's requests with the error and the others go on."""
        if _is_engine_fault(error):
            raise error
        logger.exception("a %s batch of %d request(s) failed", batch.mode.name, len(batch.reqs))
        self._fail_batch(batch, error)

    def _apply(self, launched: LaunchedBatch) -> None:
        """Waits for the step's tokens and applies them; then the next step may sample."""
        try:
            try:
                result = launched.future.result()
            except Exception as e:
                self.batch_failed(launched.batch, e)
                return
            self.process_batch_result(launched.batch, result, launched.launched_at)
        finally:
            self._launched.remove(launched)
            launched.applied.set()


def _is_engine_fault(e: BaseException) -> bool:
    """Failures no request caused and none can survive: a collective with a dead peer rank, a lost
    device. The process exits on these (the server answers 503 and stops)."""
    import torch.distributed as dist

    if isinstance(e, getattr(dist, "DistError", ())) or isinstance(e, (MemoryError, SystemError)):
        return True
    text = str(e)
    return any(s in text for s in ("Connection closed by peer", "Gloo", "NCCL", "CUDA error", "device-side assert"))
