"""Encoder disaggregation (EPD) end to end: two `--encoder-only` servers and `--language-only` servers in
front of them (zmq_to_scheduler, the default, and zmq_to_tokenizer) on the tiny model. Greedy output equals
one ordinary server's and transformers' (one image, several, JPEGs sent compressed, video); one request's
images spread over both encoders; a repeated image is a prefix-cache hit; text never reaches an encoder;
bad input is a 400 at the language server. Last (they kill the encoders): an encoder killed under
concurrent load loses no request, and with both dead an image request is a 503 at once while text still
answers."""

from __future__ import annotations

import io
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from PIL import Image

from conftest import CASES, build_case, data_url, noise_image, png_bytes

MAX_NEW = 8
PLACEHOLDER = "Look: <|vision_start|><|image_pad|><|vision_end|>"


def jpeg_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def epd(launch_server):
    enc_a = launch_server("--encoder-only")
    enc_b = launch_server("--encoder-only")
    urls = [enc_a.url, enc_b.url]
    lang = launch_server("--language-only", "--encoder-urls", *urls, "--enable-vlm-stage-timer")
    lang_tok = launch_server("--language-only", "--encoder-urls", ",".join(urls),
                             "--encoder-transfer-backend", "zmq_to_tokenizer")
    normal = launch_server()
    servers = {"a": enc_a, "b": enc_b, "lang": lang, "lang_tok": lang_tok, "normal": normal}
    yield servers
    for s in servers.values():  # five servers: stopped with the module, not held to the session's end
        if s.proc.poll() is None:
            s.close()


def generate(server, text, images, max_new=MAX_NEW, status=200, timeout=120):
    r = requests.post(server.url + "/generate", timeout=timeout, json={
        "text": text, "image_data": [data_url(b, "image/jpeg" if b[:2] == b"\xff\xd8" else "image/png")
                                     for b in images],
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0}})
    assert r.status_code == status, r.text
    return r.json()


def encoder_requests(enc) -> int:
    return requests.get(enc.url + "/get_server_info", timeout=10).json()["num_requests"]


@pytest.mark.parametrize("case", ["one_image", "three_images_mixed_sizes"])
def test_greedy_equals_one_server_and_transformers(epd, hf_ref, case):
    _, tmpl, images = build_case(CASES[case])
    text, data = hf_ref.render(tmpl), [png_bytes(i) for i in images]
    ref = hf_ref.greedy(case, tmpl, images, MAX_NEW)
    want = generate(epd["normal"], text, data)
    assert want["output_ids"] == ref
    for name in ("lang", "lang_tok"):
        got = generate(epd[name], text, data)
        assert got["output_ids"] == ref, name
        assert got["meta_info"]["prompt_tokens"] == want["meta_info"]["prompt_tokens"]
        info = requests.get(epd[name].url + "/get_server_info", timeout=10).json()
        # what ran: every item's embeddings came from the encoders, none went through a tower here
        assert info["mm_items_from_encoders"] >= len(data) and info["mm_items_through_tower"] == 0, name
    assert requests.get(epd["normal"].url + "/get_server_info", timeout=10).json()["mm_items_through_tower"] >= len(data)


def test_jpegs_travel_compressed_and_answer_the_same(epd, hf_ref):
    images = [noise_image(96, 64, 11), noise_image(130, 90, 12), noise_image(64, 160, 13)]
    tmpl = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "image"},
                                         {"type": "text", "text": "Which differ?"}]}]
    text, data = hf_ref.render(tmpl), [jpeg_bytes(i) for i in images]
    before = encoder_requests(epd["a"]), encoder_requests(epd["b"])
    want = generate(epd["normal"], text, data)["output_ids"]
    got = generate(epd["lang"], text, data)
    assert got["output_ids"] == want
    after = encoder_requests(epd["a"]), encoder_requests(epd["b"])
    assert after[0] > before[0] and after[1] > before[1], "one request's images spread over both encoders"
    info = requests.get(epd["lang"].url + "/get_server_info", timeout=10).json()
    assert info["encoder_transfer_backend"] == "zmq_to_scheduler"
    assert {u: (e["outstanding_patches"], e["healthy"]) for u, e in info["encoders"].items()} == {
        epd["a"].url: (0, True), epd["b"].url: (0, True)}
    timings = got["meta_info"]["stage_timings_ms"]
    assert timings["epd_encode"] > 0 and "epd_transfer" in timings and "llm_prefill" in timings
    assert generate(epd["lang_tok"], text, data)["output_ids"] == want


