"""--schedule-policy orders (fcfs, lpm, dfs-weight, lof, random, priority), priority scheduling on top of
each, and which running requests a higher-priority one may preempt."""

from __future__ import annotations

import random

import pytest

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import CACHE_AWARE_MAX_QUEUE, order_waiting, preemption_victims
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_manager import KVCacheManager
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampling_params import SamplingParams


def _kv(disable: bool = False) -> KVCacheManager:
    alloc = TokenToKVPoolAllocator(4096)
    return KVCacheManager(ReqToTokenPool(16, 512), alloc, RadixCache(alloc, 1, disable=disable))


def _cache(kv: KVCacheManager, key: list[int]) -> None:
    kv.tree.insert(key, kv.alloc_tokens(len(key)))


def _req(name: str, ids: list[int], max_new: int = 8, priority: int = 0) -> Req:
    r = Req(name, ids, SamplingParams(max_new_tokens=max_new))
    r.priority = priority
    return r


def _names(reqs: list[Req]) -> list[str]:
    return [r.rid for r in reqs]


A, B = list(range(100, 140)), list(range(200, 220))  # two cached prompts: 40 and 20 tokens


def test_fcfs_keeps_arrival_order_and_lof_puts_longest_outputs_first():
    reqs = [_req("a", [1, 2], 4), _req("b", [3, 4], 64), _req("c", [5, 6], 16), _req("d", [7, 8], 64)]
    assert _names(order_waiting(reqs, "fcfs", _kv())) == ["a", "b", "c", "d"]
    assert _names(order_waiting(reqs, "lof", _kv())) == ["b", "d", "c", "a"]  # ties keep arrival order
    assert _names(reqs) == ["a", "b", "c", "d"]  # the queue itself is not reordered


def test_lpm_puts_the_longest_cached_prefix_first():
    kv = _kv()
    _cache(kv, A)
    _cache(kv, B)
    reqs = [_req("none", [1, 2, 3]), _req("b", B + [7]), _req("a", A + [9]), _req("a-part", A[:10] + [5])]
    assert _names(order_waiting(reqs, "lpm", kv)) == ["a", "b", "a-part", "none"]


def test_dfs_weight_runs_the_most_shared_subtree_first_deepest_matches_before_shallow_ones():
    kv = _kv()
    _cache(kv, A)
    _cache(kv, B)
    _cache(kv, A[:10] + [1, 2, 3, 4])  # A's first 10 tokens branch: a node shared by both branches
    reqs = [_req("x", [9, 9, 9]), _req("b1", B + [1]), _req("a1", A + [1]), _req("b2", B + [2]),
            _req("a-branch", A[:10] + [1, 2, 3, 4, 5]), _req("a-stem", A[:10] + [7]), _req("a2", A + [2])]
    order = _names(order_waiting(reqs, "dfs-weight", kv))
    # A's subtree holds 4 waiting requests, B's 2: A's first; inside it the deeper edge with 2 requests,
    # then the branch with 1, then the requests ending at the shared node; requests matching nothing last
    assert order == ["a1", "a2", "a-branch", "a-stem", "b1", "b2", "x"]


def test_cache_aware_orders_fall_back_to_arrival_without_a_prefix_cache_or_past_the_queue_limit():
    kv = _kv(disable=True)
    reqs = [_req("short", [1]), _req("long", A)]
    assert _names(order_waiting(reqs, "lpm", kv)) == ["short", "long"]
    assert _names(order_waiting(reqs, "dfs-weight", kv)) == ["short", "long"]
    kv = _kv()
    _cache(kv, A)
    many = [_req(f"r{i}", [1]) for i in range(CACHE_AWARE_MAX_QUEUE)] + [_req("hit", A + [1])]
    assert _names(order_waiting(many, "lpm", kv))[-1] == "hit"
    assert _names(order_waiting(many[1:], "lpm", kv))[0] == "hit"


def test_random_is_a_permutation_reproducible_from_the_seed():
    reqs = [_req(f"r{i}", [i]) for i in range(20)]
    one = _names(order_waiting(reqs, "random", _kv(), rng=random.Random(7)))
    assert sorted(one) == sorted(_names(reqs)) and one != _names(reqs)
    assert one == _names(order_waiting(reqs, "random", _kv(), rng=random.Random(7)))  # every TP rank alike


def test_priority_orders_within_levels_on_top_of_any_policy():
    reqs = [_req("low-long", [1], 64, priority=0), _req("high-short", [2], 4, priority=5),
            _req("high-long", [3], 64, priority=5), _req("low-short", [4], 4, priority=0)]
    assert _names(order_waiting(reqs, "priority", _kv())) == ["high-short", "high-long", "low-long", "low-short"]
    assert _names(order_waiting(reqs, "lof", _kv(), priority_first=True)) == [
        "high-long", "high-short", "low-long", "low-short"]
    assert _names(order_waiting(reqs, "priority", _kv(), low_values_first=True)) == [
        "low-long", "low-short", "high-short", "high-long"]
    assert _names(order_waiting(reqs, "lof", _kv())) == ["low-long", "high-long", "high-short", "low-short"]


@pytest.mark.parametrize("threshold, low_first, expected", [
    (10, False, ["p0", "p5"]),  # the lowest priority first; p15 is within 10 of the newcomer
    (16, False, ["p0"]),
    (0, False, ["p0", "p5", "p15"]),  # the same priority never preempts, whatever the threshold
    (10, True, []),  # lower values first: 20 is the least urgent, it preempts nobody
])
def test_preemption_takes_requests_lower_by_the_threshold_worst_first(threshold, low_first, expected):
    running = [_req("p5", [1], priority=5), _req("p0", [2], priority=0), _req("p15", [3], priority=15),
               _req("p20", [4], priority=20)]
    assert _names(preemption_victims(running, _req("new", [9], priority=20), threshold, low_first)) == expected


def test_preemption_with_low_values_first_and_ties_broken_by_least_output():
    a, b = _req("a", [1], priority=9), _req("b", [2], priority=9)
    a.output_ids = [1, 2, 3]
    assert _names(preemption_victims([a, b, _req("c", [3], priority=1)], _req("new", [4], priority=0), 5,
                                     low_values_first=True)) == ["b", "a"]
