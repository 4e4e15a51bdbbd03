"""/update_weights_from_disk cannot freeze traffic, through the server (`--weight-update-drain-timeout 2`):
a stream whose client stopped reading does not hold an update once the scheduler finished its request; a
request still running holds it at most the bound, then the update answers 409 naming it (nothing loaded) and
the requests held meanwhile run; with abort_on_drain_timeout the running request is aborted and the update
goes on."""

from __future__ import annotations

import json
import socket
import threading

import pytest
import requests

from conftest import wait_until

DRAIN_S = 2
GUARD_S = 300  # bounds a failure only: every wait ends on its condition


@pytest.fixture(scope="module")
def drain_server(launch_server):
    s = launch_server("--weight-update-drain-timeout", str(DRAIN_S))
    yield s
    s.close()


def _info(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=60).json()


def _update(url: str, **body) -> requests.Response:
    return requests.post(url + "/update_weights_from_disk", json=body, timeout=GUARD_S)


def _generate(url: str, text: str, max_new_tokens: int, **extra) -> requests.Response:
    return requests.post(url + "/generate", timeout=GUARD_S, json={
        "text": text, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        **extra})


def _in_background(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run():
        out["response"] = fn(*args, **kwargs)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _running(url: str, what: str) -> None:
    wait_until(lambda: _info(url)["num_running_reqs"] >= 1, GUARD_S, what=what)


def _unread_stream(port: int, text: str, max_new_tokens: int) -> socket.socket:
    """A streamed /generate whose client never reads: a small receive buffer, and large chunks (each carries
    the whole output so far with 20 alternatives per token), so the server's writes soon block."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = json.dumps({"text": text, "stream": True, "return_logprob": True, "top_logprobs_num": 20,
                       "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}})
    sock.sendall((f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    return sock


def test_a_stream_nobody_reads_does_not_hold_an_update(drain_server, model_dir):
    url = drain_server.url
    before = _info(url)["radix_cache_tokens"]
    sock = _unread_stream(drain_server.port, "An unread stream about quiet harbours and " * 3, 300)
    try:
        # the scheduler finished it: its 300 output tokens went to the prefix cache and nothing runs
        wait_until(lambda: (lambda i: i["radix_cache_tokens"] >= before + 300 and i["num_running_reqs"] == 0
                            and i["num_waiting_reqs"] == 0)(_info(url)), GUARD_S, what="the stream's request to end")
        r = _update(url, model_path=str(model_dir), weight_version="after-unread")
        assert r.status_code == 200 and r.json()["success"] is True, r.text  # not a 409 naming the unread stream
        threads = [_in_background(_generate, url, f"request {i} after the update", 2) for i in range(4)]
        for t, _ in threads:
            t.join(GUARD_S)
        for _, out in threads:
            assert out["response"].status_code == 200, out["response"].text
            assert out["response"].json()["meta_info"]["weight_version"] == "after-unread"
    finally:
        sock.close()


def test_an_update_waits_at_most_the_drain_bound_and_the_requests_it_held_then_run(drain_server, model_dir):
    url = drain_server.url
    long_t, long = _in_background(_generate, url, "A long story", 3500, rid="drain-long")
    try:
        _running(url, "the long request to run")
        update_t, update = _in_background(_update, url, model_path=str(model_dir), weight_version="never")
        short_t, short = _in_background(_generate, url, "A short question", 2)
        update_t.join(GUARD_S)
        short_t.join(GUARD_S)
        assert update["response"].status_code == 409, update["response"].text
        message = update["response"].json()["error"]["message"]
        assert f"1 request(s) still running after {DRAIN_S} s" in message and "--weight-update-drain-timeout" in message
        assert short["response"].status_code == 200, short["response"].text
        assert "response" not in long, "the long request ended first: nothing was held"
        assert short["response"].json()["meta_info"]["weight_version"] != "never"
    finally:
        requests.post(url + "/abort_request", json={"rid": "drain-long"}, timeout=60)
        long_t.join(GUARD_S)
    assert long["response"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert requests.get(url + "/get_weight_version", timeout=60).json()["weight_version"] != "never"


def test_abort_on_drain_timeout_aborts_what_still_runs_and_updates(drain_server, model_dir):
    url = drain_server.url
    long_t, long = _in_background(_generate, url, "Another long story", 3500)
    _running(url, "the long request to run")
    r = _update(url, model_path=str(model_dir), weight_version="after-abort", abort_on_drain_timeout=True)
    long_t.join(GUARD_S)
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert long["response"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    after = _generate(url, "A short question", 2)
    assert after.status_code == 200 and after.json()["meta_info"]["weight_version"] == "after-abort"
