"""The data-parallel controller's pure parts: picking a replica from live counts (plus what was sent and not
yet seen by the replica), and merging the replies of every replica into one."""

from __future__ import annotations

from sglang.srt.managers.data_parallel_controller import LoadBalancer
from sglang.srt.managers.data_parallel_messages import (
    merge_flush_replies,
    merge_profile_replies,
    merge_server_infos,
    read_request_header,
    request_header,
)
from sglang.srt.managers.io_struct import FlushCacheReqOutput, ProfileReqOutput, ReplicaLoadReport


def test_round_robin_cycles_whatever_the_load():
    lb = LoadBalancer("round_robin", 3)
    lb.on_report(ReplicaLoadReport(1, num_reqs=50, num_tokens=9000, num_received_reqs=0, num_received_tokens=0))
    assert [lb.pick(10) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_a_routed_request_goes_where_it_was_sent_and_is_counted_there():
    for method in ("round_robin", "total_requests", "total_tokens"):
        lb = LoadBalancer(method, 3)
        assert [lb.pick(7, routed=2) for _ in range(3)] == [2, 2, 2]
        assert lb.held(2) == (3, 21) and lb.held(0) == (0, 0)
        assert lb.pick(1) == 0  # routed picks leave the balancer's own order alone


def test_total_requests_spreads_a_burst_before_any_report_arrives():
    lb = LoadBalancer("shortest_queue", 2)  # upstream's earlier name
    assert [lb.pick(5) for _ in range(4)] == [0, 1, 0, 1]
    assert lb.held(0) == (2, 10) and lb.held(1) == (2, 10)


def test_total_requests_follows_the_replicas_live_counts():
    lb = LoadBalancer("total_requests", 2)
    first = lb.pick(100)
    # that replica took it in and still holds it (say a long generation); the other one is idle
    lb.on_report(ReplicaLoadReport(first, num_reqs=1, num_tokens=120, num_received_reqs=1, num_received_tokens=100))
    other = 1 - first
    assert lb.pick(7) == other
    # the other one finished its request: one request held each way -> the tie goes round robin
    lb.on_report(ReplicaLoadReport(other, num_reqs=0, num_tokens=0, num_received_reqs=1, num_received_tokens=7))
    assert lb.pick(7) == other  # 0 held (+0 unseen) against 1
    assert lb.held(other) == (1, 7)  # sent, not yet reported


def _with_history(method: str) -> LoadBalancer:
    """Replica 0 took 3 short requests, replica 1 one long one; both still hold them."""
    lb = LoadBalancer(method, 2)
    lb.sent_reqs, lb.sent_tokens = [3, 1], [30, 5000]
    lb.on_report(ReplicaLoadReport(0, num_reqs=3, num_tokens=30, num_received_reqs=3, num_received_tokens=30))
    lb.on_report(ReplicaLoadReport(1, num_reqs=1, num_tokens=5000, num_received_reqs=1, num_received_tokens=5000))
    return lb


def test_total_tokens_prefers_fewer_tokens_and_total_requests_fewer_requests():
    assert _with_history("minimum_tokens").pick(10) == 0  # more requests but far fewer tokens
    assert _with_history("total_requests").pick(10) == 1  # fewer requests


def test_server_infos_sum_counts_and_keep_each_replica():
    a = {"dp_rank": 0, "max_total_num_tokens": 100, "num_running_reqs": 2, "context_length": 4096, "x": {"k": 1}}
    b = {"dp_rank": 1, "max_total_num_tokens": 100, "num_running_reqs": 3, "context_length": 4096, "x": {"k": 2}}
    merged = merge_server_infos([b, a])
    assert merged["max_total_num_tokens"] == 200 and merged["num_running_reqs"] == 5
    assert merged["context_length"] == 4096 and merged["x"] == {"k": 1}
    assert [r["dp_rank"] for r in merged["replicas"]] == [0, 1] and "dp_rank" not in merged
    assert merge_server_infos([a]) is a  # one replica: unchanged


def test_server_infos_sum_the_grammar_queue_and_cache_of_every_replica():
    cache = {"entries": 2, "hits": 5, "misses": 2, "compiling": 1}
    a = {"dp_rank": 0, "num_grammar_queue_reqs": 1, "grammar_cache": cache}
    b = {"dp_rank": 1, "num_grammar_queue_reqs": 3, "grammar_cache": {k: 10 * v for k, v in cache.items()}}
    merged = merge_server_infos([a, b])
    assert merged["num_grammar_queue_reqs"] == 4
    assert merged["grammar_cache"] == {"entries": 22, "hits": 55, "misses": 22, "compiling": 11}
    assert merged["replicas"][0]["grammar_cache"] == cache  # each replica's own figures stay listed
    off = merge_server_infos([dict(a, grammar_cache=None), dict(b, grammar_cache=None)])  # --grammar-backend none
    assert off["grammar_cache"] is None


def test_flush_and_profile_succeed_only_when_every_replica_did():
    ok, busy = FlushCacheReqOutput(True), FlushCacheReqOutput(False, "requests are running")
    assert merge_flush_replies([ok, ok]).success
    failed = merge_flush_replies([ok, busy])
    assert not failed.success and "1 of 2 replicas: requests are running" == failed.message
    prof = merge_profile_replies([ProfileReqOutput(True, files=["a-DP-0-TP-0"]), ProfileReqOutput(True, files=["a-DP-1-TP-0"])])
    assert prof.success and prof.files == ["a-DP-0-TP-0", "a-DP-1-TP-0"]


def test_request_header_round_trips():
    assert read_request_header(request_header("r1", 12)) == ("r1", 12, None)
    assert read_request_header(request_header("r2", 3, 1)) == ("r2", 3, 1)
