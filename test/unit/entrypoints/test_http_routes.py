"""The HTTP routes over a fake tokenizer manager, driven as plain ASGI calls (no server, no model):
completions' shapes and refusals, model retrieval, the info aliases, /abort_request, /health_generate
(its timeout aborts the probe) and --api-key covering every route but /health and /metrics."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest

from sglang.srt.entrypoints import health_routes, http_server
from sglang.srt.entrypoints.auth import OPEN_PATHS
from sglang.srt.errors import GenerateError
from sglang.srt.server_args import ServerArgs

MODEL = "org/tiny-model"


class FakeTM:
    """The parts of TokenizerManager the routes use; generations replay `self.script`."""

    def __init__(self):
        self.weight_version = "default"
        self.model_path, self.context_length, self.processor = "/models/tiny", 4096, None
        self.hf_config = {"architectures": ["Tiny"], "model_type": "tiny"}
        self.metrics = object()  # registers /metrics (render_metrics below)
        self.healthy, self.dead_reason = True, None
        self.script: list[dict] = []
        self.hang = False
        self.aborts: list[tuple[str, bool]] = []
        self.closed_generations = 0
        self.requests = []

    async def tokenize_request(self, obj):
        self.requests.append(obj)
        regex = (obj.sampling_params or {}).get("regex")
        key = ("regex", regex) if regex is not None else None
        return SimpleNamespace(rid=obj.rid or "r1", sampling_params=SimpleNamespace(grammar_key=lambda: key)), b""

    async def tokenize_requests(self, groups):
        return [await self.tokenize_request(obj) for g in groups for obj in g]

    async def generate_tokenized(self, tokenized, payload=None):
        try:
            for out in self.script:
                if isinstance(out, Exception):  # what a scheduler-side failure (a bad grammar) raises here
                    raise out
                yield out
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.closed_generations += 1  # the real one aborts an unfinished request here

    async def generate_request(self, obj):
        tok, payload = await self.tokenize_request(obj)
        async for out in self.generate_tokenized(tok, payload):
            yield out

    def abort_request(self, rid="", abort_all=False):
        self.aborts.append((rid, abort_all))
        return 0

    async def get_server_info(self):
        return {"num_running_reqs": 0, "available_kv_tokens": 100}

    async def get_load(self):
        return [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]

    async def render_metrics(self):
        return "# metrics\n"


def _out(text, fr=None, completion=1):
    meta = {"finish_reason": fr, "prompt_tokens": 3, "completion_tokens": completion, "cached_tokens": 0}
    return {"text": text, "output_ids": [], "meta_info": meta}


def _app(tm, **args):
    return http_server.create_app(tm, ServerArgs(model_path="/models/tiny", served_model_name=MODEL, **args))


def call(app, method, path, body=None, headers=()):
    """-> (status, body bytes)."""
    raw = b"" if body is None else body if isinstance(body, bytes) else orjson.dumps(body)

    async def run():
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                             *headers],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        got_body = False
        msgs = []

        async def receive():
            nonlocal got_body
            if not got_body:
                got_body = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await asyncio.Event().wait()  # the client stays connected

        async def send(m):
            msgs.append(m)

        await app(scope, receive, send)
        return msgs[0]["status"], b"".join(m.get("body", b"") for m in msgs[1:])

    return asyncio.run(run())


def call_json(app, method, path, body=None, headers=()):
    status, data = call(app, method, path, body, headers)
    return status, orjson.loads(data) if data else None


def sse_events(data: bytes) -> list:
    lines = [ln[6:] for ln in data.split(b"\n\n") if ln.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    return [orjson.loads(ln) for ln in lines[:-1]]


# ----------------------------------------------------------------------------- /v1/completions
def test_completion_non_stream_shape_and_request():
    tm = FakeTM()
    tm.script = [_out("Hello world", {"type": "stop", "matched": "\n"}, completion=2)]
    status, body = call_json(_app(tm), "POST", "/v1/completions",
                             {"model": "m", "prompt": "Say", "max_tokens": 5, "stop": "\n", "seed": 3,
                              "top_k": 4, "min_p": 0.1, "ignore_eos": True, "rid": "abc"})
    assert status == 200, body
    assert body["id"] == "cmpl-abc" and body["object"] == "text_completion" and body["model"] == "m"
    assert isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "text": "Hello world", "logprobs": None, "finish_reason": "stop",
                                "matched_stop": "\n"}]
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["total_tokens"] == 5
    obj = tm.requests[0]
    assert obj.text == "Say" and obj.input_ids is None and obj.messages is None and obj.rid == "abc"
    sp = obj.sampling_params
    assert (sp["max_new_tokens"], sp["stop"], sp["seed"], sp["top_k"], sp["min_p"], sp["ignore_eos"]) == \
        (5, "\n", 3, 4, 0.1, True)


def test_completion_token_ids_prompt_and_default_model():
    tm = FakeTM()
    tm.script = [_out("x", {"type": "length"})]
    status, body = call_json(_app(tm), "POST", "/v1/completions", {"prompt": [1, 2, 3]})
    assert status == 200 and body["model"] == MODEL and body["choices"][0]["finish_reason"] == "length"
    assert tm.requests[0].input_ids == [1, 2, 3] and tm.requests[0].text is None
    assert tm.requests[0].sampling_params["max_new_tokens"] == 16  # OpenAI's default


def test_completion_stream_deltas_finish_and_usage():
    tm = FakeTM()
    tm.script = [_out("He"), _out("Hello"), _out("Hello", {"type": "length"}, completion=3)]
    status, data = call(_app(tm), "POST", "/v1/completions",
                        {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = sse_events(data)
    assert [e["choices"][0]["text"] for e in events[:-1]] == ["He", "llo", ""]
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [None, None, "length"]
    assert all(e["object"] == "text_completion" and e["id"] == "cmpl-r1" for e in events)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
    assert tm.closed_generations == 1


def test_generate_stream_output_sends_only_the_new_text_and_ids():
    """--stream-output: each /generate chunk holds what is new (upstream's flag); without it, everything so far."""
    def script():
        outs = [_out("He"), _out("Hello"), _out("Hello!", {"type": "length"}, completion=3)]
        for o, ids in zip(outs, ([1], [1, 2], [1, 2, 3])):
            o["output_ids"] = ids
        return outs

    tm = FakeTM()
    tm.script = script()
    status, data = call(_app(tm, stream_output=True), "POST", "/generate", {"input_ids": [5], "stream": True})
    assert status == 200
    events = sse_events(data)
    assert [e["text"] for e in events] == ["He", "llo", "!"]
    assert [e["output_ids"] for e in events] == [[1], [2], [3]]
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length"} and tm.closed_generations == 1
    tm.script = script()
    events = sse_events(call(_app(tm), "POST", "/generate", {"input_ids": [5], "stream": True})[1])
    assert [e["text"] for e in events] == ["He", "Hello", "Hello!"] and events[-1]["output_ids"] == [1, 2, 3]
    # a batch: each prompt's chunks are cut on their own
    tm.script = script()
    events = sse_events(call(_app(tm, stream_output=True), "POST", "/generate",
                             {"input_ids": [[5], [6]], "stream": True})[1])
    for i in (0, 1):
        assert "".join(e["text"] for e in events if e["index"] == i) == "Hello!"
        assert [t for e in events if e["index"] == i for t in e["output_ids"]] == [1, 2, 3]


BAD_REGEX = GenerateError("invalid regex: parenthesis is not closed")  # as the scheduler ranks answer it


@pytest.mark.parametrize("path, body", [
    ("/generate", {"input_ids": [5], "stream": True, "sampling_params": {"regex": "a(b"}}),
    ("/generate", {"input_ids": [[5], [6]], "stream": True, "sampling_params": {"regex": "a(b"}}),
    ("/v1/completions", {"prompt": "x", "stream": True, "regex": "a(b"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True, "regex": "a(b"}),
])
def test_a_stream_whose_grammar_fails_on_the_scheduler_is_a_400(path, body):
    """The grammar compiles on the scheduler ranks, so its failure is the generation's first output: a
    constrained stream holds its response until then, and a bad grammar is a 400 naming the problem, with
    every generation closed (aborted), as when the tokenizer compiled it."""
    tm = FakeTM()
    tm.script = [BAD_REGEX]
    status, out = call_json(_app(tm), "POST", path, body)
    assert status == 400 and out["error"]["message"] == "invalid regex: parenthesis is not closed", out
    assert tm.closed_generations == len(tm.requests) >= 1


def test_an_unconstrained_stream_is_not_held():
    """Without a grammar the response starts at once: a later failure is an error event in a 200 stream."""
    tm = FakeTM()
    tm.script = [_out("He"), GenerateError("engine failed", 500, "server_error")]
    status, data = call(_app(tm), "POST", "/generate", {"input_ids": [5], "stream": True})
    events = sse_events(data)
    assert status == 200 and events[0]["text"] == "He" and events[-1]["error"]["message"] == "engine failed"
    tm.script = [_out("He"), _out("Hello", {"type": "length"})]  # held, a good grammar streams as before
    status, data = call(_app(tm), "POST", "/generate", {"input_ids": [5], "stream": True,
                                                        "sampling_params": {"regex": "[a-z]+"}})
    assert status == 200 and [e["text"] for e in sse_events(data)] == ["He", "Hello"]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": [1, 2]}),
])
def test_openai_routes_refuse_under_skip_tokenizer_init(path, body):
    tm = FakeTM()
    app = _app(tm, skip_tokenizer_init=True)
    tm.server_args = ServerArgs(model_path="/models/tiny", skip_tokenizer_init=True)
    status, out = call_json(app, "POST", path, {"model": MODEL, **body})
    assert status == 400 and "--skip-tokenizer-init" in out["error"]["message"] and path in out["error"]["message"]
    assert tm.requests == []


