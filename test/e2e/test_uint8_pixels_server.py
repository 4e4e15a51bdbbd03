"""mm-uint8-pixels end to end at TP=2 (shared memory, chunked prefill of 48 tokens): a server with
SGLANG_MM_UINT8_PIXELS=1 answers image and video requests with the same greedy tokens as one with the
switch off, the same image is a prefix-cache hit (hashed as the uint8 carrier) and another is not, and
no shared-memory segment is left behind."""

from __future__ import annotations

import base64
import os

import pytest
import requests

from conftest import noise_image, png_bytes, wait_until
from transport_traffic import two_image_body

pytest.importorskip("av")
from sglang.testing.sample_video import make_clip  # noqa: E402

VIDEO_TEXT = "Look: <|vision_start|><|video_pad|><|vision_end|> and <|vision_start|><|video_pad|><|vision_end|> now."


@pytest.fixture(scope="module")
def servers(launch_server):
    args = ("--tp-size", "2", "--mm-feature-transport", "cpu", "--chunked-prefill-size", "48")
    return launch_server(*args, env={"SGLANG_MM_UINT8_PIXELS": "1"}), launch_server(*args)


def test_servers_report_their_carrier(servers):
    on, off = servers
    assert requests.get(on.url + "/get_server_info", timeout=10).json()["mm_uint8_pixels"] is True
    assert requests.get(off.url + "/get_server_info", timeout=10).json()["mm_uint8_pixels"] is False


def _generate(server, body) -> dict:
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_image_outputs_equal_the_switch_off_server(servers):
    on, off = servers
    before = [requests.get(s.url + "/get_server_info", timeout=10).json()["mm_uint8_items"] for s in (on, off)]
    for seed in range(3):
        body = two_image_body(100 + seed, 8)
        assert _generate(on, body)["output_ids"] == _generate(off, body)["output_ids"]
    after = [requests.get(s.url + "/get_server_info", timeout=10).json()["mm_uint8_items"] for s in (on, off)]
    assert after[0] - before[0] == 6 and after[1] == before[1] == 0  # what was sent, not the setting


def test_video_outputs_equal_the_switch_off_server(servers):
    on, off = servers
    frames = [base64.b64encode(png_bytes(noise_image(48, 32, s))).decode() for s in range(5)]
    body = {"text": VIDEO_TEXT, "video_data": [base64.b64encode(make_clip(96, 64, 10, 1.6, seed=5)).decode(), frames],
            "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    a, b = _generate(on, body), _generate(off, body)
    assert a["output_ids"] == b["output_ids"] and a["meta_info"]["prompt_tokens"] == b["meta_info"]["prompt_tokens"]


def test_same_image_hits_the_prefix_cache_another_does_not(servers):
    on, _ = servers
    first = _generate(on, two_image_body(200, 2))["meta_info"]
    again = _generate(on, two_image_body(200, 2))["meta_info"]
    other = _generate(on, two_image_body(201, 2))["meta_info"]
    assert again["cached_tokens"] >= first["prompt_tokens"] - 8
    assert other["cached_tokens"] < first["prompt_tokens"] - 8
    wait_until(lambda: requests.get(on.url + "/get_server_info", timeout=10).json()["num_running_reqs"] == 0,
               60, what="server to go idle")
    assert {n for n in os.listdir("/dev/shm") if n.startswith(f"sglang_mm_{on.port}_")} == set()
