"""Runs a client's code (custom logit processors: unpickling, `__init__`, `__call__`) in threads of its own,
so that whatever it does is bounded in time for the caller and never raises into the caller's loop.

- Every exception the client's code raises, BaseException included (SystemExit, KeyboardInterrupt,
  GeneratorExit), is caught in the thread and described there (`str()` of a client's exception is client
  code too); the caller only ever receives an `Outcome`.
- The caller waits at most its bound. A Python thread cannot be stopped, so a call past its bound keeps its
  thread until it returns; the number of threads is fixed, and when every one is held a new call is refused
  at once (`ClientThreadsBusy`) instead of queueing behind calls that may never return.
- A key (the processor's string) that has a call past its bound still running is refused at once
  (`Outcome.overdue`): one processor that hangs holds one thread, not one per request.

What this cannot bound: code that holds the GIL inside one C call, ends the process itself (`os._exit`, a
signal, a crash in an extension), or leaves code behind (threads, finalizers, hooks) that runs elsewhere.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable


class ClientThreadsBusy(Exception):
    """Every thread is held by a call that ran past its bound and has not returned."""

    def __init__(self, name: str, size: int):
        super().__init__(f"all {size} threads that run {name} are held by calls that ran past their time "
                         "limit and have not returned; try again later")


@dataclass(frozen=True)
class Outcome:
    value: Any = None
    error: str | None = None  # what the client's code raised, described in its thread
    timed_out: bool = False  # the caller stopped waiting; the call may still be running
    overdue: bool = False  # not run: an earlier call with the same key is still running past its bound


def describe(e: BaseException) -> str:
    """`Type: message` of an exception the client's code raised. Runs in the client's thread: both the
    message and the type's name may be client code; one that fails is described by what is left."""
    try:
        name = type(e).__name__
        if type(name) is not str:  # exactly str: a subclass's methods would be client code again
            name = "exception"
    except BaseException:
        name = "exception"
    try:
        message = str(e)
        if type(message) is not str:
            message = ""
    except BaseException:
        message = "(its message could not be read)"
    return f"{name}: {message}" if message else name


class _Job:
    __slots__ = ("fn", "key", "done", "value", "error", "abandoned")

    def __init__(self, fn: Callable[[], Any], key: Hashable | None):
        self.fn = fn
        self.key = key
        self.done = threading.Event()
        self.value: Any = None
        self.error: str | None = None
        self.abandoned = False  # the caller gave up waiting (set under the runner's lock)


class ClientThreads:
    """At most `size` daemon threads, started on demand and reused. `run` is safe from any thread."""

    def __init__(self, name: str, size: int):
        self.name = name
        self.size = size
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue] = []  # inboxes of threads waiting for a job
        self._started = 0
        self._overdue: dict[Hashable, int] = {}  # key -> calls past their bound still running

    def run(self, fn: Callable[[], Any], timeout_s: float, key: Hashable | None = None) -> Outcome:
        """`fn()` in one of the threads; waits at most `timeout_s`. Raises ClientThreadsBusy when no thread
        is free. `fn` must catch nothing it should not: whatever it raises becomes `Outcome.error`."""
        with self._lock:
            if key is not None and self._overdue.get(key):
                return Outcome(overdue=True)
            if self._idle:
                inbox = self._idle.pop()
            elif self._started < self.size:
                self._started += 1
                inbox = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(inbox,), daemon=True,
                                 name=f"{self.name}-{self._started}").start()
            else:
                raise ClientThreadsBusy(self.name, self.size)
        job = _Job(fn, key)
        inbox.put(job)
        job.done.wait(timeout_s)
        with self._lock:  # `done` is set under the lock: finished and abandoned cannot both happen
            if not job.done.is_set():
                job.abandoned = True
                if key is not None:
                    self._overdue[key] = self._overdue.get(key, 0) + 1
                return Outcome(timed_out=True)
        return Outcome(value=job.value, error=job.error)

    def busy_threads(self) -> int:
        with self._lock:
            return self._started - len(self._idle)

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            job = inbox.get()
            try:
                job.value = job.fn()
            except BaseException as e:  # the client's code: reported, never raised into this loop
                try:
                    job.error = describe(e)
                except BaseException:
                    job.error = "exception"
            job.fn = None
            with self._lock:
                job.done.set()
                if job.abandoned:
                    job.value = None  # nobody will read it
                    if job.key is not None:
                        left = self._overdue.get(job.key, 0) - 1
                        if left > 0:
                            self._overdue[job.key] = left
                        else:
                            self._overdue.pop(job.key, None)
                self._idle.append(inbox)
            del job
