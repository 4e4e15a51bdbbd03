"""Pixel data through POSIX shared memory (`/dev/shm`), referenced by small picklable pointers.

Lifecycle, without the upstream failure modes:
- the tokenizer process writes each item's pixels into its own segment and replaces the tensor with a
  `ShmPointerMMData`; pickling the pointer (ZMQ, TP broadcast, any number of times) carries only the
  metadata, never the pixels;
- every TP rank calls `materialize()` only after the broadcast: it maps the segment (copy-on-write,
  zero-copy until written) and from then on holds the data through its own mapping;
- once every rank has mapped the request's segments (a barrier on the CPU group at TP > 1), rank 0
  unlinks their names, exactly once. Mappings outlive the name, so no rank ever finds a segment
  missing, and memory is freed when the last mapping goes;
- the other samples of a prompt (`n` > 1) get hard links to the same segments under names of their own
  (`link_mm_items`): every name has one owner (its request) and goes through this lifecycle alone, and
  the pages are freed with the last name and the last mapping;
- a request that fails before reaching the scheduler unlinks its segments where it fails; a crash
  leaves names with this server's prefix, removed by `cleanup_stale_segments` at the next start;
- a segment's pages are reserved with posix_fallocate before anything is written through the
  mapping: on a full tmpfs that is an ENOSPC exception (`ShmSpaceError`), where writing through an
  unbacked mapping would be a SIGBUS that kills the process. The caller then sends that request's
  pixels inline instead.
"""

from __future__ import annotations

import logging
import mmap
import os
import uuid
from dataclasses import dataclass

import numpy as np
import torch

from sglang.srt.environ import envs

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
_PREFIX_ROOT = "sglang_mm_"


def segment_prefix(port: int, pid: int | None = None) -> str:
    """Names of one server instance's segments start with this: its port, then the pid of the process
    that launched it (its tokenizer manager), which is what tells a stale segment from a live one."""
    return f"{_PREFIX_ROOT}{port}_{os.getpid() if pid is None else pid}_"


def use_shm_transport(server_args) -> bool:
    """`--mm-feature-transport cpu` uses shared memory (SGLANG_MM_SHM_TRANSPORT, on by default), which
    reaches only the ranks on this host: with ranks on other nodes, pixels go inline."""
    if server_args.mm_feature_transport != "cpu" or not envs.SGLANG_MM_SHM_TRANSPORT.get():
        return False
    if server_args.nnodes > 1:
        logger.warning("shared-memory transport needs every TP rank on one host; with --nnodes %d the "
                       "pixels travel inline with the requests instead", server_args.nnodes)
        return False
    return True


class ShmSpaceError(OSError):
    """/dev/shm cannot hold a segment (full tmpfs, size limit): send the data another way."""


