"""`--mm-feature-transport cuda_ipc`: pixel data in the tokenizer's device pool, requests carry pointers.

Sender (tokenizer process, request builder worker threads): each item's pixels are copied into a
slice of the pool (through a pinned staging buffer, one asynchronous copy on a side stream, waited
for before the request is sent) and the tensor is replaced by a `CudaIpcPointerMMData`, which pickles
to metadata only. When the pool has no room within a short wait, that item goes through shared
memory instead (a `ShmPointerMMData`, as with `--mm-feature-transport cpu`), counted and logged.

The lifecycle mirrors the shm transport (`transport/shm.py`): pointers are materialized by every rank
after the TP broadcast, each rank releases what it read (the pool's release board), and whatever
never reaches a scheduler is released where it fails (`release_unsent`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch

from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool, PoolDesc, Slice
from sglang.srt.multimodal.transport.shm import (
    ShmSpaceError,
    cleanup_own_segments,
    swap_tensor_features,
    unlink_segments,
    write_segment,
)

logger = logging.getLogger(__name__)

TOKEN_PREFIX = "cudaipc:"  # unsent-slice tokens share the unsent list with shm segment names
POOL_FULL_WAIT_S = 0.05  # how long an item waits for the ranks to hand slices back before falling back
STAGING_MAX_BYTES = 64 << 20  # larger items are copied straight from pageable memory


@dataclass
class CudaIpcPointerMMData:
    """Where an item's pixels live in a pool: the pool (id and export), slot, byte offset and size,
    tensor shape and dtype, and the slice's generation (never reused: a check against the pool's
    release board tells a live slice from a freed one)."""

    pool: PoolDesc
    slot: int
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    generation: int

    def __getstate__(self):
        return {"pool": self.pool, "slot": self.slot, "offset": self.offset, "nbytes": self.nbytes,
                "shape": self.shape, "dtype": self.dtype, "generation": self.generation}

    def __setstate__(self, state):
        self.__dict__.update(state)

    @property
    def token(self) -> str:
        return f"{TOKEN_PREFIX}{self.pool.pool_id}:{self.slot}:{self.generation}"


# pools of this process by id, for `release_unsent` (the tokenizer manager holds names, not pools)
_LIVE_POOLS: dict[str, CudaIpcPool] = {}


def release_unsent(names) -> int:
    """Releases what a request that never reached a scheduler holds: shm segment names are unlinked,
    pool slices (tokens) go back to their pool. Idempotent."""
    names = list(names)
    segs = [n for n in names if not n.startswith(TOKEN_PREFIX)]
    n = unlink_segments(segs) if segs else 0
    for tok in names:
        if tok.startswith(TOKEN_PREFIX):
            pool_id, slot, gen = tok[len(TOKEN_PREFIX):].split(":")
            pool = _LIVE_POOLS.get(pool_id)
            if pool is not None and pool.discard(int(slot), int(gen)):
                n += 1
    return n


class _Staging(threading.local):
    buf: torch.Tensor | None = None
    stream = None


class CudaIpcSender:
    """Tokenizer side of the transport: owns the pool, copies items in, falls back when it is full."""

    def __init__(self, pool: CudaIpcPool, shm_prefix: str | None, wait_s: float = POOL_FULL_WAIT_S):
        self.pool = pool
        self.shm_prefix = shm_prefix  # fallback path; None: a full pool sends the item inline
        self.wait_s = wait_s
        self.fallback_count = 0  # items sent another way because the pool was full
        self._lock = threading.Lock()
        self._staging = _Staging()
        _LIVE_POOLS[pool.pool_id] = pool

    # ------------------------------------------------------------------ copy in
    def _copy_in(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """src (CPU, contiguous) -> dst (a uint8 slice of the pool); complete on return."""
        src_bytes = src.reshape(-1).view(torch.uint8)
        if dst.device.type != "cuda":
            dst.copy_(src_bytes)
            return
        st = self._staging
        if st.stream is None:
            st.stream = torch.cuda.Stream(device=dst.device)
        n = src_bytes.numel()
        with torch.cuda.stream(st.stream):
            if src.is_pinned() or n > STAGING_MAX_BYTES:
                dst.copy_(src_bytes, non_blocking=src.is_pinned())
            else:
                if st.buf is None or st.buf.numel() < n:
                    st.buf = torch.empty(max(n, 1 << 20), dtype=torch.uint8, pin_memory=True)
                st.buf[:n].copy_(src_bytes)
                dst.copy_(st.buf[:n], non_blocking=True)
        st.stream.synchronize()  # the bytes are in the pool before any rank can see the pointer

    def to_pool(self, tensor: torch.Tensor) -> CudaIpcPointerMMData | None:
        """The pointer of a new slice holding `tensor`, or None when the pool has no room in time."""
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        s: Slice | None = self.pool.alloc(nbytes, self.wait_s)
        if s is None:
            return None
        try:
            if nbytes:
                self._copy_in(self.pool.view(s), t)
        except BaseException:
            self.pool.discard(s.slot, s.generation)
            raise
        return CudaIpcPointerMMData(self.pool.desc, s.slot, s.offset, nbytes, tuple(t.shape),
                                    str(t.dtype).removeprefix("torch."), s.generation)

    def items_to_pool(self, mm_inputs, rid: str = "") -> list[str]:
        """Moves every tensor feature of a request into the pool (or, for an item that finds no room,
        into shared memory; if that is full too, it stays inline). Returns the names the caller must
        release if the request never reaches a scheduler (`release_unsent`). All or nothing on error."""
        def to_pointer(tensor: torch.Tensor):
            ptr = self.to_pool(tensor)
            if ptr is not None:
                return ptr, ptr.token
            ptr = self._fallback(tensor, rid)
            return None if ptr is None else (ptr, ptr.name)

        return swap_tensor_features(mm_inputs, to_pointer, release_unsent)

    def _fallback(self, tensor: torch.Tensor, rid: str):
        with self._lock:
            self.fallback_count += 1
            n = self.fallback_count
        if n == 1 or n % 100 == 0:  # a full pool stays full for a while: do not flood the log
            logger.warning("cuda_ipc feature pool is full (%d of %d MiB free); an item of request %s goes "
                           "through %s (%d item(s) so far; raise SGLANG_MM_FEATURE_CACHE_MB)",
                           self.pool.free_bytes >> 20, self.pool.capacity >> 20, rid,
                           "shared memory" if self.shm_prefix else "the request itself", n)
        if self.shm_prefix is None:
            return None
        try:
            return write_segment(tensor, self.shm_prefix)
        except ShmSpaceError:
            return None

    def stats(self) -> dict:
        return {**self.pool.stats(), "cuda_ipc_fallback_count": self.fallback_count}

    def close(self) -> int:
        """Shutdown: the pool's memory and board go, and this instance's fallback segments."""
        _LIVE_POOLS.pop(self.pool.pool_id, None)
        n = self.pool.close()
        if self.shm_prefix:
            cleanup_own_segments(self.shm_prefix)
        return n


# ---------------------------------------------------------------------------------------------- receiver
class StaleSliceError(RuntimeError):
    """A pointer's slice was freed or reused before this rank finished reading it (a lifecycle bug)."""


