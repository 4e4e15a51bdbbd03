"""gpu-jpeg-decode against the real server on the tiny model: with SGLANG_GPU_IMAGE_DECODE=1 (deferred
decode; on CPU machines PIL in the model process) JPEG requests give the same greedy tokens as the
baseline server (switch 0) and as transformers on the same decoded images; the tokenizer defers, the
scheduler decodes, a PNG falls back; the prefix cache still matches the same image and only it."""

from __future__ import annotations

import io
import re
import uuid

import numpy as np
import pytest
import requests
from PIL import Image

from conftest import TEST_DEVICE, data_url

MAX_NEW = 12


def _jpeg(w: int, h: int, seed: int, subsampling: int = 2, orientation: int | None = None) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    arr = np.stack([255 * x / w, 255 * y / h, 128 + 90 * np.sin((x + y) / 9.0)], -1) + rng.normal(0, 8, (h, w, 3))
    save = {"quality": 90, "subsampling": subsampling}
    if orientation is not None:
        ex = Image.Exif()
        ex[0x0112] = orientation
        save["exif"] = ex.tobytes()
    buf = io.BytesIO()
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(buf, "JPEG", **save)
    return buf.getvalue()


CASES = {
    "one_420": [(200, 150, 1, 2, None)],
    "two_444_rotated": [(96, 160, 2, 0, 6), (256, 128, 3, 2, 3)],
}


def _request(case: str, text: str = "Describe:"):
    from sglang.srt.multimodal.image_io import load_image

    jpegs = [_jpeg(*spec) for spec in CASES[case]]
    api = [{"type": "text", "text": text}] + [
        {"type": "image_url", "image_url": {"url": data_url(j, "image/jpeg")}} for j in jpegs]
    tmpl = [{"type": "text", "text": text}] + [{"type": "image"} for _ in jpegs]
    return [{"role": "user", "content": api}], [{"role": "user", "content": tmpl}], [load_image(j) for j in jpegs]


def _chat(server, messages, max_tokens=MAX_NEW):
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def servers(launch_server):
    deferred = launch_server("--log-level", "info", env={"SGLANG_GPU_IMAGE_DECODE": "1"})
    baseline = launch_server(env={"SGLANG_GPU_IMAGE_DECODE": "0"})
    return deferred, baseline


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_equals_baseline_and_transformers(servers, hf_ref, case):
    deferred, baseline = servers
    api, tmpl, images = _request(case)
    a, b = _chat(deferred, api), _chat(baseline, api)
    if TEST_DEVICE == "cuda":  # nvJPEG pixels are close, not equal: agreement is measured, not required
        print(f"\n{case}: nvJPEG {a['choices'][0]['message']['content']!r} vs PIL {b['choices'][0]['message']['content']!r}")
        return
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    ref = hf_ref.greedy("jpeg-" + case, tmpl, images, MAX_NEW)
    assert a["choices"][0]["message"]["content"] == hf_ref.tokenizer.decode(ref, skip_special_tokens=True)
    assert a["usage"] == b["usage"]


def test_tokenizer_defers_scheduler_decodes_png_falls_back(servers):
    deferred, _ = servers
    png = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(png, "PNG")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "and this?"},
                                         {"type": "image_url", "image_url": {"url": data_url(png.getvalue())}}]}]
    _chat(deferred, msgs, 2)
    _chat(deferred, _request("one_420")[0], 2)
    log = deferred.log_path.read_text(errors="replace")
    tokenizer, scheduler = r"^\[[^\]]*\d\] INFO", r"^\[[^\]]* sglang-sched0\] INFO"
    assert re.search(tokenizer + r".*deferred image decode: deferred \(", log, re.M), log[-3000:]
    assert re.search(tokenizer + r".*deferred image decode: not a JPEG -> falls back", log, re.M), log[-3000:]
    decoder = "decoded nvjpeg" if TEST_DEVICE == "cuda" else "decoded pil"
    assert re.search(scheduler + rf".*deferred image decode: {decoder} \(", log, re.M), log[-3000:]
    info = requests.get(deferred.url + "/get_server_info", timeout=10).json()
    assert info["image_decode_tokenizer"].get("deferred", 0) >= 1, info
    assert info["image_decode_tokenizer"].get("not a JPEG", 0) >= 1, info
    assert info["image_decode_model"].get(decoder, 0) >= 1, info


def test_prefix_cache_matches_same_jpeg_only(servers):
    deferred, _ = servers
    text = f"Look ({uuid.uuid4().hex}):"

    def msgs(seed):
        return [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {
            "url": data_url(_jpeg(160, 160, seed), "image/jpeg")}}]}]

    first = _chat(deferred, msgs(50), 2)["usage"]
    second = _chat(deferred, msgs(50), 2)["usage"]
    other = _chat(deferred, msgs(51), 2)["usage"]
    assert second["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"] - 8
    assert other["prompt_tokens_details"]["cached_tokens"] < first["prompt_tokens"] - 8


def test_a_jpeg_broken_past_its_header_is_a_400_every_time(servers):
    """The tokenizer only read the header; the model process finds the scan data broken. The batch goes on
    (the image is a blank stand-in there), the request ends with a 400 naming the image, and nothing computed
    from the stand-in is cached: the same bytes again are a 400 again, not a prefix-cache hit."""
    deferred, _ = servers
    good = _jpeg(200, 150, 7)
    mid = (good.find(b"\xff\xda") + len(good)) // 2
    broken = good[:mid] + b"\xff\xc4\x00\x05\x77\x00\x00" + good[mid:]  # a bogus table inside the scan data
    text = f"What is this ({uuid.uuid4().hex})?"
    msgs = [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": data_url(broken, "image/jpeg")}}]}]
    body = {"model": "default", "messages": msgs, "max_tokens": 4, "temperature": 0}
    for _ in range(2):
        r = requests.post(deferred.url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 400, r.text
        assert "image 0 could not be decoded" in r.text
    info = requests.get(deferred.url + "/get_server_info", timeout=10).json()
    assert info["image_decode_model"].get("decode error", 0) >= 2, info
    assert info["available_kv_tokens"] == info["max_total_num_tokens"], info
    _chat(deferred, _request("one_420")[0], 2)  # the server serves on
