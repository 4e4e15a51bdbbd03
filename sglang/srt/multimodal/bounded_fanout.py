"""A request's per-item media work (decode, preprocess, hash) run on a shared pool, at most K items at a time.

Why. The media pool is one FIFO queue shared by every request. Submitting all of a 64-image request's jobs
at once puts 64 jobs ahead of anything that arrives next (a 2-image request waits for all 64), lets every
pool thread decode one of its images at the same time (peak memory: pool size x one image's decode and
preprocess buffers, per huge request), and leaves a 1-image request (run on its own request thread) one
CPU share among all of them.

What. `run_bounded` keeps at most `limit` of one request's jobs submitted (queued or running) and submits
the next only when one of them ends. Invariants:

- **Bound.** At no moment are more than `limit` jobs of one call submitted and not yet finished; so at most
  `limit` of the request's items are decoded / preprocessed at a time, whatever the pool size.
- **Fair interleaving.** A job submitted by another request after this call started waits in the pool's
  queue behind at most `limit` jobs of this call (not behind all its remaining ones): requests interleave
  in the FIFO pool in windows of `limit`.
- **Same outputs.** Results come back in job order, the same list `executor.map` gives; the jobs and the
  function are the same, only when each job is submitted changes.
- **Failure.** The error of the first failing job in job order is raised (as `executor.map` raises it)
  once a failure is seen and the jobs before that one have ended; jobs not yet submitted never run; the results
  of jobs that finished (or finish later) are handed to `release` (e.g. their shared-memory segments
  unlinked), so a failed request leaves nothing behind.

`limit` 0 (or None) is the unbounded path: every job submitted at once, as before (the switch for bisecting).
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from typing import Callable, Sequence, TypeVar

J = TypeVar("J")
R = TypeVar("R")


def run_bounded(executor: Executor, fn: Callable[[J], R], jobs: Sequence[J], limit: int | None,
                release: Callable[[list[R]], None] = lambda results: None) -> list[R]:
    """`[fn(job) for job in jobs]`, run on `executor` with at most `limit` jobs submitted at a time (None or
    0: all at once). On the first failure: raised; unsubmitted jobs dropped; finished results `release`d."""
    n = len(jobs)
    window = n if not limit or limit >= n else int(limit)
    futures: list[Future | None] = [None] * n
    pending: set[Future] = set()
    nxt = 0
    try:
        while nxt < n or pending:
            while nxt < n and len(pending) < window:
                fut = futures[nxt] = executor.submit(fn, jobs[nxt])
                pending.add(fut)
                nxt += 1
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            if any(f.exception() is not None for f in done):
                raise _first_error(futures)
    except BaseException:
        _release_all(futures, release)
        raise
    return [f.result() for f in futures]


def resolve_in_flight(asked: int | None, slots: int) -> int:
    """K per request: `asked` (--mm-max-in-flight-per-request; 0: no bound), else half of the `slots` that
    preprocess images (worker processes x their threads, else the media pool's threads), at least 2: one
    huge request keeps half the slots busy and the other half stay free for the requests arriving behind it.
    Peak transient memory of one request is then K x (one image decoded + resized + patchified)."""
    if asked is not None:
        return int(asked)
    return max(2, slots // 2)


def _first_error(futures: list[Future | None]) -> BaseException:
    """The error of the first failed job in job order, as `executor.map` would raise it: the jobs before
    it are waited for (they were all submitted before it), the ones after it are not."""
    for fut in futures:
        if fut is None:
            break
        if fut.exception() is not None:  # waits for a job still running
            return fut.exception()
    raise AssertionError("a failed job was seen but none is found")  # unreachable: the caller saw one


def _release_all(futures: list[Future | None], release: Callable[[list], None]) -> None:
    """Releases every result of a failed call: those already there now, the others when their job ends
    (a job still queued is cancelled and never runs)."""
    ready = []
    for fut in futures:
        if fut is None:
            continue
        if fut.done():
            if not fut.cancelled() and fut.exception() is None:
                ready.append(fut.result())
        elif not fut.cancel():
            fut.add_done_callback(lambda f: release([f.result()]) if f.exception() is None else None)
    release(ready)


__all__ = ["resolve_in_flight", "run_bounded"]
