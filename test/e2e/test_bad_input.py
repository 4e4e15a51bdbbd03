"""Every bad request answers 4xx with an OpenAI-style error naming the problem, and the server keeps
serving; a dead scheduler makes the server answer 503 and exit, leaving nothing behind."""

from __future__ import annotations

import base64
import io
import os
import signal
import threading
import uuid

import pytest
import requests
from PIL import Image

from conftest import data_url, noise_image, png_bytes, pid_alive, wait_until

PNG = png_bytes(noise_image(64, 64, 3))


def image_msg(url: str, text: str = "what is this?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]}]


def chat_body(**kw) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    body.update(kw)
    return body


def bomb_png() -> bytes:
    buf = io.BytesIO()
    Image.new("1", (10000, 10000)).save(buf, format="PNG")  # 100 Mpixel, a few kB compressed
    return buf.getvalue()


def bad_requests(media_server, outside_image) -> dict[str, tuple[object, str]]:
    """name -> (chat body, or raw bytes, or ("generate", body)), and a phrase the error must contain."""
    return {
        "invalid_json": (b'{"model": "x", "messages": [', "invalid JSON"),
        "body_not_object": (b"[1, 2]", "JSON object"),
        "missing_messages": ({"model": "x"}, "messages"),
        "bad_role": (chat_body(messages=[{"role": "robot", "content": "hi"}]), "role"),
        "bad_part_type": (chat_body(messages=[{"role": "user", "content": [{"type": "audio", "audio": "x"}]}]), "audio"),
        "corrupt_image": (chat_body(messages=image_msg(data_url(PNG[: len(PNG) // 2]))), "truncated"),
        "bad_base64": (chat_body(messages=image_msg("data:image/png;base64,!!!not*base64!!!")), "base64"),
        "unsupported_format": (chat_body(messages=image_msg(data_url(b"%PDF-1.4 not an image at all"))), "format"),
        "decompression_bomb": (chat_body(messages=image_msg(data_url(bomb_png()))), "too large"),
        "extreme_aspect_ratio": (chat_body(messages=image_msg(data_url(png_bytes(noise_image(1, 400, 0))))), "aspect ratio"),
        "too_many_images": (
            chat_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(PNG)}}] * 5}]),
            "too many images",
        ),
        "prompt_longer_than_context": (chat_body(messages=[{"role": "user", "content": "word " * 5000}]),
                                       "is longer than the model's context length"),
        "max_tokens_negative": (chat_body(max_tokens=-5), "max_tokens must be at least 0"),
        "max_completion_tokens_negative": (chat_body(max_tokens=None, max_completion_tokens=-1), "max_completion_tokens"),
        "max_tokens_over_context": (chat_body(max_tokens=5000), "Requested token count exceeds the model's maximum context"),
        "temperature_negative": (chat_body(temperature=-1), "temperature"),
        "top_p_zero": (chat_body(top_p=0), "top_p"),
        "top_k_zero": (chat_body(top_k=0), "top_k"),
        "n_too_large": (chat_body(n=100), "n must be"),
        "top_logprobs_too_many": (chat_body(logprobs=True, top_logprobs=50), "top_logprobs_num"),
        "penalty_out_of_range": (chat_body(presence_penalty=5), "presence_penalty"),
        "local_path_outside_allowlist": (chat_body(messages=image_msg(str(outside_image))), "outside the allowed"),
        "file_url_outside_allowlist": (chat_body(messages=image_msg(f"file://{outside_image}")), "outside the allowed"),
        "url_404": (chat_body(messages=image_msg(media_server.url + "/missing.png")), "404"),
        "url_too_large": (chat_body(messages=image_msg(media_server.url + "/big.bin")), "too large"),
        "url_timeout": (chat_body(messages=image_msg(media_server.url + "/slow")), "timed out"),
        "generate_no_prompt": (("generate", {"sampling_params": {}}), "text"),
        "generate_unknown_sampling_param": (("generate", {"text": "hi", "sampling_params": {"temprature": 0}}), "temprature"),
        "generate_token_out_of_vocab": (("generate", {"input_ids": [1, 10**9]}), "vocabulary"),
        "generate_placeholder_without_image": (("generate", {"text": "<|vision_start|><|image_pad|><|vision_end|>"}), "placeholder"),
        "generate_long_input_ids": (("generate", {"input_ids": [100] * 4096}), "is longer than the model's context length"),
        "generate_max_new_tokens_negative": (("generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}}),
                                             "max_new_tokens must be a non-negative integer"),
        "logit_bias_out_of_vocab": (chat_body(logit_bias={"999999999": 1}), "outside the vocabulary"),
        "logit_bias_too_large": (chat_body(logit_bias={"5": 500}), "logit_bias"),
        "generate_logprob_start_len_negative": (("generate", {"text": "hi", "return_logprob": True, "logprob_start_len": -2}),
                                                "logprob_start_len"),
    }


def _case_names() -> list[str]:
    class _NoServer:
        url = "http://127.0.0.1:1"

    return sorted(bad_requests(_NoServer(), "/nonexistent.png"))


@pytest.mark.parametrize("name", _case_names())
def test_bad_request_answers_400_naming_the_problem(server, media_server, outside_image, name):
    body, phrase = bad_requests(media_server, outside_image)[name]
    path = "/v1/chat/completions"
    if isinstance(body, tuple):
        path, body = "/" + body[0], body[1]
    kw = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    r = requests.post(server.url + path, timeout=60, **kw)
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert phrase.lower() in err["message"].lower(), err["message"]
    assert err["code"] == 400 and err["type"] == "invalid_request_error"


def test_the_image_limit_answers_before_any_fetch(server, client, media_server):
    """One image over --limit-mm-per-prompt (4 here), one of them a URL that would fail (404): the answer is
    the limit's 400, and the URL was never asked for; within the limit the same URL is fetched (its 404)."""
    path = f"/limit-{uuid.uuid4().hex}.png"
    urls = [data_url(PNG)] * 4 + [media_server.url + path]
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    r = requests.post(server.url + "/v1/chat/completions", timeout=60,
                      json=chat_body(messages=[{"role": "user", "content": content}]))
    assert r.status_code == 400, r.text
    assert "too many images: 5 given, at most 4" in r.json()["error"]["message"]
    assert "--limit-mm-per-prompt" in r.json()["error"]["message"]
    assert path not in media_server.paths
    r = requests.post(server.url + "/v1/chat/completions", timeout=60,
                      json=chat_body(messages=[{"role": "user", "content": content[1:]}]))
    assert r.status_code == 400 and "404" in r.json()["error"]["message"], r.text
    assert path in media_server.paths  # within the limit it is fetched: the check above is what stopped it
    ok = client.chat.completions.create(model="default", max_tokens=2, temperature=0, messages=image_msg(data_url(PNG)))
    assert ok.usage.completion_tokens >= 1


def test_server_keeps_serving_after_bad_input(server, client, media_server, media_dir):
    requests.post(server.url + "/v1/chat/completions", data=b"{", timeout=30)
    ok = client.chat.completions.create(
        model="default", max_tokens=3, temperature=0,
        messages=image_msg(media_server.url + "/img.png"),
    )
    assert ok.usage.completion_tokens >= 1
    for src in (str(media_dir / "allowed.png"), f"file://{media_dir / 'allowed.png'}", base64.b64encode(PNG).decode()):
        r = client.chat.completions.create(model="default", max_tokens=2, temperature=0, messages=image_msg(src))
        assert r.usage.prompt_tokens > 16
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


def test_oversized_body_is_413_and_the_server_keeps_serving(server):
    big = b'{"text": "' + b"x" * (5 * 2**20) + b'"}'
    r = requests.post(server.url + "/generate", data=big, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("Payload Too Large: ") and "--max-request-body-mb" in message

    def chunks():  # no Content-Length: the cap is enforced while reading
        for _ in range(6):
            yield b"y" * 2**20

    r = requests.post(server.url + "/v1/chat/completions", data=chunks(), timeout=60)
    assert r.status_code == 413, r.text
    ok = requests.post(server.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=60)
    assert ok.status_code == 200


def test_dead_scheduler_fails_fast(launch_server, media_dir, media_server):
    s = launch_server()
    # By default an image URL on a loopback (or private) address is refused: no proxying into our network.
    r = requests.post(s.url + "/v1/chat/completions", json=chat_body(messages=image_msg(media_server.url + "/img.png")),
                      timeout=30)
    assert r.status_code == 400 and "loopback" in r.json()["error"]["message"], r.text
    # Without --allowed-local-media-path, local files are refused (with a message saying how to enable them).
    r = requests.post(s.url + "/v1/chat/completions", json=chat_body(messages=image_msg(str(media_dir / "allowed.png"))), timeout=30)
    assert r.status_code == 400 and "--allowed-local-media-path" in r.json()["error"]["message"]

    pending: dict = {}

    def long_request():
        body = {"text": "keep going", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
        try:
            pending["response"] = requests.post(s.url + "/generate", json=body, timeout=60)
        except requests.RequestException as e:
            pending["error"] = e

    t = threading.Thread(target=long_request)
    t.start()
    wait_until(lambda: requests.get(s.url + "/get_server_info", timeout=10).json()["num_running_reqs"] == 1, 30,
               what="the long request to run")
    os.kill(s.pid_of("sglang-sched0"), signal.SIGKILL)

    def unhealthy_or_gone():
        try:
            return requests.get(s.url + "/health", timeout=2).status_code == 503
        except requests.ConnectionError:
            return True

    wait_until(unhealthy_or_gone, 10, what="/health to answer 503")
    t.join(30)
    assert not t.is_alive()
    assert pending["response"].status_code == 503, pending
    assert "exited unexpectedly" in pending["response"].json()["error"]["message"]
    assert s.proc.wait(30) == 1, s.log_tail()
    s.assert_clean()
    assert not pid_alive(s.pid_of("sglang-detok"))


def test_unknown_and_unimplemented_fields_are_400s_naming_them(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: temprature"):
        client.chat.completions.create(model="default", messages=msgs, max_tokens=2, extra_body={"temprature": 0.1})
    with pytest.raises(openai.BadRequestError, match="lora_path: LoRA adapters are not supported"):
        client.completions.create(model="default", prompt="hi", max_tokens=2, extra_body={"lora_path": "a"})
    r = requests.post(server.url + "/generate", json={"text": "hi", "return_hidden_states": True}, timeout=30)
    assert r.status_code == 400 and "return_hidden_states" in r.json()["error"]["message"]
    ok = client.chat.completions.create(model="default", messages=msgs, max_tokens=2, store=False)  # a default: accepted
    assert ok.choices[0].finish_reason in ("stop", "length")
