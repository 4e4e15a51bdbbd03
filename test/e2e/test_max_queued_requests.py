"""--max-queued-requests through the server: with the one running slot busy and the queue full, the next
request is a 503 with upstream's message and the queued one still completes."""

from __future__ import annotations

import json
import threading

import requests

from conftest import wait_until


def _info(url: str) -> dict:
    return requests.get(url + "/get_server_info", timeout=60).json()


def test_a_full_queue_is_a_503_and_the_queued_request_completes(launch_server):
    server = launch_server("--max-queued-requests", "1", "--max-running-requests", "1")
    try:
        results = {}

        def send(name, max_new):
            body = {"text": "hello", "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
            results[name] = requests.post(server.url + "/generate", json=body, timeout=300)

        runner = threading.Thread(target=send, args=("running", 400))
        runner.start()
        wait_until(lambda: _info(server.url)["num_running_reqs"] == 1, 120, what="the long request to run")
        queued = threading.Thread(target=send, args=("queued", 4))
        queued.start()
        wait_until(lambda: _info(server.url)["num_waiting_reqs"] == 1, 120, what="one request to wait")
        full = requests.post(server.url + "/generate", timeout=120,
                             json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        assert full.status_code == 503, full.text
        assert "The request queue is full." in json.dumps(full.json())
        # streamed, too: a 503 status, not a 200 whose stream carries the error (as on a018ab2)
        streamed = requests.post(server.url + "/generate", timeout=120, stream=True,
                                 json={"text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 2}})
        assert streamed.status_code == 503, streamed.text
        assert "The request queue is full." in streamed.text
        chat = requests.post(server.url + "/v1/chat/completions", timeout=120, json={
            "model": "default", "stream": True, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 503 and "The request queue is full." in chat.text, chat.text
        runner.join(300)
        queued.join(300)
        assert results["running"].status_code == 200 and results["queued"].status_code == 200
    finally:
        server.close()
