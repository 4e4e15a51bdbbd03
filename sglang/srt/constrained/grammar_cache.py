"""Compiled grammars by key `(kind, text)`, compiled by `CompileThreads`, kept in an LRU
bounded by entry count and by bytes.

`get(key)` returns a `concurrent.futures.Future`: the same one for every caller of a key while it is
kept, so concurrent requests with one schema compile it once. A failed compile is kept too (its future
holds the error, a time-limit overrun included): the same invalid or too slow grammar is refused again
without compiling. Entries are keyed by the text's SHA-256, not the text (which may be 64 KiB).

Bytes: an entry weighs `size_of(result)` once compiled (the scheduler's: xgrammar's
`CompiledGrammar.memory_size_bytes`, the grammar and its token-mask cache; a result without it: nothing) plus its
key. Least recently used entries go until both bounds hold; a compiled entry larger than the whole budget
is not kept (its callers still get it through their future). Thread-safe.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable

from sglang.srt.constrained.compile_threads import CompileThreads

DEFAULT_CACHE_ENTRIES = 256
DEFAULT_TIMEOUT_S = 30.0
KEY_BYTES = 128  # what one entry's digest key and bookkeeping weigh, roughly


def digest_key(key: tuple[str, str]) -> tuple[str, bytes]:
    kind, text = key
    return kind, hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class GrammarCache:
    def __init__(self, compile_fn: Callable[[tuple[str, str]], object], max_entries: int = DEFAULT_CACHE_ENTRIES,
                 threads: int = 2, name: str = "sglang-grammar", max_bytes: int | None = None,
                 size_of: Callable[[object], int] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 prepare: Callable[[], object] | None = None):
        if max_entries < 1:
            raise ValueError("the grammar cache needs room for at least one entry")
        self._compile = compile_fn
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size_of = size_of or (lambda result: 0)
        self._entries: OrderedDict[tuple[str, bytes], Future] = OrderedDict()
        self._sizes: dict[tuple[str, bytes], int] = {}
        self.bytes = 0
        self._lock = threading.Lock()
        self.threads = CompileThreads(threads, timeout_s, name, prepare=prepare)
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, str]) -> Future:
        dkey = digest_key(key)
        with self._lock:
            fut = self._entries.get(dkey)
            if fut is not None:
                self._entries.move_to_end(dkey)
                self.hits += 1
                return fut
            self.misses += 1
            fut = self.threads.submit(self._compile_key, key, what=key[0])
            self._entries[dkey] = fut
            self._sizes[dkey] = KEY_BYTES
            self.bytes += KEY_BYTES
            self._evict_locked(keep=dkey)
            return fut

    def _compile_key(self, key):
        """In the compile thread: compiles, then weighs the entry before its future resolves, so a caller
        that sees the result also sees the cache within its budget."""
        result = self._compile(key)  # read at call time: tests swap `_compile`
        try:
            size = KEY_BYTES + int(self._size_of(result))
        except Exception:  # a size we cannot read counts as the key only
            size = KEY_BYTES
        dkey = digest_key(key)
        with self._lock:
            fut = self._entries.get(dkey)
            if fut is None or fut.done():
                return result  # evicted meanwhile, or past the time limit (this result is dropped)
            self.bytes += size - self._sizes[dkey]
            self._sizes[dkey] = size
            if self.max_bytes is not None and size > self.max_bytes:
                self._drop_locked(dkey)  # larger than the whole budget: its callers hold it, the cache not
            self._evict_locked(keep=None)
        return result

    def _drop_locked(self, dkey) -> None:
        del self._entries[dkey]
        self.bytes -= self._sizes.pop(dkey)

    def _evict_locked(self, keep) -> None:
        """Least recently used first (holders keep their future), never the entry just added."""
        while self._entries and (len(self._entries) > self.max_entries
                                 or (self.max_bytes is not None and self.bytes > self.max_bytes)):
            oldest = next(iter(self._entries))
            if oldest == keep:
                break
            self._drop_locked(oldest)

    def stats(self) -> dict[str, int]:
        """Entries kept and their bytes, lookups that found one (hits) or started a compile (misses),
        compiles running, queued, and still running past the time limit."""
        with self._lock:
            out = {"entries": len(self._entries), "bytes": self.bytes, "hits": self.hits, "misses": self.misses}
        return {**out, **self.threads.stats()}

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key) -> bool:
        with self._lock:
            return digest_key(key) in self._entries

    def close(self) -> None:
        self.threads.close()
