"""Prompt-only scoring and the context-length rules on the launched server (tiny model):
`max_new_tokens: 0` / `max_tokens: 0` run the prefill only and answer the prompt's logprobs with no
output token and finish reason "length" (native, completions with echo, chat, streaming), freeing
their KV; prompt + max_tokens over the context length is upstream's 400, word for word, while a
request that fits exactly runs and a default budget is clamped."""

from __future__ import annotations

import json

import pytest
import requests

from conftest import wait_until

PROMPT = "The capital of France is Paris, and the capital of Italy is"


def post(server, path, body, status=200):
    r = requests.post(server.url + path, json=body, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def idle(server) -> bool:
    info = requests.get(server.url + "/get_server_info", timeout=10).json()
    return (info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
            and info["available_kv_tokens"] == info["max_total_num_tokens"])


def context_length(server) -> int:
    return requests.get(server.url + "/model_info", timeout=10).json()["context_length"]


def test_generate_with_zero_new_tokens_returns_the_prompt_logprobs_only(server):
    body = {"text": PROMPT, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}
    out = post(server, "/generate", {**body, "sampling_params": {"max_new_tokens": 0}})
    meta = out["meta_info"]
    assert out["text"] == "" and out["output_ids"] == []
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 0
    assert meta.get("output_token_logprobs", []) == []
    one = post(server, "/generate", {**body, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    ref = one["meta_info"]["input_token_logprobs"]
    got = meta["input_token_logprobs"]
    assert len(got) == meta["prompt_tokens"] == len(ref) and got[0][0] is None
    assert [t for _, t, _ in got] == [t for _, t, _ in ref]
    assert [lp for lp, _, _ in got[1:]] == pytest.approx([lp for lp, _, _ in ref[1:]], abs=1e-5)
    assert len(meta["input_top_logprobs"]) == len(got)
    wait_until(lambda: idle(server), 30, what="the scoring requests' KV to be freed")


def test_zero_new_tokens_streams_one_final_chunk_and_batches_with_generating_prompts(server):
    body = {"text": PROMPT, "stream": True, "return_logprob": True, "logprob_start_len": 3,
            "sampling_params": {"max_new_tokens": 0}}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    last = json.loads(lines[-2])
    assert last["text"] == "" and last["meta_info"]["finish_reason"]["type"] == "length"
    assert len(last["meta_info"]["input_token_logprobs"]) == last["meta_info"]["prompt_tokens"] - 3
    out = post(server, "/generate", {"text": [PROMPT, "Count: one two"],
                                     "sampling_params": [{"max_new_tokens": 0}, {"max_new_tokens": 3, "ignore_eos": True}]})
    assert [o["meta_info"]["completion_tokens"] for o in out] == [0, 3]
    assert [o["meta_info"]["finish_reason"]["type"] for o in out] == ["length", "length"]
    wait_until(lambda: idle(server), 30, what="KV freed")


def test_completions_echo_with_zero_max_tokens_scores_the_prompt(server, client):
    resp = client.completions.create(model="default", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = resp.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 0 and resp.usage.prompt_tokens == len(choice.logprobs.tokens)
    assert "".join(choice.logprobs.tokens) == PROMPT and choice.logprobs.token_logprobs[0] is None
    assert all(lp < 0 for lp in choice.logprobs.token_logprobs[1:])
    chunks = list(client.completions.create(model="default", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1,
                                            stream=True))
    streamed = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.text for c in streamed) == PROMPT and streamed[-1].finish_reason == "length"
    assert [t for c in streamed if c.logprobs for t in c.logprobs.token_logprobs] == choice.logprobs.token_logprobs
    chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    assert chat.choices[0].message.content == "" and chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 0
    wait_until(lambda: idle(server), 30, what="KV freed")


def test_prompt_plus_max_tokens_over_the_context_is_upstreams_400(server, client):
    c = context_length(server)
    msg = "Requested token count exceeds the model's maximum context length of"
    ids = [100] * (c - 3)
    err = post(server, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}}, 400)["error"]
    assert err["message"] == (
        f"{msg} {c} tokens. You requested a total of {c + 1} tokens: {c - 3} tokens from the input messages and 4 "
        "tokens for the completion. Please reduce the number of tokens in the input messages or the completion to "
        "fit within the limit.")
    fits = post(server, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    assert fits["meta_info"]["completion_tokens"] == 3 and fits["meta_info"]["finish_reason"]["type"] == "length"
    clamped = post(server, "/generate", {"input_ids": ids, "sampling_params": {"ignore_eos": True}})  # default 128
    assert clamped["meta_info"]["completion_tokens"] == 3
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": c}),
                       ("/v1/completions", {"prompt": "hi", "max_tokens": c})):
        err = post(server, path, {"model": "default", **body}, 400)["error"]
        assert err["message"].startswith(f"{msg} {c} tokens.") and err["code"] == 400
    err = post(server, "/generate", {"input_ids": [100] * c, "sampling_params": {"max_new_tokens": 0}}, 400)["error"]
    assert err["message"] == f"The input ({c} tokens) is longer than the model's context length ({c} tokens)."
    wait_until(lambda: idle(server), 30, what="KV freed")
