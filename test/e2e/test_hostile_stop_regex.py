"""stop_regex against the rest of the server (docs/reliability.md, "Stop strings and stop_regex"): a
backtracking pattern ends its own request instead of stalling the scheduler, a stream's search for a
partial match cannot freeze the event loop, and the output is cut where the match was found."""

from __future__ import annotations

import json
import threading

import requests

from hostile import beside_ordinary, running_requests

TIMEOUT_S = 300


def _stream_generate(url: str, body: dict, on_chunk=None) -> dict:
    """The last chunk of a streamed /generate."""
    last = None
    with requests.post(url + "/generate", json={**body, "stream": True}, stream=True, timeout=TIMEOUT_S) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                last = json.loads(line[6:])
                if on_chunk is not None:
                    on_chunk(last)
    return last


def test_a_backtracking_stop_regex_is_a_400_and_the_scheduler_keeps_serving(server):
    """(a|aa)+b over forced a's: each token doubled the search (274 s at the 38th, a 4-token request
    sent meanwhile took 144 s); the search is cut at SGLANG_STOP_REGEX_TIMEOUT_MS."""
    tok_a = requests.post(server.url + "/tokenize", json={"prompt": "a", "add_special_tokens": False},
                          timeout=30).json()["tokens"]
    assert len(tok_a) == 1
    body = {"text": "x", "sampling_params": {"max_new_tokens": 60, "temperature": 0, "ignore_eos": True,
                                             "logit_bias": {str(tok_a[0]): 100}, "stop_regex": "(a|aa)+b"}}

    def hostile():
        return requests.post(server.url + "/generate", json=body, timeout=TIMEOUT_S)

    r, worst = beside_ordinary(server.url, hostile, in_flight=lambda: running_requests(server.url) > 0)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "(a|aa)+b" in msg and "SGLANG_STOP_REGEX_TIMEOUT_MS" in msg


def test_a_streamed_partial_match_search_cannot_freeze_the_event_loop(server):
    """a*a*a*a*b can partially match anywhere in 500 a's; once a 'c' follows, every start backtracks:
    that search ran on the event loop for every chunk (13 s a chunk for 1000 a's, /health down 38 s).
    Now it stops at a tenth of the budget and the stream holds back its last 1024 characters."""
    expected = "a" * 500 + "c" * 8
    near_end = threading.Event()
    body = {"text": "x", "sampling_params": {"max_new_tokens": 600, "temperature": 0, "regex": "a{500}c{8}",
                                             "stop_regex": "a*a*a*a*b"}}

    def on_chunk(chunk):
        if chunk["meta_info"].get("completion_tokens", 0) >= 490:
            near_end.set()

    def hostile():
        return _stream_generate(server.url, body, on_chunk)

    last, _ = beside_ordinary(server.url, hostile, in_flight=near_end.is_set)
    assert last["text"] == expected and last["meta_info"]["finish_reason"]["type"] != "abort"


def test_stop_regex_cuts_where_it_matched_not_at_an_earlier_copy_of_the_text(server):
    """(?<=Total: )\\d+ matches the final 12, not the 12 in 'I counted 12': both the whole answer and the
    stream end at 'Total: ' (they were 'I counted ' and differed from each other)."""
    sp = {"max_new_tokens": 40, "temperature": 0, "regex": r"I counted 12 apples\. Total: 12 apples\.",
          "stop_regex": r"(?<=Total: )\d+"}
    whole = requests.post(server.url + "/generate", json={"text": "x", "sampling_params": sp}, timeout=TIMEOUT_S)
    assert whole.status_code == 200, whole.text
    streamed = _stream_generate(server.url, {"text": "x", "sampling_params": sp})
    for out in (whole.json(), streamed):
        assert out["text"] == "I counted 12 apples. Total: "
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": r"(?<=Total: )\d+"}