def test_completion_stream_without_usage_has_no_usage_chunk():
    tm = FakeTM()
    tm.script = [_out("Hi", {"type": "stop"})]
    _, data = call(_app(tm), "POST", "/v1/completions", {"prompt": "x", "stream": True})
    events = sse_events(data)
    assert len(events) == 1 and events[0]["choices"][0]["text"] == "Hi" and events[0]["usage"] is None


@pytest.mark.parametrize("extra, word", [
    ({"n": 0}, "n must be"), ({"best_of": 3}, "best_of"),
    ({"suffix": "z"}, "suffix"), ({"logit_bias": {"1": "high"}}, "logit_bias"),
    ({"prompt": []}, "prompt is empty"),
    ({"max_tokens": -1}, "max_tokens must be at least 0"), ({"prompt": {"x": 1}}, "prompt"),
    ({"temperature": "hot"}, "temperature"),
])
def test_completion_refuses_what_it_cannot_do_naming_it(extra, word):
    tm = FakeTM()
    status, body = call_json(_app(tm), "POST", "/v1/completions", {"prompt": "x", **extra})
    assert status == 400 and body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == 400
    assert word in body["error"]["message"], body
    assert tm.requests == []


def test_completion_without_prompt_is_400():
    status, body = call_json(_app(FakeTM()), "POST", "/v1/completions", {"model": "m"})
    assert status == 400 and "prompt" in body["error"]["message"]


