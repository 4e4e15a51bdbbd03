"""The feature pool's release protocol on CPU, with the /dev/shm stand-in for device memory: a slice
returns only once every rank has stamped it, stale stamps free nothing, discard is idempotent, and
free bytes always come back to the start value."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

from sglang.srt.multimodal.transport.cuda_ipc_pool import CudaIpcPool, ReleaseBoard
from sglang.srt.multimodal.transport.shm import SHM_DIR, segment_prefix

PREFIX = segment_prefix(2, os.getpid())


def _leftovers() -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(PREFIX)]


@pytest.fixture
def pool():
    p = CudaIpcPool(64 * 1024, num_ranks=2, prefix=PREFIX, kind="host", max_slots=16)
    yield p
    p.close()
    assert _leftovers() == []


def test_slice_returns_only_after_every_rank_stamped(pool):
    start = pool.free_bytes
    s = pool.alloc(1000)
    pool.view(s).copy_(torch.arange(1000, dtype=torch.int64).to(torch.uint8))
    assert pool.board.gen[s.slot] == s.generation
    assert pool.reclaim() == 0
    pool.board.stamp(s.slot, 0, s.generation)
    assert pool.reclaim() == 0 and pool.free_bytes < start  # rank 1 has not read it yet
    pool.board.stamp(s.slot, 1, s.generation)
    assert pool.reclaim() == 1 and pool.free_bytes == start and pool.board.gen[s.slot] == 0


def test_stale_stamps_do_not_free_a_newer_slice(pool):
    a = pool.alloc(100)
    pool.board.stamp(a.slot, 0, a.generation)
    pool.board.stamp(a.slot, 1, a.generation)
    assert pool.reclaim() == 1
    b = pool.alloc(100)  # the same slot, a newer generation; the old stamps were cleared
    assert b.slot == a.slot and b.generation != a.generation
    pool.board.stamp(b.slot, 0, a.generation)
    pool.board.stamp(b.slot, 1, a.generation)
    assert pool.reclaim() == 0 and pool.num_outstanding == 1


def test_full_pool_waits_then_gives_up_and_slots_are_bounded(pool):
    big = pool.alloc(60 * 1024)
    assert pool.alloc(8 * 1024, wait_s=0.02) is None
    assert pool.alloc(10**9, wait_s=5) is None  # larger than the pool: no wait at all
    pool.board.stamp(big.slot, 0, big.generation)
    pool.board.stamp(big.slot, 1, big.generation)
    assert pool.alloc(8 * 1024) is not None  # allocation reclaims by itself
    many = [pool.alloc(1) for _ in range(20)]
    assert sum(s is not None for s in many) == 15  # 16 slots, one already in use


def test_discard_is_idempotent_and_checks_the_generation(pool):
    start = pool.free_bytes
    s = pool.alloc(5000)
    assert pool.discard(s.slot, s.generation + 1) is False
    assert pool.discard(s.slot, s.generation) is True
    assert pool.discard(s.slot, s.generation) is False
    assert pool.free_bytes == start


def test_close_returns_everything_including_a_dead_ranks_slices():
    p = CudaIpcPool(1 << 16, num_ranks=2, prefix=PREFIX, kind="host", max_slots=8)
    for _ in range(5):
        s = p.alloc(3000)
        p.board.stamp(s.slot, 0, s.generation)  # rank 1 died before reading
    assert p.close() == 5 and p.free_bytes == p.capacity and p.alloc(1) is None
    assert _leftovers() == []


def _rank_process(desc, rank, slices, q):
    board = ReleaseBoard.attach(desc)
    import mmap

    with open(os.path.join(SHM_DIR, desc.handle[0]), "rb") as f:
        mm = mmap.mmap(f.fileno(), desc.nbytes, prot=mmap.PROT_READ)
    sums = []
    for slot, off, n, gen in slices:
        sums.append(sum(mm[off:off + n]))
        board.stamp(slot, rank, gen)
    q.put(sums)


def test_ranks_in_other_processes_read_and_release():
    p = CudaIpcPool(1 << 16, num_ranks=2, prefix=PREFIX, kind="host", max_slots=8)
    try:
        slices = []
        for i in range(4):
            s = p.alloc(1000)
            p.view(s).fill_(i + 1)
            slices.append((s.slot, s.offset, s.nbytes, s.generation))
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        procs = [ctx.Process(target=_rank_process, args=(p.desc, r, slices, q)) for r in range(2)]
        for pr in procs:
            pr.start()
        results = [q.get(timeout=30) for _ in procs]
        for pr in procs:
            pr.join(30)
        assert results == [[1000, 2000, 3000, 4000]] * 2
        assert p.reclaim() == 4 and p.free_bytes == p.capacity
    finally:
        p.close()
