"""ReqToTokenPool queues the scheduler's writes and applies them in one scatter before a forward."""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.memory_pool import ReqToTokenPool


def test_writes_land_only_when_applied_and_in_order_of_columns():
    pool = ReqToTokenPool(4, 8)
    row = pool.alloc()
    pool.write(row, 0, torch.tensor([5, 6, 7]))
    pool.write(row, 3, torch.tensor([9]))
    assert pool.req_to_token[row].tolist() == [0] * 8  # nothing before the forward applies them
    pool.apply_pending()
    assert pool.req_to_token[row, :4].tolist() == [5, 6, 7, 9]
    pool.apply_pending()  # nothing queued: a no-op
    assert pool.req_to_token[row, :4].tolist() == [5, 6, 7, 9]


def test_freed_row_drops_its_queued_writes_so_the_next_owner_never_sees_them():
    pool = ReqToTokenPool(1, 4)
    a = pool.alloc()
    pool.write(a, 0, torch.tensor([1, 2, 3, 4]))
    pool.free(a)
    b = pool.alloc()
    assert b == a
    pool.write(b, 0, torch.tensor([8]))
    pool.apply_pending()
    assert pool.req_to_token[b].tolist() == [8, 0, 0, 0]


def test_empty_write_is_ignored():
    pool = ReqToTokenPool(2, 4)
    pool.write(pool.alloc(), 2, torch.empty(0, dtype=torch.int64))
    pool.apply_pending()
    assert int(pool.req_to_token.abs().sum()) == 0


def test_writes_queued_while_another_thread_applies_are_never_lost():
    """The overlap scheduler queues the next step's writes while the forward thread applies the queue."""
    import threading

    pool = ReqToTokenPool(1, 4000)
    row = pool.alloc()
    done = threading.Event()

    def apply_until_done():
        while not done.is_set():
            pool.apply_pending()

    t = threading.Thread(target=apply_until_done)
    t.start()
    try:
        for c in range(4000):
            pool.write(row, c, torch.tensor([c + 1]))
    finally:
        done.set()
        t.join()
    pool.apply_pending()
    assert pool.req_to_token[row].tolist() == list(range(1, 4001))


def test_cell_writes_equal_row_writes_and_a_freed_row_leaves_the_others_cells():
    cells, rows = ReqToTokenPool(4, 6), ReqToTokenPool(4, 6)
    for pool in (cells, rows):
        for _ in range(4):
            pool.alloc()
    steps = [([3, 0, 2], [0, 0, 0], [11, 12, 13]), ([3, 0, 2], [1, 1, 1], [21, 22, 23]), ([0, 2], [2, 2], [32, 33])]
    for r, c, v in steps:
        cells.write_cells(r, c, torch.tensor(v))
        for i, col, val in zip(r, c, v):
            rows.write(i, col, torch.tensor([val]))
    cells.free(2)  # its cells in every queued step go; rows 3 and 0 keep theirs
    rows.free(2)
    cells.write_cells([], [], torch.empty(0, dtype=torch.int64))  # nothing to queue
    cells.apply_pending()
    rows.apply_pending()
    assert torch.equal(cells.req_to_token, rows.req_to_token)
    assert cells.req_to_token[0, :3].tolist() == [12, 22, 32] and cells.req_to_token[3, :2].tolist() == [11, 21]
    assert int(cells.req_to_token[2].abs().sum()) == 0