class CudaIpcReceiver:
    """Scheduler side (one per process): pointers -> tensors on this rank's device, release stamps.

    Each item is a view of the opened pool at the pointer's offset, copied into a tensor of this rank
    (on a side stream, so the copy does not wait for the model's queued work; the model's stream waits
    for it). The slice is stamped as consumed on the release board once its copy has completed,
    checked without blocking at every receive (`poll`). Pools are opened through the handle cache."""

    def __init__(self, rank: int, cache, debug: bool = False):
        from sglang.srt.multimodal.transport.cuda_ipc_handle_cache import IpcHandleCache

        self.rank = rank
        self.cache: IpcHandleCache = cache
        self.debug = debug
        self._boards: dict[str, tuple[PoolDesc, object]] = {}
        self._pending: list[tuple] = []  # (event or None, board, slot, generation, pointer if debug)
        self._stream = None
        self.num_items = 0
        cache.before_close = self._drain  # a pool is never closed under a copy in flight

    def _board(self, desc: PoolDesc):
        from sglang.srt.multimodal.transport.cuda_ipc_pool import ReleaseBoard

        entry = self._boards.get(desc.pool_id)
        if entry is None or entry[0] != desc:
            if entry is not None:
                entry[1].close()
            entry = self._boards[desc.pool_id] = (desc, ReleaseBoard.attach(desc))
        return entry[1]

    def _check(self, board, ptr: CudaIpcPointerMMData, when: str) -> None:
        live = int(board.gen[ptr.slot])
        if live != ptr.generation:
            raise StaleSliceError(f"rank {self.rank}: slice {ptr.slot} of pool {ptr.pool.pool_id} holds generation "
                                  f"{live}, the pointer {ptr.generation} ({when} reading it)")

    def _read(self, ptr: CudaIpcPointerMMData, base: torch.Tensor):
        dtype = getattr(torch, ptr.dtype)
        view = base[ptr.offset:ptr.offset + ptr.nbytes].view(dtype).view(ptr.shape)
        if base.device.type != "cuda":
            return view.clone(), None
        dev = torch.device("cuda", torch.cuda.current_device())
        cur = torch.cuda.current_stream(dev)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=dev)
        with torch.cuda.stream(self._stream):
            out = torch.empty(ptr.shape, dtype=dtype, device=dev)
            out.copy_(view, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        out.record_stream(cur)
        cur.wait_event(event)
        return out, event

    def materialize(self, ptr: CudaIpcPointerMMData) -> torch.Tensor:
        board = self._board(ptr.pool)
        if self.debug:
            self._check(board, ptr, "before")
        if ptr.nbytes == 0:
            out, event = torch.empty(ptr.shape, dtype=getattr(torch, ptr.dtype)), None
        else:
            out, event = self.cache.read(ptr.pool, lambda base: self._read(ptr, base),
                                         done=lambda r: r[1] is not None and r[1].synchronize())
        self._pending.append((event, board, ptr.slot, ptr.generation, ptr if self.debug else None))
        self.num_items += 1
        return out

    def _drain(self) -> None:
        for event, *_ in self._pending:
            if event is not None:
                event.synchronize()

    def poll(self) -> int:
        """Stamps every slice whose copy has completed (in order: one stream); returns how many."""
        n = 0
        for event, board, slot, gen, ptr in self._pending:
            if event is not None and not event.query():
                break
            if ptr is not None:
                self._check(board, ptr, "after")
            board.stamp(slot, self.rank, gen)
            n += 1
        del self._pending[:n]
        return n

    def stats(self) -> dict:
        return {**self.cache.stats.as_dict(), "mm_ipc_items": self.num_items}

    def close(self) -> None:
        self._drain()
        self.poll()
        self.cache.close_all()
        for _, board in self._boards.values():
            board.close()
        self._boards.clear()


_RECEIVER: CudaIpcReceiver | None = None


def get_receiver(rank: int) -> CudaIpcReceiver:
    """This process's receiver (one handle cache per process), configured from the environment."""
    global _RECEIVER
    if _RECEIVER is None:
        from sglang.srt.environ import envs
        from sglang.srt.multimodal.transport.cuda_ipc_handle_cache import IpcHandleCache

        _RECEIVER = CudaIpcReceiver(rank, IpcHandleCache(enabled=envs.SGLANG_USE_IPC_POOL_HANDLE_CACHE.get()),
                                    debug=envs.SGLANG_MM_IPC_DEBUG.get())
    return _RECEIVER


def materialize_ipc_features(msgs: list, rank: int) -> int:
    """After the TP broadcast, on every rank: pool pointers of the received requests -> tensors; also
    stamps the slices of earlier receives whose copies have completed. Returns the items read."""
    if _RECEIVER is not None:
        _RECEIVER.poll()
    n = 0
    for msg in msgs:
        mm = getattr(msg, "mm_inputs", None)
        if mm is None:
            continue
        for item in mm.mm_items:
            if isinstance(item.feature, CudaIpcPointerMMData):
                item.feature = get_receiver(rank).materialize(item.feature)
                n += 1
    if n:
        _RECEIVER.poll()  # host pools and already-finished copies are released at once
    return n


def ipc_receiver_stats() -> dict:
    return _RECEIVER.stats() if _RECEIVER is not None else {}


def close_receiver() -> None:
    global _RECEIVER
    if _RECEIVER is not None:
        _RECEIVER.close()
        _RECEIVER = None


# ---------------------------------------------------------------------------------------------- wiring
def make_sender(server_args) -> CudaIpcSender | None:
    """The tokenizer process's sender under `--mm-feature-transport cuda_ipc` (None otherwise): a pool
    of SGLANG_MM_FEATURE_CACHE_MB on this process's CUDA device, read by every local TP rank; a full
    pool falls back to shared memory unless SGLANG_MM_SHM_TRANSPORT=0."""
    if server_args.mm_feature_transport != "cuda_ipc":
        return None
    from sglang.srt.environ import envs
    from sglang.srt.multimodal.transport.shm import segment_prefix

    prefix = segment_prefix(server_args.port)
    pool = CudaIpcPool(envs.SGLANG_MM_FEATURE_CACHE_MB.get() << 20, len(server_args.local_tp_ranks()), prefix)
    logger.info("cuda_ipc feature pool: %d MiB on %s, %d rank(s)", pool.capacity >> 20,
                pool.memory.buffer.device, pool.num_ranks)
    return CudaIpcSender(pool, prefix if envs.SGLANG_MM_SHM_TRANSPORT.get() else None)
