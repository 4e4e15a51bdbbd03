"""mm-hash-precompute against the real server: `/health` keeps answering while a request with 16
images of 1920x1080 is decoded, preprocessed and hashed in the tokenizer process (all of it runs in
worker threads, none on the event loop); the `hash` stage is logged by the tokenizer; the switch
off (baseline) and on give the same tokens and the same prefix-cache hits."""

from __future__ import annotations

import io
import re
import statistics
import threading
import time

import numpy as np
import pytest
import requests
from PIL import Image

from conftest import data_url, noise_image, png_bytes

PAD = "<|vision_start|><|image_pad|><|vision_end|>"
HEALTH_BOUND_S = 2.0  # loose: the event loop answers in milliseconds when nothing blocks it


def _jpeg_1080p(seed: int) -> str:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=85)
    return data_url(buf.getvalue(), "image/jpeg")


@pytest.fixture(scope="module")
def hashing_server(launch_server, monkeypatch_module):
    monkeypatch_module.delenv("SGLANG_MM_PRECOMPUTE_HASH", raising=False)  # the default: on
    return launch_server("--enable-vlm-stage-timer", "--log-level", "info")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_health_answers_while_16_big_images_hash(hashing_server):
    s = hashing_server
    images = [_jpeg_1080p(100 + k) for k in range(16)]
    body = {"text": PAD * 16, "image_data": images,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}}
    result: dict = {}

    def big_request():
        result["response"] = requests.post(s.url + "/generate", json=body, timeout=300)

    worker = threading.Thread(target=big_request)
    latencies, starts = [], []
    start = time.perf_counter()
    worker.start()
    while worker.is_alive():
        t0 = time.perf_counter()
        assert requests.get(s.url + "/health", timeout=30).status_code == 200
        latencies.append(time.perf_counter() - t0)
        starts.append(t0 - start)
        time.sleep(0.02)
    worker.join()
    r = result["response"]
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    timings = meta["stage_timings_ms"]
    print(f"\n/health while 16x1920x1080 in flight: {len(latencies)} probes, median "
          f"{statistics.median(latencies) * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms (sent "
          f"{starts[latencies.index(max(latencies))]:.2f} s after the request); request stages "
          + ", ".join(f"{k}={timings[k]:.1f}" for k in ("processor", "hash", "send", "first_token")))
    assert len(latencies) >= 3, "the request finished before /health could be probed"
    assert max(latencies) < HEALTH_BOUND_S, latencies
    assert timings["hash"] > 0
    # The tokenizer measured and logged `hash`; the scheduler (prefixed [TP0]) did not.
    log = s.log_path.read_text(errors="replace")
    rid = meta["id"]
    assert re.search(rf"^(?!\[TP0\]).*\[VLM_STAGE_TIMER\] hash \| req={rid} \|", log, re.M), log[-2000:]
    assert not re.search(rf"\[TP0\] \[VLM_STAGE_TIMER\] hash \| req={rid} \|", log)


def _two_requests(url: str):
    body = {"text": "<|im_start|>user\n" + PAD + PAD + "Describe.<|im_end|>\n<|im_start|>assistant\n",
            "image_data": [data_url(png_bytes(noise_image(160, 96, 7))), data_url(png_bytes(noise_image(96, 128, 8)))],
            "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    out = []
    for _ in range(2):
        r = requests.post(url + "/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        j = r.json()
        out.append((j["text"], j["meta_info"]["cached_tokens"], j["meta_info"].get("vit_encoded_images")))
    return out


def test_switch_off_and_on_serve_the_same(hashing_server, launch_server, monkeypatch_module):
    on = _two_requests(hashing_server.url)
    monkeypatch_module.setenv("SGLANG_MM_PRECOMPUTE_HASH", "0")
    baseline = launch_server()
    try:
        off = _two_requests(baseline.url)
    finally:
        baseline.close()
    assert on == off
    assert on[1][1] > 0  # the repeated request hit the prefix cache through the image pad values
