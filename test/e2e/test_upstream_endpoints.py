"""Upstream SGLang's endpoints on the launched server (tiny model): /v1/completions (with the openai
client: text and token-id prompts, stream and not, stop strings, usage, refused parameters),
/v1/models/{model}, /health_generate, /model_info and /server_info, /abort_request ending a
running request by its id without leaking KV slots, and upstream 0.5.23's smaller routes: PUT
/generate, /, /ping, /ready, `version`, /tokenize and /detokenize, /start_profile and /stop_profile
around one request."""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from pathlib import Path

import openai
import pytest
import requests

from conftest import wait_until
from sglang.srt.environ import envs

MAX_NEW = 10


def complete(client, **kw):
    kw.setdefault("model", "default")
    kw.setdefault("max_tokens", MAX_NEW)
    kw.setdefault("temperature", 0)
    return client.completions.create(**kw)


def generate(server, **body):
    r = requests.post(server.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def server_info(server) -> dict:
    return requests.get(server.url + "/get_server_info", timeout=10).json()


def idle(server) -> bool:
    info = server_info(server)
    return (info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
            and info["available_kv_tokens"] == info["max_total_num_tokens"])


# ----------------------------------------------------------------------------- /v1/completions
def test_completion_matches_generate_stream_and_usage(server, client):
    prompt = "Once upon a time " + uuid.uuid4().hex[:8]
    ref = generate(server, text=prompt, sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0})
    resp = complete(client, prompt=prompt)
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    assert resp.choices[0].text == ref["text"] and resp.choices[0].index == 0
    assert resp.choices[0].finish_reason == "length"
    meta = ref["meta_info"]
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (meta["prompt_tokens"], MAX_NEW)
    assert resp.usage.total_tokens == meta["prompt_tokens"] + MAX_NEW

    chunks = list(complete(client, prompt=prompt, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref["text"]
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and set(finals[:-1]) <= {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == resp.usage.total_tokens

    by_ids = complete(client, prompt=ref_ids(server, prompt))
    assert by_ids.choices[0].text == ref["text"] and by_ids.usage.prompt_tokens == meta["prompt_tokens"]


def ref_ids(server, prompt: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(server.model_dir).encode(prompt, add_special_tokens=False)


def test_completion_echo_with_logprobs_scores_the_prompt_like_an_eval_harness(server, client):
    prompt = "The capital of France is"
    ids = ref_ids(server, prompt)
    scored = generate(server, text=prompt, return_logprob=True, logprob_start_len=0,
                      sampling_params={"max_new_tokens": 1, "temperature": 0})
    ref = scored["meta_info"]["input_token_logprobs"]
    # the loglikelihood request of lm-eval's completions backend
    resp = complete(client, prompt=prompt, max_tokens=1, logprobs=1, echo=True)
    choice = resp.choices[0]
    assert choice.text == prompt + scored["text"]
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 1 and "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1 : len(ids)] == [r[0] for r in ref[1:]]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(len(lp.tokens))]
    by_ids = complete(client, prompt=ids, max_tokens=1, echo=True)  # echo without logprobs: text only
    assert by_ids.choices[0].text == choice.text and by_ids.choices[0].logprobs is None
    chunks = list(complete(client, prompt=prompt, max_tokens=3, logprobs=1, echo=True, stream=True))
    streamed = [c.choices[0] for c in chunks if c.choices]
    assert streamed[0].text.startswith(prompt) and "".join(c.text for c in streamed).startswith(prompt + scored["text"])
    offsets = [o for c in streamed if c.logprobs for o in c.logprobs.text_offset]
    tokens = [t for c in streamed if c.logprobs for t in c.logprobs.tokens]
    assert offsets == [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))] and len(tokens) == len(ids) + 3


def test_completion_list_of_prompts_numbers_choices_prompt_major(server, client):
    prompts = ["The sky is", "Count: one two"]
    singles = [complete(client, prompt=p, max_tokens=4) for p in prompts]
    resp = complete(client, prompt=prompts, max_tokens=4, n=2, echo=True)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    for i, c in enumerate(resp.choices):
        assert c.text == prompts[i // 2] + singles[i // 2].choices[0].text  # greedy: both samples agree
    assert resp.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert resp.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)
    by_ids = complete(client, prompt=[ref_ids(server, p) for p in prompts], max_tokens=4)
    assert [c.text for c in by_ids.choices] == [s.choices[0].text for s in singles]
    text = {0: "", 1: ""}
    for chunk in complete(client, prompt=prompts, max_tokens=4, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            text[c.index] += c.text
        if chunk.usage is not None:
            assert chunk.usage.prompt_tokens == resp.usage.prompt_tokens
    assert [text[0], text[1]] == [s.choices[0].text for s in singles]


def test_completion_stop_string_stream_and_not(client):
    prompt = "List some words: " + uuid.uuid4().hex[:8]
    base = complete(client, prompt=prompt, max_tokens=24, extra_body={"ignore_eos": True}).choices[0].text
    stop = next(base[i:i + 2] for i in range(4, len(base) - 2) if base[i:i + 2].strip() and "\ufffd" not in base[i:i + 2])
    expected = base[: base.find(stop)]
    resp = complete(client, prompt=prompt, max_tokens=24, stop=[stop], extra_body={"ignore_eos": True})
    assert resp.choices[0].text == expected and resp.choices[0].finish_reason == "stop"
    chunks = list(complete(client, prompt=prompt, max_tokens=24, stop=stop, stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens < 24


@pytest.mark.parametrize("kw, word", [({"n": 0}, "n must be"),
                                      ({"best_of": 2}, "best_of"), ({"suffix": "end"}, "suffix"),
                                      ({"prompt": []}, "prompt is empty")])
def test_completion_unsupported_parameter_is_400_naming_it(client, kw, word):
    kw.setdefault("prompt", "hello")
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, **kw)
    assert e.value.status_code == 400 and word in e.value.body["message"]


# ----------------------------------------------------------------------------- models, health, info
def test_retrieve_model_and_unknown_model_is_404(server, client):
    served = client.models.list().data[0].id
    card = client.models.retrieve(served)
    assert card.id == served and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    r = requests.get(server.url + "/v1/models/no-such-model", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404 and "no-such-model" in r.json()["error"]["message"]


def test_health_generate(server):
    start = time.monotonic()
    r = requests.get(server.url + "/health_generate", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert time.monotonic() - start < 20
    wait_until(lambda: idle(server), 30, what="the probe to leave nothing behind")


def test_model_info_and_server_info_equal_the_old_routes(server):
    assert requests.get(server.url + "/model_info", timeout=10).json() == \
        requests.get(server.url + "/get_model_info", timeout=10).json()
    wait_until(lambda: idle(server), 30, what="an idle server")
    assert requests.get(server.url + "/server_info", timeout=10).json() == server_info(server)


def test_get_load_counts_a_running_request(server):
    """Upstream's /get_load (what sglang-router polls): one entry per replica, the running request and its
    KV tokens counted while it runs, nothing once it is gone."""
    wait_until(lambda: idle(server), 30, what="an idle server")
    (idle_load,) = requests.get(server.url + "/get_load", timeout=10).json()
    idle_load_tic = idle_load.pop("ts_tic")
    assert isinstance(idle_load_tic, float)  # upstream's newer fields: the measuring time ...
    assert idle_load == {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0,
                         "num_pending_tokens": 0}  # ... and the prompt tokens still to prefill
    body = {"text": "keep going", "stream": True, "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=60) as r:
        lines = (ln for ln in r.iter_lines() if ln.startswith(b"data: "))
        next(lines)  # decoding now
        (load,) = requests.get(server.url + "/get_load", timeout=10).json()
        assert load["num_reqs"] == 1 and load["num_waiting_reqs"] == 0 and load["num_tokens"] > 2, load
        assert load["num_pending_tokens"] == 0 and load["ts_tic"] > idle_load_tic, load
    wait_until(lambda: requests.get(server.url + "/get_load", timeout=10).json()[0]["num_reqs"] == 0, 30,
               what="the closed stream to be aborted")


# ----------------------------------------------------------------------------- /abort_request
def test_abort_request_ends_a_streaming_generate_by_rid(server):
    wait_until(lambda: idle(server), 30, what="an idle server")
    assert requests.post(server.url + "/abort_request", json={"rid": "unknown-" + uuid.uuid4().hex}, timeout=10).status_code == 200
    rid = "abort-me-" + uuid.uuid4().hex
    body = {"text": "never stop " + rid, "rid": rid, "stream": True,
            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
    with requests.post(server.url + "/generate", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        lines = (ln[6:] for ln in r.iter_lines() if ln.startswith(b"data: "))
        events = [json.loads(next(lines)) for _ in range(3)]
        assert server_info(server)["num_running_reqs"] == 1
        start = time.monotonic()
        a = requests.post(server.url + "/abort_request", json={"rid": rid}, timeout=10)
        assert a.status_code == 200 and a.json()["num_aborted"] == 1
        rest = list(lines)
    elapsed = time.monotonic() - start
    assert rest[-1] == b"[DONE]"
    last = json.loads(rest[-2]) if len(rest) > 1 else events[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert last["meta_info"]["completion_tokens"] < 4000 and elapsed < 10
    wait_until(lambda: idle(server), 30, what="KV slots freed after the abort")


def test_abort_request_ends_a_non_stream_completion(server, client):
    wait_until(lambda: idle(server), 30, what="an idle server")
    rid = "abort-cmpl-" + uuid.uuid4().hex
    out = {}

    def run():
        out["resp"] = complete(client, prompt="go on forever", max_tokens=4000, extra_body={"rid": rid, "ignore_eos": True})

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: server_info(server)["num_running_reqs"] == 1, 30, what="the completion to run")
    assert requests.post(server.url + "/abort_request", json={"rid": rid}, timeout=10).json()["num_aborted"] == 1
    t.join(30)
    assert not t.is_alive()
    resp = out["resp"]
    assert resp.id == f"cmpl-{rid}" and resp.choices[0].finish_reason == "abort"
    assert resp.usage.completion_tokens < 4000
    wait_until(lambda: idle(server), 30, what="KV slots freed after the abort")


# ----------------------------------------------------------------------------- upstream 0.5.23's small routes
def test_put_generate_root_ping_ready_and_version(server):
    body = {"text": "The sky is", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    put = requests.put(server.url + "/generate", json=body, timeout=60)
    assert put.status_code == 200 and put.json()["text"] == generate(server, **body)["text"]
    r = requests.get(server.url + "/", timeout=10)
    assert r.status_code == 200 and r.json() == "SGLang is running"
    r = requests.get(server.url + "/ping", timeout=10)
    assert r.status_code == 200 and r.content == b""
    r = requests.get(server.url + "/ready", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    from sglang import __version__

    assert server_info(server)["version"] == __version__


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_tokenize_and_detokenize_use_the_served_tokenizer(server, prefix):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(server.model_dir)
    text = "Hello world, tokenize me."
    r = requests.post(server.url + prefix + "/tokenize", json={"prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    ids = tok.encode(text)
    max_len = requests.get(server.url + "/model_info", timeout=10).json()["context_length"]
    assert r.json() == {"tokens": ids, "count": len(ids), "max_model_len": max_len}
    r = requests.post(server.url + prefix + "/tokenize", json={"prompt": [text, "two"], "add_special_tokens": False},
                      timeout=30)
    assert r.json()["tokens"] == [tok.encode(text, add_special_tokens=False), tok.encode("two", add_special_tokens=False)]
    assert r.json()["count"] == [len(x) for x in r.json()["tokens"]]
    r = requests.post(server.url + prefix + "/detokenize", json={"tokens": ids}, timeout=30)
    assert r.status_code == 200 and r.json() == {"text": tok.decode(ids, skip_special_tokens=True)}
    special = [tok.convert_tokens_to_ids("<|im_start|>"), *ids]
    r = requests.post(server.url + prefix + "/detokenize", json={"tokens": [special, ids], "skip_special_tokens": False},
                      timeout=30)
    assert r.json() == {"text": [tok.decode(special), tok.decode(ids)]} and r.json()["text"][0].startswith("<|im_start|>")
    r = requests.post(server.url + prefix + "/detokenize", json={"tokens": [1, 10**9]}, timeout=30)
    assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"]
    r = requests.post(server.url + prefix + "/tokenize", json={"text": "no prompt field"}, timeout=30)
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]


def test_profile_around_one_request_writes_a_trace(server, request):
    out_dir = Path(envs.SGLANG_TORCH_PROFILER_DIR.get()).resolve() / f"sglang-e2e-{uuid.uuid4().hex[:8]}"  # only there
    request.addfinalizer(lambda: shutil.rmtree(out_dir, ignore_errors=True))
    r = requests.post(server.url + "/start_profile", json={"output_dir": str(out_dir), "activities": ["CPU"]}, timeout=30)
    assert r.status_code == 200 and r.text.startswith("Start profiling."), r.text
    again = requests.post(server.url + "/start_profile", json={"output_dir": str(out_dir)}, timeout=30)
    assert again.status_code == 400 and "already in progress" in again.json()["error"]["message"]
    generate(server, text="profile me " + uuid.uuid4().hex[:6], sampling_params={"max_new_tokens": 3})
    r = requests.post(server.url + "/stop_profile", timeout=60)
    assert r.status_code == 200 and r.text.startswith("Stop profiling."), r.text
    traces = list(out_dir.glob("*-TP-0.trace.json.gz"))
    assert len(traces) == 1 and traces[0].name in r.text.replace("<rank>", "0")
    import gzip

    with gzip.open(traces[0], "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)
    r = requests.post(server.url + "/stop_profile", timeout=30)
    assert r.status_code == 400 and "not in progress" in r.json()["error"]["message"]
    assert generate(server, text="still serving", sampling_params={"max_new_tokens": 2, "ignore_eos": True}
                    )["meta_info"]["completion_tokens"] == 2
