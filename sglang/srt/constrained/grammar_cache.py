"""Compiled grammars by key `(kind, text)`, compiled in worker threads, kept in a bounded LRU.

`get(key)` returns a `concurrent.futures.Future`: the same one for every caller of a key while it is
kept, so concurrent requests with one schema compile it once. A failed compile is kept too (its
future holds the error): the same invalid schema is refused again without compiling. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

DEFAULT_CACHE_ENTRIES = 256


class GrammarCache:
    def __init__(self, compile_fn: Callable[[tuple[str, str]], object], max_entries: int = DEFAULT_CACHE_ENTRIES,
                 threads: int = 2, name: str = "sglang-grammar"):
        if max_entries < 1:
            raise ValueError("the grammar cache needs room for at least one entry")
        self._compile = compile_fn
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str]) -> Future:
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return fut
            self.misses += 1
            fut = self._pool.submit(self._compile, key)
            self._entries[key] = fut
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)  # the least recently used; its holders keep their future
            return fut

    def stats(self) -> dict[str, int]:
        """Entries kept, lookups that found one (hits) or started a compile (misses), compiles running."""
        with self._lock:
            compiling = sum(not f.done() for f in self._entries.values())
            return {"entries": len(self._entries), "hits": self.hits, "misses": self.misses, "compiling": compiling}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._entries

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
