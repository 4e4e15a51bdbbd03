"""Single-flight: concurrent calls with one key run the computation once and all get its outcome.

The first caller of a key (the leader) runs it in its own thread; callers arriving while it runs wait on
the leader's future and get the same result object, or the same exception. Only calls in flight are
shared: the key is forgotten the moment the leader finishes, so nothing is cached (memory stays bounded by
the work in flight) and a failed computation is tried again by the next caller, not replayed.

Invariant: a waiter only ever waits on a computation that is already running in another thread (the
leader registers the key and runs it without waiting on anything of this object), so waiting cannot
deadlock a thread pool however few threads it has, as long as the computation does not itself wait on
another key of the same flight.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")


class SingleFlight:
    def __init__(self):
        self._cond = threading.Condition()
        self._inflight: dict[Hashable, Future] = {}
        self.leaders = 0  # computations run (one per key and flight)
        self.joined = 0  # calls that waited on a computation another caller was running

    def run(self, key: Hashable | None, fn: Callable[[], T]) -> T:
        """`fn()`, shared with every concurrent call of the same `key` (None: never shared)."""
        if key is None:
            with self._cond:
                self.leaders += 1
            return fn()
        with self._cond:
            fut = self._inflight.get(key)
            if fut is None:
                fut = self._inflight[key] = Future()
                self.leaders += 1
                leader = True
            else:
                self.joined += 1
                leader = False
                self._cond.notify_all()
        if not leader:
            return fut.result()  # the leader's result, or its exception raised here
        try:
            result = fn()
        except BaseException as e:
            self._finish(key)
            fut.set_exception(e)
            raise
        self._finish(key)
        fut.set_result(result)
        return result

    def _finish(self, key: Hashable) -> None:
        # Removed before the outcome is published: a caller arriving now starts a new flight rather than
        # joining one whose waiters are already being released.
        with self._cond:
            del self._inflight[key]

    def in_flight(self) -> int:
        with self._cond:
            return len(self._inflight)

    def wait_joined(self, n: int, timeout: float | None = None) -> bool:
        """Blocks until at least `n` calls have joined another's computation (tests and benchmarks
        synchronise on this instead of sleeping); False when `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self.joined >= n, timeout)
