"""/update_weights_from_disk through the server, on one server started on seed-1 weights (B) and updated
to seed-0 (A) and back: a bad path is a 400 that leaves B serving; a request in flight during an update
completes; after the round trip greedy output equals the fresh server's on B (the prefix cache of A's KV
was flushed); abort_all_requests ends the request in flight with finish reason abort; weight_version is
reported in meta_info, /get_model_info and /get_weight_version."""

from __future__ import annotations

import threading

import pytest
import requests

from conftest import ServerProcess, wait_until
from sglang.testing.make_model import make_model

PROMPT = "The quick brown fox jumps over the lazy dog. " * 4


@pytest.fixture(scope="module")
def seed1_server(tmp_path_factory):
    path = make_model("qwen3-vl-tiny", tmp_path_factory.mktemp("seed1") / "model", seed=1, progress=False)
    s = ServerProcess(path, tmp_path_factory.mktemp("server"), []).wait_healthy()
    yield s
    s.close()


def _greedy(url: str) -> dict:
    r = requests.post(url + "/generate", timeout=300, json={
        "text": PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def _update(url: str, **body) -> requests.Response:
    return requests.post(url + "/update_weights_from_disk", json=body, timeout=600)


def _long_request(url: str, results: dict) -> threading.Thread:
    def send():
        results["long"] = requests.post(url + "/generate", timeout=600, json={
            "text": "count", "sampling_params": {"temperature": 0, "max_new_tokens": 300, "ignore_eos": True}})

    t = threading.Thread(target=send)
    t.start()
    wait_until(lambda: requests.get(url + "/get_server_info", timeout=60).json()["num_running_reqs"] == 1, 120,
               what="the long request to run")
    return t


def test_update_round_trip(seed1_server, model_dir):
    url = seed1_server.url
    fresh_b = _greedy(url)
    assert fresh_b["meta_info"]["weight_version"] == "default"

    bad = _update(url, model_path=str(model_dir) + "-missing")
    assert bad.status_code == 400 and bad.json()["success"] is False
    assert "Failed to update weights" in bad.json()["message"] and "-missing" in bad.json()["message"]
    assert _greedy(url)["text"] == fresh_b["text"]

    results: dict = {}
    t = _long_request(url, results)
    ok = _update(url, model_path=str(model_dir), weight_version="seed0")
    t.join(600)
    assert ok.status_code == 200, ok.text
    assert ok.json()["success"] is True and "Weight version updated to seed0." in ok.json()["message"]
    long = results["long"].json()  # in flight during the update: finished first, on the old weights
    assert results["long"].status_code == 200 and long["meta_info"]["finish_reason"]["type"] == "length"
    assert long["meta_info"]["completion_tokens"] == 300 and long["meta_info"]["weight_version"] == "default"
    on_a = _greedy(url)
    assert on_a["text"] != fresh_b["text"] and on_a["meta_info"]["weight_version"] == "seed0"
    assert requests.get(url + "/get_weight_version", timeout=30).json() == {"weight_version": "seed0"}
    assert requests.get(url + "/get_model_info", timeout=30).json()["weight_version"] == "seed0"

    t = _long_request(url, results)
    back = _update(url, model_path=str(seed1_server.model_dir), abort_all_requests=True, weight_version="seed1")
    t.join(600)
    assert back.status_code == 200 and back.json()["success"] is True, back.text
    assert results["long"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    again = _greedy(url)  # A's KV for this prompt was cached: the flush must have dropped it
    assert again["text"] == fresh_b["text"] and again["meta_info"]["weight_version"] == "seed1"


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--tp-size", "2"], ["--dp-size", "2"]], ids=["tp2", "dp2"])
def test_every_rank_and_replica_updates_or_none(layout, model_dir, tmp_path_factory):
    """At TP 2 and DP 2: a checkpoint of other shapes fails on every rank and replica and the server keeps
    serving seed 0; seed 1 then gives the fresh seed-1 server's output (each replica's)."""
    from dataclasses import replace

    from sglang.testing.presets import get_preset

    root = tmp_path_factory.mktemp("layout")
    p = get_preset("qwen3-vl-tiny")
    wide = make_model(replace(p, name="wide", text=replace(p.text, intermediate_size=p.text.intermediate_size * 2)),
                      root / "wide", progress=False)
    seed1 = make_model("qwen3-vl-tiny", root / "seed1", seed=1, progress=False)
    ref = ServerProcess(seed1, root / "ref", layout).wait_healthy()
    try:
        fresh = _greedy(ref.url)["text"]
    finally:
        ref.close()
    s = ServerProcess(model_dir, root / "server", layout).wait_healthy()
    try:
        before = _greedy(s.url)["text"]
        bad = _update(s.url, model_path=str(wide))
        assert bad.status_code == 400 and "Every rank keeps the weights it had" in bad.json()["message"]
        assert _greedy(s.url)["text"] == before
        assert _update(s.url, model_path=str(seed1)).status_code == 200
        assert [_greedy(s.url)["text"] for _ in range(2)] == [fresh, fresh]  # DP: round robin over both
    finally:
        s.close()
