"""The radix tree's recurrent-state snapshots (hybrid models) and the state pool's queued copies: a
match stops at the deepest snapshot, a split keeps the snapshot with the half whose end it marks,
eviction and reset free snapshots with their nodes, and queued copies apply in the order asked."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.gdn_state import GDNStateShape
from sglang.srt.mem_cache.hybrid_prefix import capture_points
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.state_pool import GDNStatePool


class _Slots:
    def __init__(self):
        self.freed: list[int] = []

    def free(self, slot: int) -> None:
        self.freed.append(slot)


def _tree(page_size: int = 1):
    alloc = TokenToKVPoolAllocator(256, page_size=page_size)
    slots = _Slots()
    return RadixCache(alloc, page_size, free_snapshot=slots.free), alloc, slots


def _insert(tree, alloc, key):
    tree.insert(key, alloc.alloc(len(key)))


def test_match_stops_at_the_deepest_snapshot_at_or_below_it():
    tree, alloc, _ = _tree()
    key = list(range(20))
    _insert(tree, alloc, key)
    assert tree.match_prefix(key).indices.numel() == 0  # KV without any snapshot is not resumable
    assert tree.attach_snapshot(key[:8], 100) and tree.attach_snapshot(key[:15], 101)
    assert not tree.attach_snapshot(key[:8], 102), "one snapshot per position"
    m = tree.match_prefix(key[:14])
    assert m.indices.numel() == 8 and m.last_node.snapshot == 100
    m = tree.match_prefix(key + [99])
    assert m.indices.numel() == 15 and m.last_node.snapshot == 101
    assert not tree.attach_snapshot([7, 7, 7], 103), "not in the tree"


def test_a_split_keeps_the_snapshot_at_the_end_it_marks():
    tree, alloc, _ = _tree()
    key = list(range(12))
    _insert(tree, alloc, key)
    assert tree.attach_snapshot(key, 7)
    _insert(tree, alloc, key[:5] + [50, 51])  # splits the edge at 5
    m = tree.match_prefix(key)
    assert m.indices.numel() == 12
    assert m.last_node.snapshot == 7 and tree.match_prefix(key[:5] + [50]).indices.numel() == 0
    assert tree.snapshot_count() == 1


def test_eviction_and_reset_free_snapshots_with_their_nodes():
    tree, alloc, slots = _tree()
    a, b = list(range(10)), list(range(100, 110))
    _insert(tree, alloc, a)
    _insert(tree, alloc, b)
    tree.attach_snapshot(a, 1)
    tree.attach_snapshot(b, 2)
    tree.match_prefix(b)  # b more recently used
    tree.evict(0, snapshots=1)
    assert slots.freed == [1] and tree.snapshot_count() == 1
    tree.reset()
    assert sorted(slots.freed) == [1, 2] and tree.snapshot_count() == 0


def test_paged_snapshots_sit_on_page_boundaries_only():
    tree, alloc, _ = _tree(page_size=4)
    key = list(range(16))
    _insert(tree, alloc, key)
    assert not tree.attach_snapshot(key[:6], 1)
    assert tree.attach_snapshot(key[:8], 1)
    assert tree.match_prefix(key[:15]).indices.numel() == 8


def test_capture_points():
    class Req:
        prompt_key = list(range(100))
        mm_inputs = None

    assert capture_points(Req, 0, 100, 32, 1) == [32, 64, 96, 99]
    assert capture_points(Req, 32, 70, 32, 1) == [64]  # (start, end]: 32 was the previous step's
    assert capture_points(Req, 0, 100, 0, 8) == [96]  # only the prompt's last position, paged down


def test_queued_copies_apply_in_order_before_the_forward_reads():
    shape = GDNStateShape(num_layers=1, conv_dim=2, conv_kernel=3, num_value_heads=1, key_head_dim=2,
                          value_head_dim=2)
    pool = GDNStatePool(shape, rows=2, snapshot_slots=2)
    pool.recurrent[0].fill_(3.0)
    snap = pool.alloc_snapshot()
    assert snap in (2, 3)
    pool.queue_copy(0, snap)  # keep row 0 ...
    pool.queue_copy(snap, 1)  # ... and restore it into row 1
    assert pool.recurrent[1].abs().sum() == 0, "nothing moves before the next forward"
    states = pool.states_for([1, 0], prefix_lens=[5, 0])  # row 0 restarts at position 0
    assert torch.all(states[0].recurrent == 3.0) and torch.all(pool.recurrent[snap] == 3.0)
    assert torch.all(states[1].recurrent == 0.0)
    pool.free_snapshot(snap)
    with pytest.raises(RuntimeError, match="freed twice"):
        pool.free_snapshot(snap)


def test_the_kernel_path_gets_the_pool_and_rows_without_per_request_views():
    shape = GDNStateShape(num_layers=1, conv_dim=2, conv_kernel=3, num_value_heads=1, key_head_dim=2,
                          value_head_dim=2)
    pool = GDNStatePool(shape, rows=3)
    pool.recurrent.fill_(2.0)
    states = pool.states_for([2, 0], prefix_lens=[4, 0], views=False)
    assert list(states) == [None, None] and states.pool is pool and states.rows == [2, 0]
    assert torch.all(pool.recurrent[0] == 0.0) and torch.all(pool.recurrent[2] == 2.0)  # fresh rows still zeroed
    viewed = pool.states_for([2, 0])
    assert viewed.rows == [2, 0] and torch.all(viewed[0].recurrent == 2.0)
