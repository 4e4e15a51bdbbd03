"""A server running the overlap scheduler (forced on for the CPU device) against the session's step-by-step
server: the same greedy answers for concurrent text and image chats, streamed or not, constrained or not;
a client that leaves mid-stream frees its KV; the server keeps serving."""

from __future__ import annotations

import base64
import io
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import MAIN_SERVER_ARGS, noise_image, wait_until

# a second server for a loop a CPU device does not run by default (~30 s on 2 cores): the slow target; the
# in-process equality tests of test/unit/managers/test_overlap_schedule.py stay in the default suite
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def overlap_server(launch_server, media_dir):
    s = launch_server(*MAIN_SERVER_ARGS, "--allowed-local-media-path", str(media_dir),
                      env={"SGLANG_OVERLAP_SCHEDULE_ON_CPU": "1"})
    yield s
    s.close()  # stopped with the module, not held to the session's end


def _image_url(seed: int) -> str:
    buf = io.BytesIO()
    noise_image(96, 64, seed).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _bodies() -> list[dict]:
    bodies = [{"messages": [{"role": "user", "content": f"Tell me about the number {i}"}], "max_tokens": 4 + 3 * i}
              for i in range(5)]
    bodies += [{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": _image_url(i)}},
                                                          {"type": "text", "text": "What is it?"}]}],
                "max_tokens": 10} for i in range(2)]
    bodies.append({"messages": [{"role": "user", "content": "A color as JSON"}], "max_tokens": 40,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": {
                       "type": "object", "properties": {"color": {"enum": ["red", "green"]}}, "required": ["color"],
                       "additionalProperties": False}}}})
    bodies.append({"messages": [{"role": "user", "content": "Stream this"}], "max_tokens": 12, "stream": True})
    return [dict(b, model="default", temperature=0) for b in bodies]


def _answer(url: str, body: dict) -> tuple[str, str]:
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=120, stream=body.get("stream", False))
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        choice = r.json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"]
    text, finish = "", None
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            for c in json.loads(line[6:])["choices"]:
                text += c["delta"].get("content") or ""
                finish = c.get("finish_reason") or finish
    return text, finish


def _all(url: str) -> list[tuple[str, str]]:
    with ThreadPoolExecutor(8) as pool:  # concurrent: batches form, requests end at different steps
        return list(pool.map(lambda b: _answer(url, b), _bodies()))


def test_concurrent_answers_equal_the_step_by_step_server(server, overlap_server):
    assert requests.get(overlap_server.url + "/get_server_info", timeout=10).json()["overlap_schedule"] is True
    assert requests.get(server.url + "/get_server_info", timeout=10).json()["overlap_schedule"] is False
    got = _all(overlap_server.url)
    assert got == _all(server.url)
    assert json.loads(got[7][0])["color"] in ("red", "green")


def test_a_client_leaving_mid_stream_frees_its_kv(overlap_server):
    url = overlap_server.url
    body = {"model": "default", "messages": [{"role": "user", "content": "Go on"}], "max_tokens": 400,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with requests.post(url + "/v1/chat/completions", json=body, timeout=60, stream=True) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
    info = lambda: requests.get(url + "/get_server_info", timeout=10).json()  # noqa: E731
    wait_until(lambda: info()["num_running_reqs"] == 0, 60, what="the abandoned stream to end")
    wait_until(lambda: info()["available_kv_tokens"] == info()["max_total_num_tokens"], 30, what="its KV to return")
    assert _answer(url, _bodies()[0])[1] == "length"
