"""The stop_regex size bound through the server (docs/reliability.md, "Stop strings and stop_regex"): inline
flags cannot hide a counted repeat from it. `(?x)(?:(?:a{1000} ) {1000} ) {100}` had been estimated from its
text at 2,105 elements while in verbose mode it unrolls to 10^8: compiling it stalled /health 3.4 s and grew
the tokenizer process by 0.5 GB for good. Now it and its variants are a 400 naming the limit, /health answers
throughout, and a small verbose-mode stop_regex still stops where it matches."""

from __future__ import annotations

import requests

from hostile import HOSTILE_TIMEOUT_S, beside_ordinary
from sglang.srt.sampling.stop_regex import MAX_STOP_REGEX_EXPANDED

HUGE = [
    "(?x)(?:(?:a{1000} ) {1000} ) {100}",
    "(?x:(?:(?:a{1000} ) {1000} ) {100})",  # a scoped verbose group
    "(?x)(?:(?:a{1000} # whitespace and comments are ignored\n ) {1000} # here too\n ) {100}",
]


def _generate(url: str, sp: dict) -> requests.Response:
    return requests.post(url + "/generate", json={"text": "x", "sampling_params": sp}, timeout=HOSTILE_TIMEOUT_S)


def test_inline_flags_cannot_get_a_huge_stop_regex_past_the_size_bound(server):
    for pattern in HUGE:
        r, _ = beside_ordinary(server.url, lambda: _generate(server.url, {"max_new_tokens": 4, "stop_regex": pattern}))
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "stop_regex" in message and f"limit of {MAX_STOP_REGEX_EXPANDED}" in message, message
    # a verbose-mode pattern of ordinary size is compiled and used as before
    sp = {"max_new_tokens": 40, "temperature": 0, "regex": r"I counted 12 apples\. Total: 12 apples\.",
          "stop_regex": r"(?x) Total: \s \d+  # the total"}
    r = _generate(server.url, sp)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["text"] == "I counted 12 apples. "
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": sp["stop_regex"]}
