"""compact-still-images end to end (shared memory, chunked prefill of 48 tokens cutting through the images):
a server with SGLANG_MM_COMPACT_STILL_IMAGES=1 answers image requests, and an image between videos, with the
same greedy tokens as one with the switch off; the same image is a prefix-cache hit and another is not."""

from __future__ import annotations

import base64

import pytest
import requests

from conftest import data_url, noise_image, png_bytes
from transport_traffic import two_image_body

pytest.importorskip("av")
from sglang.testing.sample_video import make_clip  # noqa: E402

MIXED_TEXT = ("Look: <|vision_start|><|video_pad|><|vision_end|> then <|vision_start|><|image_pad|><|vision_end|> "
              "and <|vision_start|><|video_pad|><|vision_end|> now.")


@pytest.fixture(scope="module")
def servers(launch_server):
    args = ("--mm-feature-transport", "cpu", "--chunked-prefill-size", "48")
    return launch_server(*args, env={"SGLANG_MM_COMPACT_STILL_IMAGES": "1"}), launch_server(*args)


def test_servers_report_the_setting(servers):
    on, off = servers
    assert requests.get(on.url + "/get_server_info", timeout=10).json()["mm_compact_still_images"] is True
    assert requests.get(off.url + "/get_server_info", timeout=10).json()["mm_compact_still_images"] is False


def _generate(server, body) -> dict:
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_image_outputs_equal_the_switch_off_server(servers):
    on, off = servers
    for seed in range(3):
        body = two_image_body(300 + seed, 8)
        a, b = _generate(on, body), _generate(off, body)
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["prompt_tokens"] == b["meta_info"]["prompt_tokens"]


def test_an_image_between_videos_equals_the_switch_off_server(servers):
    """One tower call holds the compact image and the videos' full rows: the image's are widened."""
    on, off = servers
    clip = base64.b64encode(make_clip(96, 64, 10, 1.6, seed=7)).decode()
    body = {"text": MIXED_TEXT, "video_data": [clip, clip], "image_data": [data_url(png_bytes(noise_image(80, 64, 9)))],
            "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    assert _generate(on, body)["output_ids"] == _generate(off, body)["output_ids"]


def test_same_image_hits_the_prefix_cache_another_does_not(servers):
    on, _ = servers
    first = _generate(on, two_image_body(400, 2))["meta_info"]
    again = _generate(on, two_image_body(400, 2))["meta_info"]
    other = _generate(on, two_image_body(401, 2))["meta_info"]
    assert again["cached_tokens"] >= first["prompt_tokens"] - 8
    assert other["cached_tokens"] < first["prompt_tokens"] - 8
