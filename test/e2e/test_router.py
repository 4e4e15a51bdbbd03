"""Upstream's router (sglang-router, the PyPI package) in front of two servers of this engine: it finds the
workers (it reads /health, /model_info, /server_info), polls /get_load, routes image chats, streams and
/generate under `round_robin` and `cache_aware`, exposes its Prometheus port, and keeps serving once a
worker dies: every request sent after its health checker marked the dead worker unhealthy succeeds."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import REPO, ServerProcess, data_url, noise_image, png_bytes, wait_until

from sglang.srt.utils.network import pick_unused_port

pytestmark = [
    pytest.mark.slow,  # two servers and a router: ~30-60 s on a small machine
    pytest.mark.skipif(importlib.util.find_spec("sglang_router") is None,
                       reason="sglang-router is not installed (pip install '.[test]')"),
]

ROUTER_START_S = 60.0


class RouterProcess:
    """`python -m sglang_router.launch_router` on loopback, health-checking its workers every second and
    giving up on one after a single failed check."""

    def __init__(self, worker_urls: list[str], policy: str, log_path):
        self.port, self.prom_port = pick_unused_port(), pick_unused_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
               "--worker-urls", *worker_urls, "--policy", policy, "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(self.prom_port), "--health-check-interval-secs", "1",
               "--health-failure-threshold", "1", "--log-level", "warn"]
        self._log = open(log_path, "wb")
        self.log_path = log_path
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO)

    def workers(self) -> dict[str, bool]:
        """worker url -> healthy, as the router sees them ({} until it answers)."""
        try:
            r = requests.get(self.url + "/workers", timeout=5)
        except requests.ConnectionError:
            return {}
        return {w["url"]: w["is_healthy"] for w in r.json()["workers"]} if r.status_code == 200 else {}

    def wait_ready(self, urls: list[str]) -> "RouterProcess":
        def ready():
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            return self.workers() == {u: True for u in urls}

        wait_until(ready, ROUTER_START_S, interval=0.2, what="the router to register both workers")
        return self

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="module")
def workers(launch_server):
    return [launch_server("--enable-metrics"), launch_server("--enable-metrics")]


@pytest.fixture
def router_factory(tmp_path):
    started: list[RouterProcess] = []

    def make(urls: list[str], policy: str) -> RouterProcess:
        r = RouterProcess(urls, policy, tmp_path / f"router-{policy}.log")
        started.append(r)
        return r.wait_ready(urls)

    yield make
    for r in started:
        r.close()


def _image_chat(url: str, seed: int, stream: bool = False) -> str:
    img = data_url(png_bytes(noise_image(64 + 8 * (seed % 4), 64, seed)))
    body = {"model": "m", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": stream, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": img}}, {"type": "text", "text": f"picture {seed}"}]}]}
    r = requests.post(url + "/v1/chat/completions", json=body, timeout=120, stream=stream)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["choices"][0]["finish_reason"]
    lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == b"data: [DONE]", lines[-3:]
    return "stream"


def _generate(url: str, text: str) -> dict:
    r = requests.post(url + "/generate", timeout=120,
                      json={"text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def _finished_requests(worker: ServerProcess) -> float:
    text = requests.get(worker.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("sglang:num_requests_total{"))


def test_round_robin_spreads_image_chats_streams_and_generate(workers, router_factory):
    urls = [w.url for w in workers]
    before = [_finished_requests(w) for w in workers]
    router = router_factory(urls, "round_robin")
    for seed in range(4):
        assert _image_chat(router.url, seed) == "length"
    assert _image_chat(router.url, 9, stream=True) == "stream"
    assert len(_generate(router.url, "hello")["output_ids"]) == 4
    served = [_finished_requests(w) - b for w, b in zip(workers, before)]
    assert sum(served) == 6 and min(served) >= 2, served  # round robin: both workers took their share

    # the router's load view comes from our /get_load (a 404 there reads as load -1)
    loads = requests.get(router.url + "/get_loads", timeout=10).json()["workers"]
    assert {w["worker"] for w in loads} == set(urls) and all(w["load"] >= 0 for w in loads), loads
    metrics = requests.get(f"http://127.0.0.1:{router.prom_port}/metrics", timeout=10)
    assert metrics.status_code == 200 and "smg_" in metrics.text, metrics.text[:500]


def test_cache_aware_keeps_serving_after_a_worker_dies(workers, router_factory):
    urls = [w.url for w in workers]
    router = router_factory(urls, "cache_aware")
    assert _image_chat(router.url, 1) == "length"
    assert _image_chat(router.url, 2, stream=True) == "stream"
    assert len(_generate(router.url, "a prompt the router hashes")["output_ids"]) == 4

    # load on both workers while one of them is killed: what was in flight there may fail
    victim = workers[1]
    stop = threading.Event()

    def traffic(i: int) -> None:
        while not stop.is_set():
            try:  # unrelated prompts: no shared prefix ties them to one worker
                requests.post(router.url + "/generate", timeout=60, json={
                    "text": f"{uuid.uuid4().hex} background {i}", "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}})
            except requests.RequestException:
                pass

    with ThreadPoolExecutor(3) as pool:
        try:
            for i in range(3):
                pool.submit(traffic, i)
            wait_until(lambda: requests.get(victim.url + "/get_load", timeout=5).json()[0]["num_reqs"] > 0, 60,
                       interval=0.05, what="the victim to be busy")
            os.kill(victim.proc.pid, signal.SIGKILL)
            wait_until(lambda: router.workers().get(victim.url) is False, 30, what="the router to mark the worker dead")
        finally:
            stop.set()

    # from here on every request goes to the survivor: none may fail
    for seed in range(3):
        assert _image_chat(router.url, 20 + seed) == "length"
    assert _image_chat(router.url, 30, stream=True) == "stream"
    for i in range(3):
        assert len(_generate(router.url, f"after the failure {i}")["output_ids"]) == 4
    assert router.proc.poll() is None
    assert victim.proc.wait(30) == -signal.SIGKILL
    victim._log.close()
    victim.assert_clean()  # its children noticed the parent was gone and left nothing behind
