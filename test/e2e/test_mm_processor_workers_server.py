"""--mm-processor-worker-num end to end: a server with two preprocessing workers has children named
sglang-mmproc0/1 (/proc/<pid>/comm) and answers image chats with the same greedy tokens as a server with 0
(the in-process threads) and as transformers; a worker killed with SIGKILL in the middle of a burst of image
chats fails exactly the requests it held (500 naming it), the others are answered, the worker is restarted
and the server keeps serving; at shutdown no process and no segment is left. The burst's images are URLs on a
local gate that holds every fetch until the kill is done, so "mid-burst" is a condition, not a timing."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import requests

from conftest import CASES, build_case, data_url, noise_image, png_bytes, wait_until
from media_gate import MediaGate
from sglang.srt.utils.process_tree import child_pids

MAX_NEW = 8
ARGS = ("--allowed-media-domains", "127.0.0.1", "--media-fetch-timeout", "120")


@pytest.fixture(scope="module")
def servers(launch_server):
    workers = launch_server("--mm-processor-worker-num", "2", "--mm-io-worker-num", "4", *ARGS)
    threads = launch_server("--mm-processor-worker-num", "0", *ARGS)
    yield workers, threads
    workers.children = child_pids(workers.proc.pid)  # the restarted worker too
    workers.close()  # no child left (the workers included), no ipc dir, no segment of this server
    threads.close()


def _info(server) -> dict:
    return requests.get(server.url + "/get_server_info", timeout=30).json()


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _generate(server, text: str, images: list[str]) -> dict:
    r = requests.post(server.url + "/generate", timeout=300, json={
        "text": text, "image_data": images, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0}})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_workers_are_named_children(servers):
    workers, threads = servers
    info = _info(workers)["mm_processor_workers"]["workers"]
    assert [w["name"] for w in info] == ["sglang-mmproc0", "sglang-mmproc1"]
    children = child_pids(workers.proc.pid)
    for w in info:
        assert w["ready"] and children.get(w["pid"]) == w["name"] == _comm(w["pid"])
    assert "mm_processor_workers" not in _info(threads)
    assert not any(name.startswith("sglang-mmproc") for name in child_pids(threads.proc.pid).values())


@pytest.mark.parametrize("case", ["one_image", "three_images_mixed_sizes"])
def test_image_chats_equal_the_in_process_server_and_transformers(servers, hf_ref, case):
    workers, threads = servers
    _, tmpl, images = build_case(CASES[case])
    text = hf_ref.render(tmpl)
    urls = [data_url(png_bytes(img)) for img in images]
    done = sum(w["jobs_done"] for w in _info(workers)["mm_processor_workers"]["workers"])
    a, b = _generate(workers, text, urls), _generate(threads, text, urls)
    assert a["output_ids"] == b["output_ids"] == hf_ref.greedy(case, tmpl, images, MAX_NEW)
    assert a["meta_info"]["prompt_tokens"] == b["meta_info"]["prompt_tokens"] == len(hf_ref.prompt(tmpl, images)[0])
    assert sum(w["jobs_done"] for w in _info(workers)["mm_processor_workers"]["workers"]) == done + len(images)


def _chat(server, url: str, out: list) -> None:
    body = {"model": "default", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "What is this?"}]}]}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    out.append((r.status_code, r.json()))


def test_a_worker_killed_mid_burst_fails_only_its_requests(servers):
    workers, _ = servers
    gate = MediaGate(png_bytes(noise_image(96, 64, 21)))
    n = 6
    try:
        outs: list[list] = [[] for _ in range(n)]
        threads = [threading.Thread(target=_chat, args=(workers, f"{gate.url}/gate/{i}", outs[i])) for i in range(n)]
        for t in threads:
            t.start()
        assert gate.wait_arrived(n), "the workers never fetched the burst's images"
        before = _info(workers)["mm_processor_workers"]["workers"]
        held = before[0]["jobs_in_flight"]
        assert held >= 1 and held + before[1]["jobs_in_flight"] == n, before
        os.kill(before[0]["pid"], signal.SIGKILL)
        wait_until(lambda: sum(bool(o) for o in outs) >= held, 120, what="the killed worker's requests to fail")
        gate.release()
        for t in threads:
            t.join(300)
    finally:
        gate.close()
    failed = [body for status, body in (o[0] for o in outs) if status != 200]
    assert len(failed) == held, outs
    for status, body in (o[0] for o in outs):
        if status != 200:
            assert status == 500 and "sglang-mmproc0" in body["error"]["message"], body
    # restarted under the same name, and the server serves on
    wait_until(lambda: _info(workers)["mm_processor_workers"]["workers"][0]["ready"], 300, what="sglang-mmproc0")
    after = _info(workers)["mm_processor_workers"]["workers"]
    assert after[0]["restarts"] == before[0]["restarts"] + 1 and after[0]["pid"] != before[0]["pid"]
    assert _comm(after[0]["pid"]) == "sglang-mmproc0" and after[1]["pid"] == before[1]["pid"]
    assert requests.get(workers.url + "/health", timeout=30).status_code == 200
    again: list = []
    _chat(workers, data_url(png_bytes(noise_image(96, 64, 21))), again)
    ok = next(body for status, body in (o[0] for o in outs) if status == 200)
    assert again[0][0] == 200 and again[0][1]["choices"][0]["message"] == ok["choices"][0]["message"]
