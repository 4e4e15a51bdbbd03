"""A server with --enable-vlm-stage-timer --enable-metrics: all ten stages per image request in
meta_info and in the log (exact format, TP prefix in the scheduler), Prometheus histograms on /metrics."""

from __future__ import annotations

import re

import pytest
import requests

from conftest import data_url, noise_image, png_bytes

STAGES = {"processor", "hash", "send", "recv", "broadcast", "vit_encode", "embed_merge", "llm_prefill",
          "first_token", "decode"}


@pytest.fixture(scope="module")
def timed_server(launch_server):
    return launch_server("--enable-vlm-stage-timer", "--enable-metrics", "--log-level", "info")


def test_stage_timings_logs_and_metrics(timed_server):
    s = timed_server
    body = {
        "text": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n",
        "image_data": [data_url(png_bytes(noise_image(160, 96, 5)))],
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
    }
    r = requests.post(s.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    timings = meta["stage_timings_ms"]
    assert set(timings) == STAGES
    assert all(v >= 0 for v in timings.values())
    assert timings["first_token"] >= timings["vit_encode"]
    rid = meta["id"]

    log = s.log_path.read_text(errors="replace")
    tok_lines = re.findall(rf"\[VLM_STAGE_TIMER\] (\w+) \| req={rid} \| wall=\d+\.\d{{3}} ms", log)
    sched_lines = re.findall(rf"\[TP0\] \[VLM_STAGE_TIMER\] (\w+) \| req={rid} \| wall=\d+\.\d{{3}} ms", log)
    assert set(tok_lines) == STAGES
    # processor and (precomputed by default, SGLANG_MM_PRECOMPUTE_HASH) hash are timed in the tokenizer
    assert set(sched_lines) == STAGES - {"processor", "hash", "send"}

    # a streamed request yields several output chunks: inter-token latency observations
    with requests.post(s.url + "/generate", json={**body, "stream": True}, timeout=60, stream=True) as r:
        assert r.status_code == 200
        chunks = [line for line in r.iter_lines() if line.startswith(b"data:")]
    assert len(chunks) >= 3

    text = requests.get(s.url + "/metrics", timeout=30).text
    for name in ("sglang:time_to_first_token_seconds_count", "sglang:e2e_request_latency_seconds_count",
                 "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_running_reqs",
                 "sglang:num_queue_reqs", "sglang:cache_hit_rate", "sglang:inter_token_latency_seconds_count"):
        assert name in text, name
    count = re.search(r'sglang:vlm_stage_seconds_count\{model_name="[^"]*",stage="vit_encode"\} (\d+)', text)
    assert count and int(count.group(1)) >= 1
    gen = re.search(r"sglang:generation_tokens_total\{[^}]*\} ([\d.]+)", text)
    assert gen and float(gen.group(1)) >= 4


def test_metrics_endpoint_absent_without_flag(server):
    assert requests.get(server.url + "/metrics", timeout=10).status_code == 404
