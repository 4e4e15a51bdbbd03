"""The overlap scheduler's worker side (upstream: `TpModelWorkerClient`): one thread runs the model
for the batches the scheduler launches, strictly in launch order, so the scheduler can build and
launch step N+1 while step N still runs on the device.

Ordering invariants the scheduler relies on:
- batches run one at a time, in launch order (a batch's KV slots, freed or reused by a later batch,
  are never touched by two forwards at once);
- a batch whose sampling reads request state (grammars, penalties, bans, step counts of sampled rows)
  samples only after the scheduler applied the previous batch's tokens (`LaunchedBatch.applied` of that
  batch), so it reads the same state as without overlap; an all-greedy plain batch does not wait;
- the worker's own per-request state (embedder rows, penalty rows) is changed only on this thread:
  releases are queued here (`call_after`) and run after every batch launched before them;
- every collective this thread issues is on the TP group; the scheduler thread's object broadcasts use
  a gloo group of their own, so the two threads never interleave calls on one communicator."""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from sglang.srt.managers.schedule_batch import ScheduleBatch

logger = logging.getLogger(__name__)


@dataclass
class LaunchedBatch:
    batch: ScheduleBatch
    future: Future
    launched_at: float
    # set once the scheduler applied this batch's tokens; the next batch samples only after that
    applied: threading.Event = field(default_factory=threading.Event)
    req_ids: frozenset[int] = frozenset()  # id() of the batch's requests


def samples_from_applied_state(batch: ScheduleBatch) -> bool:
    """Whether sampling this batch reads what applying the previous step changes: grammar matchers, penalty
    counts, `min_new_tokens` bans, a client's logit processor, or (sampled rows) the step count that seeds a
    row's noise. An all-greedy batch without those samples from its logits alone: it need not wait, so the
    scheduler's applying of the previous step overlaps this step's sampling too."""
    for r in batch.reqs:
        p = r.sampling_params
        if (not p.is_greedy or r.grammar is not None or p.has_penalty or p.min_new_tokens > 0
                or r.custom_logit_processor is not None):
            return True
    return False


class OverlapWorkerThread:
    """The forward thread holds only a weak reference to the worker and stops once this object is
    collected, so a scheduler that goes away (tests, benchmarks) takes its model and KV pool with it."""

    def __init__(self, worker):
        self.worker = worker
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=_forward_loop, name="sglang-forward", daemon=True,
                                        args=(self._queue, weakref.ref(worker), worker.model_runner.device))
        self._thread.start()
        weakref.finalize(self, self._queue.put, _STOP)

    def launch(self, batch: ScheduleBatch, stage_timer_on: bool, after: LaunchedBatch | None) -> LaunchedBatch:
        """Queues the batch. Its forward inputs are read from the requests here, on the caller's thread;
        it samples once `after` (the batch launched before it, if still unapplied) is applied."""
        fb = self.worker.prepare(batch, stage_timer_on)
        launched = LaunchedBatch(batch, Future(), time.perf_counter(), req_ids=frozenset(map(id, batch.reqs)))
        wait = after.applied.wait if after is not None and samples_from_applied_state(batch) else None
        self._queue.put((launched, fb, stage_timer_on, wait))
        return launched

    def call_after(self, fn) -> None:
        """Runs `fn()` on the forward thread once the batches launched so far have run."""
        self._queue.put(fn)

    def barrier(self) -> None:
        """Returns once everything queued so far has run (the worker's state is then settled)."""
        done = threading.Event()
        self._queue.put(done.set)
        done.wait()

    def is_alive(self) -> bool:
        return self._thread.is_alive()


_STOP = object()


def _forward_loop(items: queue.SimpleQueue, worker_ref, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    while True:
        item = items.get()
        if item is _STOP:
            return
        if callable(item):
            try:
                item()
            except Exception:  # a release that failed leaks at most that request's rows; the loop goes on
                logger.exception("deferred worker call failed")
            continue
        launched, fb, stage_timer_on, wait = item
        worker = worker_ref()
        if worker is None or not launched.future.set_running_or_notify_cancel():
            continue
        try:
            result = worker.forward_batch_generation(launched.batch, stage_timer_on, fb, wait)
        except BaseException as e:  # handed to the scheduler, which fails the batch or exits
            launched.future.set_exception(e)
        else:
            launched.future.set_result(result)
        del worker, item, launched, fb
