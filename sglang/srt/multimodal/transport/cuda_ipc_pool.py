"""The multimodal feature pool of `--mm-feature-transport cuda_ipc`: one device allocation made once by
the tokenizer process, carved into slices by `SliceAllocator`, and a release board through which the
TP ranks hand slices back without any message.

- Memory: `SGLANG_MM_FEATURE_CACHE_MB` (default 4096) bytes on the tokenizer process's CUDA device,
  exported once with torch's CUDA IPC (`UntypedStorage._share_cuda_`). `HostPoolMemory` is a stand-in
  backed by a `/dev/shm` segment with the same interface: the whole protocol runs on CPU in tests
  and benchmarks, across real processes.
- Release board: a small shared host array (a `/dev/shm` segment) of `gen[slot]` (the generation of the
  slice now in that slot, 0 when free) and `done[slot, rank]`. A rank that has copied a slice out
  writes that slice's generation into its own cell; nobody else writes it, so no lock or atomic is
  needed. The owner frees a slot whose every rank cell equals its generation (`reclaim`, one
  vectorized numpy comparison, run when an allocation needs room). Generations are never reused
  (32-bit, wrapping past 0), so a late or stale stamp can never free a newer slice.
- A slice never sent (the request failed before reaching the scheduler) is freed by `discard`.
  `close` returns everything at shutdown, including the slices of a dead rank.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np
import torch

from sglang.srt.multimodal.transport.shm import SHM_DIR, unlink_segments
from sglang.srt.multimodal.transport.slice_allocator import SliceAllocator

DEFAULT_MAX_SLOTS = 8192  # slices outstanding at once (one per image in flight)
DEFAULT_ALIGNMENT = 512


@dataclass(frozen=True)
class PoolDesc:
    """What a receiver needs to open a pool: small, picklable, equal only for the same export."""

    pool_id: str
    kind: str  # "cuda" (torch CUDA IPC) or "host" (a /dev/shm segment: the CPU stand-in)
    handle: tuple  # cuda: the `_share_cuda_()` tuple; host: (segment name,)
    nbytes: int
    board: str  # release board segment name
    max_slots: int
    num_ranks: int


@dataclass(frozen=True)
class Slice:
    slot: int
    offset: int
    nbytes: int
    generation: int


class ReleaseBoard:
    """`gen` (max_slots,) and `done` (max_slots, num_ranks), uint32, in one shared-memory segment."""

    def __init__(self, name: str, max_slots: int, num_ranks: int, create: bool):
        self.name = name
        size = 4 * max_slots * (1 + num_ranks)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(os.path.join(SHM_DIR, name), flags, 0o600)
        try:
            if create:
                os.posix_fallocate(fd, 0, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        arr = np.frombuffer(self._mm, dtype=np.uint32)
        self.gen = arr[:max_slots]
        self.done = arr[max_slots:].reshape(max_slots, num_ranks)

    @classmethod
    def create(cls, name: str, max_slots: int, num_ranks: int) -> "ReleaseBoard":
        return cls(name, max_slots, num_ranks, create=True)

    @classmethod
    def attach(cls, desc: PoolDesc) -> "ReleaseBoard":
        return cls(desc.board, desc.max_slots, desc.num_ranks, create=False)

    def stamp(self, slot: int, rank: int, generation: int) -> None:
        self.done[slot, rank] = generation

    def close(self, unlink: bool = False) -> None:
        self.gen = self.done = None  # drop the exported views so the mapping can close
        try:
            self._mm.close()
        except BufferError:  # a view is still referenced somewhere: the mapping goes with it
            pass
        if unlink:
            unlink_segments([self.name])


class HostPoolMemory:
    """The CPU stand-in for device memory: a /dev/shm segment, opened by name."""

    kind = "host"

    def __init__(self, nbytes: int, name: str):
        self.name = name
        fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(1, nbytes))
            self._mm = mmap.mmap(fd, max(1, nbytes))
        finally:
            os.close(fd)
        self.buffer = torch.frombuffer(self._mm, dtype=torch.uint8, count=nbytes) if nbytes else torch.empty(0, dtype=torch.uint8)
        self.handle = (name,)

    def close(self) -> None:
        self.buffer = None
        try:
            self._mm.close()
        except BufferError:
            pass
        unlink_segments([self.name])


class CudaPoolMemory:
    """One allocation on a CUDA device, exported once for CUDA IPC."""

    kind = "cuda"

    def __init__(self, nbytes: int, device: torch.device | str | int | None = None):
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        share = self.buffer.untyped_storage()._share_cuda_()
        # (device, handle, size, offset, ref counter handle, ref counter offset, event handle, event sync)
        self.handle = tuple(share)

    def close(self) -> None:
        self.buffer = None
        torch.cuda.ipc_collect()


class PoolFullError(RuntimeError):
    """No slice of this size could be had within the wait: the caller sends this item another way."""


class CudaIpcPool:
    """Owner side (the tokenizer process). Thread-safe: the request builder's worker threads share it."""

    def __init__(self, nbytes: int, num_ranks: int, prefix: str, kind: str = "cuda", device=None,
                 max_slots: int = DEFAULT_MAX_SLOTS, alignment: int = DEFAULT_ALIGNMENT):
        self.pool_id = uuid.uuid4().hex[:12]
        self.num_ranks = num_ranks
        if kind == "cuda":
            self.memory = CudaPoolMemory(nbytes, device)
        elif kind == "host":
            self.memory = HostPoolMemory(nbytes, f"{prefix}ipcpool_{self.pool_id}")
        else:
            raise ValueError(f"unknown pool kind {kind!r}")
        self.allocator = SliceAllocator(nbytes, alignment)
        try:
            self.board = ReleaseBoard.create(f"{prefix}ipcboard_{self.pool_id}", max_slots, num_ranks)
        except BaseException:
            self.memory.close()
            raise
        self.desc = PoolDesc(self.pool_id, kind, self.memory.handle, nbytes, self.board.name, max_slots, num_ranks)
        self._free_slots = list(range(max_slots - 1, -1, -1))  # a stack: low slots first
        self._outstanding: dict[int, tuple[int, int]] = {}  # slot -> (offset, generation)
        self._gen = 0
        self._lock = threading.Lock()
        self.capacity = self.allocator.capacity
        self.num_allocs = self.num_reclaimed = self.num_discarded = 0
        self.closed = False

    # ------------------------------------------------------------------ allocation
    def try_alloc(self, nbytes: int) -> Slice | None:
        with self._lock:
            if self.closed:
                return None
            s = self._alloc_locked(nbytes)
            if s is None and self._reclaim_locked():
                s = self._alloc_locked(nbytes)
            return s

    def alloc(self, nbytes: int, wait_s: float = 0.0) -> Slice | None:
        """A slice, waiting up to `wait_s` for the ranks to hand slices back; None if none came."""
        s = self.try_alloc(nbytes)
        if s is not None or wait_s <= 0 or self.allocator.round_up(nbytes) > self.capacity:
            return s
        deadline = time.monotonic() + wait_s
        while s is None and time.monotonic() < deadline:
            time.sleep(0.0005)
            s = self.try_alloc(nbytes)
        return s

    def _alloc_locked(self, nbytes: int) -> Slice | None:
        if not self._free_slots:
            return None
        off = self.allocator.alloc(nbytes)
        if off is None:
            return None
        slot = self._free_slots.pop()
        self._gen = self._gen % 0xFFFFFFFF + 1  # never 0 (0 marks a free slot)
        self.board.done[slot, :] = 0
        self.board.gen[slot] = self._gen
        self._outstanding[slot] = (off, self._gen)
        self.num_allocs += 1
        return Slice(slot, off, nbytes, self._gen)

    def view(self, s: Slice) -> torch.Tensor:
        return self.memory.buffer[s.offset:s.offset + s.nbytes]

    # ------------------------------------------------------------------ release
    def reclaim(self) -> int:
        """Frees every slice all ranks have stamped as consumed; returns how many."""
        with self._lock:
            return self._reclaim_locked()

    def _reclaim_locked(self) -> int:
        if not self._outstanding:
            return 0
        slots = np.fromiter(self._outstanding, dtype=np.int64, count=len(self._outstanding))
        gens = self.board.gen[slots]
        consumed = slots[(self.board.done[slots] == gens[:, None]).all(axis=1)]
        for slot in consumed.tolist():
            self._free_locked(slot)
        self.num_reclaimed += len(consumed)
        return len(consumed)

    def discard(self, slot: int, generation: int) -> bool:
        """Frees a slice no rank will ever read (its request never reached the scheduler). Idempotent:
        a slice already freed, or whose slot holds a newer generation, is left alone."""
        with self._lock:
            if self._outstanding.get(slot, (None, None))[1] != generation:
                return False
            self._free_locked(slot)
            self.num_discarded += 1
            return True

    def _free_locked(self, slot: int) -> None:
        off, _ = self._outstanding.pop(slot)
        self.allocator.free(off)
        self.board.gen[slot] = 0
        self._free_slots.append(slot)

    @property
    def free_bytes(self) -> int:
        return self.allocator.free_bytes

    @property
    def num_outstanding(self) -> int:
        return len(self._outstanding)

    def stats(self) -> dict:
        if not self.closed:
            self.reclaim()  # what the ranks have handed back since the last allocation
        return {"cuda_ipc_pool_bytes": self.capacity, "cuda_ipc_pool_free_bytes": self.free_bytes,
                "cuda_ipc_outstanding_slices": self.num_outstanding}

    def close(self) -> int:
        """Shutdown: every slice returns (a dead rank's included), the memory and the board go.
        Returns how many slices were still outstanding."""
        with self._lock:
            if self.closed:
                return 0
            self.closed = True
            n = len(self._outstanding)
            for slot in list(self._outstanding):
                self._free_locked(slot)
            self.board.close(unlink=True)
            self.memory.close()
            return n
