"""Where grammars compile: one thread per compile, at most `places` compiles at a time, each within a time
limit counted from its own start (not from when it was queued).

A compile in xgrammar's C++ cannot be interrupted. One that runs past the limit fails its future at
once (`GrammarCompileTimeout`: the caller answers 400 naming the limit) and gives its place to the next
compile; its thread runs on to the end, then drops the result and exits. So compiles that overran never
hold a place: a small grammar queued behind slow ones starts as soon as they reach the limit, or at once
when a place is free. At most `max_overrunning` overrun threads run at a time (each is CPU and memory,
bounded by the grammar size cap); while that many run, new compiles wait for one of them to end.
Threads are daemons: an interpreter exiting does not wait for an overrun compile.

After each compile the thread hands freed heap pages back to the system (glibc's malloc_trim): a large
compile's temporaries, and grammars the cache dropped, live in per-thread malloc arenas that glibc
would otherwise keep resident (8 distinct 400 KB regexes left the scheduler 266 MiB larger with a cache
holding 75 MiB; see docs/reliability.md).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

from sglang.srt.constrained.xgrammar_backend import GrammarCompileError


class GrammarCompileTimeout(GrammarCompileError):
    pass


def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent elsewhere (musl, macOS): nothing to do
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    if _TRIM is not None:
        _TRIM(0)


class _Job:
    __slots__ = ("fn", "arg", "what", "future", "finished", "overran")

    def __init__(self, fn, arg, what: str):
        self.fn, self.arg, self.what = fn, arg, what
        self.future: Future = Future()
        self.finished = self.overran = False  # exactly one becomes True, under the lock


class CompileThreads:
    def __init__(self, places: int, timeout_s: float, name: str = "sglang-grammar",
                 prepare: Callable[[], Any] | None = None, max_overrunning: int = 16):
        if places < 1:
            raise ValueError("compiles need at least one place")
        self.places, self.timeout_s, self.name = places, float(timeout_s), name
        self.max_overrunning = max_overrunning
        self._prepare = prepare  # run in the compile thread before its clock starts (xgrammar's vocabulary view)
        self._lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._running = 0  # compiles holding a place
        self.overrunning = 0  # threads still compiling past the limit (no place held)
        self.overruns = 0  # compiles that ran past the limit, ever
        self._closed = False
        self._ids = itertools.count()

    def submit(self, fn: Callable[[Any], Any], arg: Any, what: str = "grammar") -> Future:
        """`fn(arg)` in a compile thread; the future fails with GrammarCompileTimeout past the limit."""
        job = _Job(fn, arg, what)
        with self._lock:
            if self._closed:
                raise RuntimeError("the grammar compile threads are closed")
            self._queue.append(job)
            self._start_locked()
        return job.future

    def _start_locked(self) -> None:
        while self._queue and self._running < self.places and self.overrunning < self.max_overrunning:
            job = self._queue.popleft()
            if not job.future.set_running_or_notify_cancel():
                continue
            self._running += 1
            threading.Thread(target=self._run, args=(job,), daemon=True, name=f"{self.name}-{next(self._ids)}").start()

    def _run(self, job: _Job) -> None:
        result = error = None
        timer = None
        try:
            if self._prepare is not None:
                self._prepare()
            timer = threading.Timer(self.timeout_s, self._overrun, (job,))
            timer.daemon = True
            timer.start()
            result = job.fn(job.arg)
        except BaseException as e:  # every failure reaches the future: the caller maps it to an answer
            error = e
        if timer is not None:
            timer.cancel()
        with self._lock:
            if job.overran:
                self.overrunning -= 1  # the future already failed; this result is dropped
            else:
                job.finished = True
                self._running -= 1
            self._start_locked()
        if not job.overran:
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)
        del result, error, job  # this thread's references go before the trim
        release_free_memory()

    def _overrun(self, job: _Job) -> None:
        with self._lock:
            if job.finished:
                return
            job.overran = True
            self._running -= 1
            self.overrunning += 1
            self.overruns += 1
            self._start_locked()
        job.future.set_exception(GrammarCompileTimeout(
            f"the {job.what} did not compile within {self.timeout_s:g} s (SGLANG_GRAMMAR_COMPILE_TIMEOUT_S); "
            "simplify it"))

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"compiling": self._running, "queued": len(self._queue), "overrunning": self.overrunning,
                    "overruns": self.overruns}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            queued, self._queue = list(self._queue), deque()
        for job in queued:
            job.future.cancel()