# ----------------------------------------------------------------------------- models and info
def test_retrieve_model_by_id_and_unknown_is_404():
    app = _app(FakeTM())
    status, card = call_json(app, "GET", f"/v1/models/{MODEL}")
    assert status == 200 and card["id"] == MODEL and card["object"] == "model" and card["max_model_len"] == 4096
    assert call_json(app, "GET", "/v1/models")[1]["data"][0]["id"] == MODEL
    status, body = call_json(app, "GET", "/v1/models/other-model")
    assert status == 404 and body["error"]["code"] == 404 and "other-model" in body["error"]["message"]


def test_info_aliases_answer_the_same():
    app = _app(FakeTM())
    assert call_json(app, "GET", "/model_info") == call_json(app, "GET", "/get_model_info")
    status, info = call_json(app, "GET", "/server_info")
    assert status == 200 and info == call_json(app, "GET", "/get_server_info")[1] and info["available_kv_tokens"] == 100


# ----------------------------------------------------------------------------- /abort_request
def test_abort_request_by_rid_all_and_bad_bodies():
    tm = FakeTM()
    app = _app(tm)
    assert call_json(app, "POST", "/abort_request", {"rid": "nope"}) == (200, {"success": True, "num_aborted": 0})
    assert call_json(app, "POST", "/abort_request", {"abort_all": True})[0] == 200
    assert tm.aborts == [("nope", False), ("", True)]
    for bad, word in (({}, "rid"), ({"rid": 5}, "rid"), ({"abort_all": "yes"}, "abort_all"), (b"{", "JSON")):
        status, body = call_json(app, "POST", "/abort_request", bad)
        assert status == 400 and word in body["error"]["message"], bad
    assert len(tm.aborts) == 2


# ----------------------------------------------------------------------------- /health_generate
def test_health_generate_ok():
    tm = FakeTM()
    tm.script = [_out("!", {"type": "length"})]
    assert call_json(_app(tm), "GET", "/health_generate") == (200, {"status": "ok"})
    obj = tm.requests[0]
    assert obj.input_ids and obj.sampling_params["max_new_tokens"] == 1 and obj.rid.startswith("HEALTH_CHECK_")


def test_health_generate_times_out_with_503_and_closes_the_probe(monkeypatch):
    monkeypatch.setattr(health_routes, "HEALTH_GENERATE_TIMEOUT_S", 0.05)
    tm = FakeTM()
    tm.hang = True
    status, body = call_json(_app(tm), "GET", "/health_generate")
    assert status == 503 and "did not finish" in body["error"]["message"]
    assert tm.closed_generations == 1  # cancelled: the real generation aborts its request there


def test_health_generate_aborted_probe_is_503():
    tm = FakeTM()
    tm.script = [_out("", {"type": "abort", "message": "aborted"})]
    assert call_json(_app(tm), "GET", "/health_generate")[0] == 503


# ----------------------------------------------------------------------------- --api-key
def test_api_key_guards_every_route_but_health_and_metrics():
    app = _app(FakeTM(), api_key="sk-k")
    paths = {(r.path, m) for r in app.routes if hasattr(r, "methods") and not r.path.startswith(("/docs", "/openapi", "/redoc"))
             for m in r.methods if m != "HEAD"}
    for new in ("/v1/completions", "/health_generate", "/abort_request", "/model_info", "/server_info",
                "/v1/models/{model:path}"):
        assert new in {p for p, _ in paths}, new
    for path, method in sorted(paths):
        url = path.replace("{model:path}", MODEL)
        status, _ = call(app, method, url)
        if path in OPEN_PATHS:
            assert status != 401, path
        else:
            assert status == 401, (method, path)
    assert call(app, "GET", f"/v1/models/{MODEL}", headers=[(b"authorization", b"Bearer sk-k")])[0] == 200
