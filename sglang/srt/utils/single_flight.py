"""Single-flight: concurrent calls with one key run the computation once and all get its outcome.

The first caller of a key (the leader) runs it in its own thread; callers arriving while it runs wait on
the leader's future and get the same result object, or the same exception. Only calls in flight are
shared: the key is forgotten the moment the leader finishes, so nothing is cached (memory stays bounded by
the work in flight) and a failed computation is tried again by the next caller, not replayed.

Invariant: a waiter only ever waits on a computation that is already running in another thread (the
leader registers the key and runs it without waiting on anything of this object), so waiting cannot
deadlock a thread pool however few threads it has, as long as the computation does not itself wait on
another key of the same flight.

A result that must not be shared as one object (it owns something each caller must own alone: a shared-
memory segment name) is handed out through `split`: the leader learns how many callers the flight has once
its key is retired (no caller can join after that), asks `split(result, n)` for n parts, and every caller
gets its own part, exactly one each.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")


class _Flight:
    __slots__ = ("future", "seats", "split")

    def __init__(self, split: bool):
        self.future: Future = Future()
        self.seats = 0  # callers that joined the leader
        self.split = split  # the outcome is a list of parts, one per caller (the leader's first)


class SingleFlight:
    def __init__(self):
        self._cond = threading.Condition()
        self._inflight: dict[Hashable, _Flight] = {}
        self.leaders = 0  # computations run (one per key and flight)
        self.joined = 0  # calls that waited on a computation another caller was running

    def run(self, key: Hashable | None, fn: Callable[[], T],
            split: Callable[[T, int], list[T]] | None = None) -> T:
        """`fn()`, shared with every concurrent call of the same `key` (None: never shared). With `split`,
        each caller gets its own part of the result (`split(result, callers)`, called once by the leader);
        concurrent calls of one key must agree on whether they split."""
        if key is None:
            with self._cond:
                self.leaders += 1
            return fn()
        with self._cond:
            flight = self._inflight.get(key)
            if flight is None:
                flight = self._inflight[key] = _Flight(split is not None)
                self.leaders += 1
                seat = 0
            else:
                flight.seats += 1
                seat = flight.seats
                self.joined += 1
                self._cond.notify_all()
        if seat:
            out = flight.future.result()  # the leader's result, or its exception raised here
            return out[seat] if flight.split else out
        try:
            result = fn()
        except BaseException as e:
            self._finish(key)
            flight.future.set_exception(e)
            raise
        callers = self._finish(key) + 1
        if split is None:
            flight.future.set_result(result)
            return result
        try:
            parts = split(result, callers)
        except BaseException as e:
            flight.future.set_exception(e)
            raise
        flight.future.set_result(parts)
        return parts[0]

    def _finish(self, key: Hashable) -> int:
        # Removed before the outcome is published: a caller arriving now starts a new flight rather than
        # joining one whose waiters are already being released. Returns how many joined it.
        with self._cond:
            return self._inflight.pop(key).seats

    def in_flight(self) -> int:
        with self._cond:
            return len(self._inflight)

    def wait_joined(self, n: int, timeout: float | None = None) -> bool:
        """Blocks until at least `n` calls have joined another's computation (tests and benchmarks
        synchronise on this instead of sleeping); False when `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self.joined >= n, timeout)
