"""Receiver side of the feature pool: opening its export, and the per-process cache of opened pools.

Opening a CUDA IPC handle (`cudaIpcOpenMemHandle`, plus torch's reference-counter file) costs far more
than reading a slice; the pool is one allocation for the server's lifetime, so a rank opens it once
and keeps it (`SGLANG_USE_IPC_POOL_HANDLE_CACHE`, default on). An entry is stale when the pool id comes
back with another export (the tokenizer made a new pool): it is closed and reopened. A read that fails
on a cached entry invalidates it and is retried once on a fresh open; a second failure propagates.
With the switch off every read opens the pool and closes it afterwards (the baseline).

The cache logic takes any `opener(desc) -> OpenedPool`; tests use a fake one on CPU.
"""

from __future__ import annotations

import mmap
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from sglang.srt.multimodal.transport.cuda_ipc_pool import PoolDesc
from sglang.srt.multimodal.transport.shm import SHM_DIR


@dataclass
class OpenedPool:
    """One open of a pool export: `base` is a 1-D uint8 tensor over the whole pool."""

    base: torch.Tensor
    _keep: Any = None  # what must live as long as `base` (the storage, the mapping)
    _close: Callable[[], None] | None = None

    def close(self) -> None:
        self.base = None
        self._keep = None
        if self._close is not None:
            self._close()
            self._close = None


def _open_host(desc: PoolDesc) -> OpenedPool:
    fd = os.open(os.path.join(SHM_DIR, desc.handle[0]), os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, max(1, desc.nbytes), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    with warnings.catch_warnings():  # read-only on purpose: receivers never write the pool
        warnings.simplefilter("ignore", UserWarning)
        base = torch.frombuffer(mm, dtype=torch.uint8, count=desc.nbytes) if desc.nbytes else torch.empty(0, dtype=torch.uint8)

    def close():
        try:
            mm.close()
        except BufferError:  # a tensor made from `base` is still alive: the mapping goes with it
            pass

    return OpenedPool(base, mm, close)


def _open_cuda(desc: PoolDesc) -> OpenedPool:
    device, handle, size, offset, ref_counter, ref_offset, event_handle, _event_sync = desc.handle
    # The sender waits for its copies before sending a pointer, so no IPC event is needed here.
    storage = torch.UntypedStorage._new_shared_cuda(
        device, handle, size, offset, ref_counter, ref_offset, event_handle, False)
    base = torch.empty(0, dtype=torch.uint8, device=torch.device("cuda", device)).set_(storage, 0, (desc.nbytes,), (1,))
    return OpenedPool(base, storage, None)  # dropping the storage closes the handle (torch's IPC deleter)


def open_pool(desc: PoolDesc) -> OpenedPool:
    if desc.kind == "host":
        return _open_host(desc)
    if desc.kind == "cuda":
        return _open_cuda(desc)
    raise ValueError(f"unknown pool kind {desc.kind!r}")


@dataclass
class HandleCacheStats:
    hits: int = 0
    misses: int = 0
    opens: int = 0
    closes: int = 0
    invalidations: int = 0
    retries: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f"mm_ipc_handle_{k}": v for k, v in self.__dict__.items()}


@dataclass
class _Entry:
    desc: PoolDesc
    opened: OpenedPool
    uses: int = field(default=0)


RETRYABLE = (RuntimeError, OSError, ValueError)


class IpcHandleCache:
    """Opened pools of this process by pool id. `read(desc, fn)` runs `fn(base)` on the pool's base."""

    def __init__(self, opener: Callable[[PoolDesc], OpenedPool] = open_pool, enabled: bool = True):
        self.opener = opener
        self.enabled = enabled
        self.stats = HandleCacheStats()
        self._entries: dict[str, _Entry] = {}
        self.before_close: Callable[[], Any] | None = None  # the owner's hook: finish reads in flight

    def _open(self, desc: PoolDesc) -> OpenedPool:
        opened = self.opener(desc)
        self.stats.opens += 1
        return opened

    def _close(self, opened: OpenedPool) -> None:
        if self.before_close is not None:
            self.before_close()
        opened.close()
        self.stats.closes += 1

    def read(self, desc: PoolDesc, fn: Callable[[torch.Tensor], Any],
             done: Callable[[Any], Any] | None = None) -> Any:
        """`fn(base)`; without the cache, `done(result)` must finish the reads (wait for an
        asynchronous copy) before the pool is closed again."""
        if not self.enabled:  # baseline: one open and one close per read
            opened = self._open(desc)
            try:
                result = fn(opened.base)
                if done is not None:
                    done(result)
                return result
            finally:
                self._close(opened)
        entry = self._entries.get(desc.pool_id)
        if entry is not None and entry.desc != desc:  # the id came back with another export
            self.invalidate(desc.pool_id)
            entry = None
        if entry is None:
            self.stats.misses += 1
            entry = self._entries[desc.pool_id] = _Entry(desc, self._open(desc))
            try:
                return fn(entry.opened.base)
            except RETRYABLE:
                self.invalidate(desc.pool_id)  # a fresh open that fails to read is not retried
                raise
        self.stats.hits += 1
        try:
            return fn(entry.opened.base)
        except RETRYABLE:
            self.invalidate(desc.pool_id)
            self.stats.retries += 1
            entry = self._entries[desc.pool_id] = _Entry(desc, self._open(desc))
            try:
                return fn(entry.opened.base)
            except RETRYABLE:
                self.invalidate(desc.pool_id)
                raise

    def invalidate(self, pool_id: str) -> bool:
        entry = self._entries.pop(pool_id, None)
        if entry is None:
            return False
        self.stats.invalidations += 1
        self._close(entry.opened)
        return True

    def close_all(self) -> int:
        n = len(self._entries)
        for pool_id in list(self._entries):
            entry = self._entries.pop(pool_id)
            self._close(entry.opened)
        return n

    def __len__(self) -> int:
        return len(self._entries)