def test_video_answers_like_one_server(epd):
    av = pytest.importorskip("av")  # noqa: F841
    from sglang.testing.sample_video import make_clip

    clip = make_clip(96, 64, 10, 2.0, seed=1)
    msgs = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data_url(clip, "video/mp4")}},
                                         {"type": "image_url", "image_url": {"url": data_url(png_bytes(noise_image(64, 64, 3)))}},
                                         {"type": "text", "text": "What happens?"}]}]
    body = {"model": "m", "messages": msgs, "max_tokens": MAX_NEW, "temperature": 0}
    outs = []
    for name in ("normal", "lang", "lang_tok"):
        r = requests.post(epd[name].url + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        outs.append((r.json()["choices"][0]["message"]["content"], r.json()["usage"]))
    assert outs[1] == outs[0] and outs[2] == outs[0]


def test_same_image_is_a_prefix_cache_hit_and_text_skips_encoders(epd, hf_ref):
    _, tmpl, images = build_case(CASES["image_before_text"])
    text, data = hf_ref.render(tmpl), [png_bytes(i) for i in images]
    first = generate(epd["lang"], text, data)
    again = generate(epd["lang"], text, data)
    assert again["output_ids"] == first["output_ids"]
    assert again["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] - 2
    other = generate(epd["lang"], text, [png_bytes(noise_image(128, 96, 99))])
    assert other["meta_info"]["cached_tokens"] < again["meta_info"]["cached_tokens"] - 8  # another image: no hit
    before = encoder_requests(epd["a"]) + encoder_requests(epd["b"])
    generate(epd["lang"], "Just text, please.", [])
    assert encoder_requests(epd["a"]) + encoder_requests(epd["b"]) == before


@pytest.mark.parametrize("name", ["lang", "lang_tok"])
def test_bad_images_are_400s_at_the_language_server(epd, name):
    good = jpeg_bytes(noise_image(96, 96, 5))
    broken_jpeg = good[: len(good) // 2] + b"\x00" * 64  # header intact: passes the tokenizer, breaks the decode
    for image_url, what in [
        ("data:image/png;base64,!!!notbase64", "base64"),
        (data_url(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "image/png"), "png"),
        (data_url(broken_jpeg, "image/jpeg"), "jpeg"),
    ]:
        body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": "?"}]}]}
        r = requests.post(epd[name].url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, (what, r.status_code, r.text)
    assert generate(epd[name], PLACEHOLDER, [png_bytes(noise_image(64, 64, 1))], max_new=2)["output_ids"]


def test_every_listener_binds_the_host_it_was_told(epd):
    """Launched with the default --host 127.0.0.1, no process of any role listens beyond loopback (on a018ab2
    the language servers' embedding port bound every interface); the HTTP port and, on the language
    servers, the embedding port are among the listeners."""
    from sglang.srt.utils.process_tree import listening_tcp

    for name, server in epd.items():
        found = listening_tcp(server.proc.pid)
        assert ("127.0.0.1", server.port) in found, (name, found)
        assert all(addr == "127.0.0.1" for addr, _ in found), (name, found)
        if name.startswith("lang"):
            assert len(found) >= 2, (name, found)  # the embedding port as well


def test_an_encoder_killed_under_load_loses_no_request(epd, hf_ref):
    lang, a = epd["lang"], epd["a"]
    tmpl = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}]
    text = hf_ref.render(tmpl)
    base = encoder_requests(a)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(generate, lang, text, [png_bytes(noise_image(160, 160, 1000 + i))], 4)
                   for i in range(12)]
        deadline = time.monotonic() + 60
        while encoder_requests(a) == base:  # the load reached encoder a
            assert time.monotonic() < deadline and not all(f.done() for f in futures)
            time.sleep(0.02)
        a.proc.send_signal(signal.SIGKILL)
        outs = [f.result(timeout=120) for f in futures]
    assert all(len(o["output_ids"]) == 4 for o in outs)
    a.proc.wait(10)
    # one more: a dead encoder that did not fail a call yet is first in line (idle, listed first), so it fails now
    assert generate(lang, text, [png_bytes(noise_image(96, 96, 999))], 2)["output_ids"]
    info = requests.get(lang.url + "/get_server_info", timeout=10).json()["encoders"]
    assert info[a.url]["failures"] >= 1 and info[a.url]["outstanding_patches"] == 0, info


def test_with_every_encoder_dead_images_get_503_fast_and_text_answers(epd):
    epd["a"].proc.kill()
    epd["b"].proc.send_signal(signal.SIGKILL)
    epd["a"].proc.wait(10)
    epd["b"].proc.wait(10)
    for name in ("lang", "lang_tok"):
        t0 = time.monotonic()
        body = {"text": PLACEHOLDER, "sampling_params": {"max_new_tokens": 2},
                "image_data": [data_url(png_bytes(noise_image(64, 64, 7)))]}
        r = requests.post(epd[name].url + "/generate", json=body, timeout=30)
        assert r.status_code == 503 and "no encoder could encode" in r.text, r.text
        assert time.monotonic() - t0 < 30  # refused connections: not the 60 s encoder timeout
        assert generate(epd[name], "text still works", [], max_new=2)["output_ids"]
        assert requests.get(epd[name].url + "/health", timeout=10).status_code == 200