@dataclass
class ShmPointerMMData:
    """Where an item's pixels live: segment name, byte offset and size, tensor shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"
    offset: int
    nbytes: int

    def __getstate__(self):
        return {"name": self.name, "shape": self.shape, "dtype": self.dtype, "offset": self.offset, "nbytes": self.nbytes}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def materialize(self, copy: bool = False) -> torch.Tensor:
        """The tensor: a private copy-on-write view of the segment, or an owned copy."""
        dtype = getattr(torch, self.dtype)
        if self.nbytes == 0:
            return torch.empty(self.shape, dtype=dtype)
        fd = os.open(os.path.join(SHM_DIR, self.name), os.O_RDONLY)
        try:
            mm = mmap.mmap(fd, self.offset + self.nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        t = torch.frombuffer(mm, dtype=dtype, count=self.nbytes // dtype.itemsize, offset=self.offset).view(self.shape)
        return t.clone() if copy else t


def write_segment(tensor: torch.Tensor, prefix: str) -> ShmPointerMMData:
    """Copies `tensor` (CPU) into a new segment named `<prefix><random>`; returns its pointer."""
    t = tensor.detach().contiguous()
    if t.device.type != "cpu":
        t = t.cpu()
    name = f"{prefix}{uuid.uuid4().hex}"
    nbytes = t.numel() * t.element_size()
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, max(nbytes, 1))
        except OSError as e:
            raise ShmSpaceError(e.errno, f"cannot reserve {nbytes} bytes in {SHM_DIR}: {e.strerror}") from None
        with mmap.mmap(fd, max(nbytes, 1)) as mm:
            if nbytes:
                np.frombuffer(mm, dtype=np.uint8, count=nbytes)[:] = t.reshape(-1).view(torch.uint8).numpy()
    except BaseException:
        os.close(fd)
        unlink_segments([name])
        raise
    os.close(fd)
    return ShmPointerMMData(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), 0, nbytes)


def unlink_segments(names) -> int:
    """Removes segment names (already-gone ones are fine: unlinking is idempotent here)."""
    n = 0
    for name in names:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            n += 1
        except FileNotFoundError:
            pass
    return n


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale_segments(port: int) -> int:
    """Removes the segments left by earlier runs on this port whose launching process is gone."""
    root = f"{_PREFIX_ROOT}{port}_"
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith(root)]
    except FileNotFoundError:
        return 0
    stale = []
    for n in names:
        pid = n[len(root):].split("_", 1)[0]
        if not pid.isdigit() or not _pid_alive(int(pid)):
            stale.append(n)
    return unlink_segments(stale)


def cleanup_own_segments(prefix: str) -> int:
    """At shutdown: every segment this instance still has (requests that never reached a scheduler)."""
    try:
        return unlink_segments([n for n in os.listdir(SHM_DIR) if n.startswith(prefix)])
    except FileNotFoundError:
        return 0


def swap_tensor_features(mm_inputs, to_pointer, release) -> list[str]:
    """Replaces every tensor feature of a request by the pointer `to_pointer(tensor)` returns as
    (pointer, name), or leaves it inline when that returns None. Returns the names of what was written.
    All or nothing: on any failure the items get their tensors back and `release(names)` frees what this
    call wrote. Every transport (shared memory, the CUDA IPC pool) swaps features through this."""
    names: list[str] = []
    originals: list[tuple[object, torch.Tensor]] = []
    try:
        for item in mm_inputs.mm_items:
            if not isinstance(item.feature, torch.Tensor):
                continue
            swapped = to_pointer(item.feature)
            if swapped is None:
                continue
            ptr, name = swapped
            names.append(name)
            originals.append((item, item.feature))
            item.feature = ptr
    except BaseException:
        for item, tensor in originals:
            item.feature = tensor
        release(names)
        raise
    return names


def mm_items_to_shm(mm_inputs, prefix: str) -> list[str]:
    """Moves every tensor feature of a request into shared memory; returns the new segment names
    (the caller unlinks them if the request never reaches the scheduler). All or nothing: on any
    failure the items keep their tensors and no segment of this call remains."""
    def to_segment(tensor: torch.Tensor):
        ptr = write_segment(tensor, prefix)
        return ptr, ptr.name

    return swap_tensor_features(mm_inputs, to_segment, unlink_segments)


def link_mm_items(mm_inputs, prefix: str) -> list[str]:
    """Gives every shared-memory pointer of `mm_inputs` (a copy of a request's inputs, for another request
    with the same prompt: `n` > 1) a name of its own: a hard link to the same segment, so no pixel is
    written twice. Each name still has exactly one owner (the request that carries it) and is unlinked
    exactly once by the usual path; the pages go when the last name and the last mapping are gone.
    Returns the new names; all or nothing, as `mm_items_to_shm`."""
    def to_link(feature):
        if not isinstance(feature, ShmPointerMMData):
            return None
        ptr = link_segment(feature, prefix)
        return ptr, ptr.name

    names: list[str] = []
    linked: list[tuple[object, ShmPointerMMData]] = []
    try:
        for item in mm_inputs.mm_items:
            swapped = to_link(item.feature)
            if swapped is None:
                continue
            ptr, name = swapped
            names.append(name)
            linked.append((item, item.feature))
            item.feature = ptr
    except BaseException:
        for item, ptr in linked:
            item.feature = ptr
        unlink_segments(names)
        raise
    return names


def link_segment(ptr: ShmPointerMMData, prefix: str) -> ShmPointerMMData:
    """Another name for `ptr`'s segment: a hard link named `<prefix><random>`, the same pages under a name
    with an owner of its own."""
    name = f"{prefix}{uuid.uuid4().hex}"
    os.link(os.path.join(SHM_DIR, ptr.name), os.path.join(SHM_DIR, name))
    return ShmPointerMMData(name, ptr.shape, ptr.dtype, ptr.offset, ptr.nbytes)


def own_pointers(mm_inputs, prefix: str) -> list[str]:
    """The segment names a request's items already point at (written by a preprocessing worker), each
    owned by this request alone: an item repeating a name another item of the request holds (one image
    given twice) gets a hard link of its own. On failure every one of them is unlinked (the request
    fails with the error)."""
    names: list[str] = []
    try:
        for item in mm_inputs.mm_items:
            ptr = item.feature
            if isinstance(ptr, ShmPointerMMData):
                if ptr.name in names:
                    ptr = item.feature = link_segment(ptr, prefix)
                names.append(ptr.name)
    except BaseException:
        unlink_segments(set(names) | {it.feature.name for it in mm_inputs.mm_items
                                      if isinstance(it.feature, ShmPointerMMData)})
        raise
    return names


def materialize_mm_features(msgs: list) -> list[str]:
    """After the TP broadcast, on every rank: maps each pointer of the received requests; returns the
    segment names (rank 0 unlinks them once all ranks have mapped them)."""
    names: list[str] = []
    for msg in msgs:
        mm = getattr(msg, "mm_inputs", None)
        if mm is None:
            continue
        for item in mm.mm_items:
            if isinstance(item.feature, ShmPointerMMData):
                names.append(item.feature.name)
                item.feature = item.feature.materialize()
    return names
