"""KV exhaustion through the server: the recipes that used to kill the scheduler now end with every
request answered (200 or a 4xx naming the numbers) and the server still serving, nothing leaked."""

from __future__ import annotations

import threading

import requests

from conftest import wait_until


def _generate(url: str, ids: list[int], max_new: int, out: dict, key: str) -> None:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0}}
    r = requests.post(url + "/generate", json=body, timeout=300)
    out[key] = (r.status_code, r.json())


def _assert_idle_and_clean(s) -> None:
    info = wait_until(lambda: (i := requests.get(s.url + "/get_server_info", timeout=30).json())["num_running_reqs"] == 0
                      and i["num_waiting_reqs"] == 0 and i, 60, what="idle")
    assert info["available_kv_tokens"] == info["max_total_num_tokens"], info
    ok = requests.post(s.url + "/generate", json={"text": "still serving", "sampling_params": {"max_new_tokens": 3}},
                       timeout=60)
    assert ok.status_code == 200, ok.text
    return info


def test_long_decode_then_big_prompt_on_a_small_pool(launch_server):
    s = launch_server("--max-total-tokens", "600", "--chunked-prefill-size", "64")
    out: dict = {}
    a = threading.Thread(target=_generate, args=(s.url, list(range(1000, 1040)), 500, out, "a"))
    a.start()
    wait_until(lambda: requests.get(s.url + "/get_server_info", timeout=30).json()["num_running_reqs"] == 1, 60,
               what="request A to decode")
    _generate(s.url, list(range(2000, 2400)), 16, out, "b")
    a.join(300)
    assert out["a"][0] == 200 and out["a"][1]["meta_info"]["completion_tokens"] == 500, out["a"]
    assert out["b"][0] == 200 and out["b"][1]["meta_info"]["completion_tokens"] == 16, out["b"]
    info = _assert_idle_and_clean(s)
    assert info["num_retractions"] >= 1  # the pool really ran short
    s.close()


def test_single_request_larger_than_the_pool_is_a_400_naming_both_numbers(launch_server):
    s = launch_server("--max-total-tokens", "64")
    out: dict = {}
    _generate(s.url, list(range(1000, 1040)), 50, out, "one")
    status, body = out["one"]
    assert status == 400, body
    msg = body["error"]["message"]
    assert "40" in msg and "50" in msg and "64" in msg, msg
    # without an explicit max_new_tokens the output is clamped to what fits, not refused
    r = requests.post(s.url + "/generate", json={"input_ids": list(range(1000, 1040)),
                                                 "sampling_params": {"ignore_eos": True}}, timeout=60)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] <= 24, r.text
    _assert_idle_and_clean(s)
    s.close()
