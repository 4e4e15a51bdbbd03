"""/v1/chat/completions with the real openai client against the launched server on the tiny model:
greedy parity with transformers (also with chunked prefill splitting images and without the radix
cache), streaming, usage, stop strings, concurrency, image-aware prefix caching and client aborts."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
import uuid

import pytest
import requests

from conftest import CASES, build_case, noise_image, png_bytes, data_url, wait_until

MAX_NEW = 12


def chat(client, messages, **kw):
    kw.setdefault("max_tokens", MAX_NEW)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model="default", messages=messages, **kw)


@pytest.fixture(scope="module", params=["default", "chunked16", "noradix"])
def parity_server(request, server, launch_server):
    if request.param == "default":
        yield server
        return
    args = {"chunked16": ("--chunked-prefill-size", "16"), "noradix": ("--disable-radix-cache",)}[request.param]
    s = launch_server(*args)
    yield s
    # Ctrl-C shuts down cleanly (SIGTERM: the session's other servers); after a SIGKILL of the server
    # the children exit by themselves. Either way no child process, ipc dir or shm segment is left.
    s.close(signal.SIGINT if request.param == "chunked16" else signal.SIGKILL)


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_chat_matches_transformers(parity_server, hf_ref, case):
    import openai

    client = openai.OpenAI(base_url=parity_server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    api_msgs, tmpl_msgs, images = build_case(CASES[case])
    ref_ids = hf_ref.greedy(case, tmpl_msgs, images, MAX_NEW)
    resp = chat(client, api_msgs)
    assert resp.choices[0].message.content == hf_ref.tokenizer.decode(ref_ids, skip_special_tokens=True)
    assert resp.usage.completion_tokens == len(ref_ids)
    # The same request twice: the second one runs from the prefix cache (when enabled) and must agree.
    again = chat(client, api_msgs)
    assert again.choices[0].message.content == resp.choices[0].message.content


def test_chunk_boundaries_fall_inside_images(hf_ref):
    """Guards the chunked16 variant above: with 16-token chunks, prefill chunks split image token ranges."""
    for case in ("one_image", "three_images_mixed_sizes"):
        _, tmpl, images = build_case(CASES[case])
        _, mm = hf_ref.prompt(tmpl, images)
        assert any((s // 16) != ((e - 1) // 16) for it in mm.mm_items for s, e in it.offsets)


@pytest.mark.parametrize("case", ["text_only", "one_image"])
def test_stream_equals_non_stream_and_usage(client, hf_ref, case):
    api_msgs, tmpl_msgs, images = build_case(CASES[case])
    full = chat(client, api_msgs)
    chunks = list(chat(client, api_msgs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [full.choices[0].finish_reason] and finals[0] in ("stop", "length")
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    prompt_ids, _ = hf_ref.prompt(tmpl_msgs, images)
    for usage in (full.usage, usage_chunk.usage):
        assert usage.prompt_tokens == len(prompt_ids)
        assert usage.completion_tokens == len(hf_ref.greedy(case, tmpl_msgs, images, MAX_NEW))
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_max_completion_tokens_and_length_finish(client):
    resp = chat(client, [{"role": "user", "content": "count"}], max_tokens=None, max_completion_tokens=3,
                extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == 3
    assert resp.choices[0].finish_reason == "length"


def test_stop_string_trims_output_stream_and_not(client):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something long."},
            {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Go on " + uuid.uuid4().hex}]
    base = chat(client, msgs, max_tokens=24, extra_body={"ignore_eos": True}).choices[0].message.content
    stop = next(base[i:i + 2] for i in range(4, len(base) - 2) if base[i:i + 2].strip() and "\ufffd" not in base[i:i + 2])
    expected = base[: base.find(stop)]
    resp = chat(client, msgs, max_tokens=24, stop=[stop], extra_body={"ignore_eos": True})
    assert resp.choices[0].message.content == expected
    assert resp.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       chat(client, msgs, max_tokens=24, stop=stop, stream=True, extra_body={"ignore_eos": True}))
    assert streamed == expected


def test_32_concurrent_requests(server):
    import openai

    async def run():
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
        img = data_url(png_bytes(noise_image(96, 96, 42)))

        def messages(i):
            if i % 2:
                return [{"role": "user", "content": f"request {i}: tell me about number {i * 7}"}]
            return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": img}},
                                                 {"type": "text", "text": f"request {i}"}]}]

        try:
            return await asyncio.gather(*(
                aclient.chat.completions.create(model="default", messages=messages(i), max_tokens=8, temperature=0)
                for i in range(32)
            ))
        finally:
            await aclient.close()

    results = asyncio.run(run())
    assert len(results) == 32
    for r in results:
        assert r.choices[0].finish_reason in ("stop", "length")
        assert 1 <= r.usage.completion_tokens <= 8


def test_cached_tokens_cover_same_image_only(client, hf_ref):
    text = f"Look closely ({uuid.uuid4().hex}):"
    img_a, img_b = noise_image(128, 128, 100), noise_image(128, 128, 101)

    def msgs(img):
        return [{"role": "user", "content": [{"type": "text", "text": text},
                                             {"type": "image_url", "image_url": {"url": data_url(png_bytes(img))}}]}]

    first = chat(client, msgs(img_a), max_tokens=2)
    second = chat(client, msgs(img_a), max_tokens=2)
    other = chat(client, msgs(img_b), max_tokens=2)
    ids, mm = hf_ref.prompt([{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image"}]}], [img_a])
    img_start, img_end = mm.mm_items[0].offsets[0]
    assert first.usage.prompt_tokens_details.cached_tokens < img_start
    assert second.usage.prompt_tokens_details.cached_tokens >= img_end
    assert 0 < other.usage.prompt_tokens_details.cached_tokens <= img_start


# ----------------------------------------------------------------------------- client disconnects
def _server_info(server) -> dict:
    return requests.get(server.url + "/get_server_info", timeout=10).json()


def _idle(server, max_tokens: int):
    info = _server_info(server)
    return info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0 and info["available_kv_tokens"] == max_tokens


def test_stream_disconnect_aborts_and_frees_kv(server):
    total = _server_info(server)["max_total_num_tokens"]
    wait_until(lambda: _idle(server, total), 30, what="an idle server")
    body = {"model": "default", "messages": [{"role": "user", "content": "never stop " + uuid.uuid4().hex}],
            "max_tokens": 4000, "temperature": 0, "ignore_eos": True, "stream": True}
    with requests.post(server.url + "/v1/chat/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        start = time.monotonic()
        n = 0
        while n < 6:
            if next(lines).startswith(b"data: "):
                n += 1
        rate = n / (time.monotonic() - start)  # chunks per second while decoding
        running = _server_info(server)
        assert running["num_running_reqs"] == 1 and running["available_kv_tokens"] < total
    closed = time.monotonic()
    wait_until(lambda: _idle(server, total), 30, what="KV slots freed after the client went away")
    # The request had thousands of tokens left: only an abort frees it this early.
    assert time.monotonic() - closed < 0.5 * (4000 - n) / rate


def test_non_stream_disconnect_aborts_and_frees_kv(server):
    total = _server_info(server)["max_total_num_tokens"]
    wait_until(lambda: _idle(server, total), 30, what="an idle server")
    start = time.monotonic()
    requests.post(server.url + "/generate", json={"text": "warm", "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}}, timeout=60)
    rate = 100 / (time.monotonic() - start)  # decode tokens per second (a lower bound)
    body = json.dumps({"text": "never stop " + uuid.uuid4().hex,
                       "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: _server_info(server)["num_running_reqs"] == 1, 30, what="the request to run")
    closed = time.monotonic()
    wait_until(lambda: _idle(server, total), 30, what="KV slots freed after the client went away")
    assert time.monotonic() - closed < 0.5 * 4000 / rate
