"""`--dp-size 2`: two replicas behind the data-parallel controller give the same greedy tokens as one
server, both get work, the load-based method follows live counts, an abort reaches the replica running the
request, flush/info/load/metrics cover every replica, and a dead replica takes the server down cleanly."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import CASES, build_case, wait_until

MAX_NEW = 6


@pytest.fixture(scope="module")
def dp2(launch_server):
    # total_requests: picks by live counts, and (equal counts) round robin, so both paths are exercised
    return launch_server("--dp-size", "2", "--load-balance-method", "total_requests", "--enable-metrics")


def _body(case: str) -> dict:
    messages, _, _ = build_case(CASES[case])
    return {"model": "m", "messages": messages, "max_tokens": MAX_NEW, "temperature": 0}


def _chat(url: str, body: dict) -> dict:
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _generate(url: str, text: str, **sampling) -> dict:
    r = requests.post(url + "/generate", timeout=120, json={
        "text": text, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True, **sampling}})
    assert r.status_code == 200, r.text
    return r.json()


def _idle(url: str) -> bool:
    return all(load["num_reqs"] == 0 for load in requests.get(url + "/get_load", timeout=10).json())


def test_greedy_tokens_equal_one_server_and_both_replicas_work(dp2, server):
    texts = [f"Count the apples, case {i}:" for i in range(6)]
    one = [_generate(server.url, t)["output_ids"] for t in texts]
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda t: _generate(dp2.url, t), texts))
    assert [o["output_ids"] for o in outs] == one
    assert {o["meta_info"]["dp_rank"] for o in outs} == {0, 1}
    for case in ("one_image", "three_images_mixed_sizes"):
        ref = _chat(server.url, _body(case))["choices"][0]["message"]["content"]
        assert [_chat(dp2.url, _body(case))["choices"][0]["message"]["content"] for _ in range(2)] == [ref, ref]


def test_routed_dp_rank_pins_requests_to_a_replica(dp2):
    """An external router's choice (upstream's routed_dp_rank, or data_parallel_rank as sglang-router's
    --dp-aware sends it) is honoured on every route; a rank outside --dp-size is a 400 naming it."""
    for rank in (0, 1):
        for key in ("routed_dp_rank", "data_parallel_rank"):
            r = requests.post(dp2.url + "/generate", timeout=120, json={
                "text": "pinned", key: rank, "sampling_params": {"max_new_tokens": 2}})
            assert r.status_code == 200 and r.json()["meta_info"]["dp_rank"] == rank, r.text
    for url, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                      ("/v1/completions", {"prompt": "hi"})):
        r = requests.post(dp2.url + url, timeout=120, json={**body, "max_tokens": 2, "routed_dp_rank": 5})
        assert r.status_code == 400 and "routed_dp_rank" in r.json()["error"]["message"], r.text
        assert requests.post(dp2.url + url, timeout=120, json={**body, "max_tokens": 2, "routed_dp_rank": 1}).status_code == 200


def test_a_busy_replica_gets_no_new_requests_and_abort_reaches_it(dp2):
    wait_until(lambda: _idle(dp2.url), 30, what="an idle server")
    rid = "dp-abort-" + uuid.uuid4().hex
    body = {"text": "never stop", "rid": rid, "stream": True, "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
    with requests.post(dp2.url + "/generate", json=body, stream=True, timeout=60) as r:
        lines = (ln[6:] for ln in r.iter_lines() if ln.startswith(b"data: "))
        busy = json.loads(next(lines))["meta_info"]["dp_rank"]
        loads = requests.get(dp2.url + "/get_load", timeout=10).json()
        assert [load["num_reqs"] for load in loads] == [1 if k == busy else 0 for k in range(2)], loads
        # total_requests: while one replica holds the long request, every short one goes to the other
        assert {_generate(dp2.url, f"short {i}")["meta_info"]["dp_rank"] for i in range(4)} == {1 - busy}
        a = requests.post(dp2.url + "/abort_request", json={"rid": rid}, timeout=10)
        assert a.status_code == 200 and a.json()["num_aborted"] == 1
        rest = list(lines)
    assert rest[-1] == b"[DONE]"
    last = json.loads(rest[-2])
    assert last["meta_info"]["finish_reason"]["type"] == "abort" and last["meta_info"]["dp_rank"] == busy
    wait_until(lambda: _idle(dp2.url), 30, what="the aborted request's replica to be empty")


def test_flush_info_and_metrics_cover_every_replica(dp2):
    wait_until(lambda: _idle(dp2.url), 30, what="an idle server")
    assert requests.post(dp2.url + "/flush_cache", timeout=30).json()["success"] is True
    info = requests.get(dp2.url + "/get_server_info", timeout=10).json()
    reps = info["replicas"]
    assert [r["dp_rank"] for r in reps] == [0, 1] and info["dp_size"] == 2
    assert info["max_total_num_tokens"] == sum(r["max_total_num_tokens"] for r in reps)
    assert all(r["radix_cache_tokens"] == 0 for r in reps)  # both flushed
    _generate(dp2.url, "fill a cache")
    assert sum(r["radix_cache_tokens"] for r in requests.get(dp2.url + "/get_server_info", timeout=10).json()["replicas"]) > 0
    metrics = requests.get(dp2.url + "/metrics", timeout=10).text
    assert 'sglang:dp_num_running_reqs{model_name=' in metrics and 'dp_rank="1"' in metrics


@pytest.mark.slow  # four scheduler processes with a gloo group each
def test_replicas_of_a_tp2_group_equal_one_server(launch_server, server):
    s = launch_server("--dp-size", "2", "--tp-size", "2")
    names = {"sglang-dp0-tp0", "sglang-dp0-tp1", "sglang-dp1-tp0", "sglang-dp1-tp1", "sglang-dpctl"}
    assert names <= set(s.children.values())
    texts = [f"Two by two, case {i}:" for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda t: _generate(s.url, t), texts))
    assert [o["output_ids"] for o in outs] == [_generate(server.url, t)["output_ids"] for t in texts]
    assert {o["meta_info"]["dp_rank"] for o in outs} == {0, 1}
    s.close()


@pytest.mark.slow  # a second dp-2 server, killed
@pytest.mark.parametrize("victim", ["sglang-dp1-tp0", "sglang-dpctl"])
def test_a_dead_replica_or_controller_takes_the_server_down(launch_server, victim):
    s = launch_server("--dp-size", "2")
    assert {"sglang-dp0-tp0", "sglang-dp1-tp0", "sglang-dpctl", "sglang-detok"} <= set(s.children.values())
    os.kill(s.pid_of(victim), signal.SIGKILL)
    start = time.monotonic()
    def unhealthy() -> bool:
        try:
            return requests.get(s.url + "/health", timeout=5).status_code == 503
        except requests.ConnectionError:
            return s.proc.poll() is not None

    wait_until(unhealthy, 30, what="the server to report the dead replica")
    try:  # within the exit grace period requests are refused with the reason
        r = requests.post(s.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=30)
        assert r.status_code == 503 and victim in r.text, r.text
    except requests.ConnectionError:
        assert s.proc.poll() is not None  # already gone
    wait_until(lambda: s.proc.poll() is not None, 30, what="the server to exit")
    assert s.proc.returncode != 0 and time.monotonic() - start < 30
    s.stop()
    s.assert_clean()


def test_a_grammar_that_fails_to_compile_is_a_400_on_either_replica(dp2):
    """Each request's grammar compiles on the replica it went to; an invalid one is a 400 naming the
    problem whichever replica took it (n=4: the samples spread), and the replicas serve on."""
    url = dp2.url
    with ThreadPoolExecutor(4) as pool:
        bad = list(pool.map(lambda i: requests.post(url + "/generate", timeout=120, json={
            "text": f"Code {i}:", "sampling_params": {"max_new_tokens": 4, "n": 4, "regex": "a(b"}}), range(4)))
    for r in bad:
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("invalid regex:"), r.text
    outs = [_generate(url, f"Code {i}:", regex="[0-9]{4}") for i in range(4)]
    assert all(o["text"].isdigit() and len(o["text"]) == 4 for o in outs), outs
    wait_until(lambda: _idle(url), 60, what="both replicas idle")
    assert requests.get(url + "/get_server_info", timeout=10).json()["num_grammar_queue_reqs"] == 0


def test_dp2_listens_on_loopback_only(dp2):
    from sglang.srt.utils.process_tree import listening_tcp

    found = listening_tcp(dp2.proc.pid)
    assert ("127.0.0.1", dp2.port) in found
    assert not {(a, p) for a, p in found if a != "127.0.0.1"}
