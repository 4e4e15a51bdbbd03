"""Upstream 0.5.23's smaller routes over a fake tokenizer manager (plain ASGI calls, no model): PUT
/generate, GET and HEAD /, /ping, /ready (503 until a generation came back, one shared probe),
/tokenize and /detokenize shapes and refusals, /start_profile and /stop_profile bodies and answers,
`version` in /server_info and the 413 wording."""

from __future__ import annotations

import asyncio
import os

import pytest

from sglang import __version__
from sglang.srt.entrypoints import health_routes
from sglang.srt.managers.io_struct import ProfileReqOutput
from test_http_routes import FakeTM, _app, _out, call, call_json


class Fake(FakeTM):
    def __init__(self):
        super().__init__()
        self.accepting, self.has_served = True, False
        self.profile_reqs = []
        self.profile_reply = None
        self.tokenize_calls = []

    async def tokenize(self, texts, add_special_tokens=True):
        self.tokenize_calls.append((texts, add_special_tokens))
        return [[len(t), 7] if add_special_tokens else [len(t)] for t in texts]

    async def detokenize(self, seqs, skip_special_tokens=True):
        return ["|".join(map(str, s)) + ("" if skip_special_tokens else "+") for s in seqs]

    async def profile(self, req, timeout=None):
        self.profile_reqs.append(req)
        if self.profile_reply is not None:
            return self.profile_reply
        path = f"/traces/{req.profile_id or 'p'}-TP-0.trace.json.gz"
        return ProfileReqOutput(True, "ok", files=[path])


# ----------------------------------------------------------------------------- /generate, /, /ping
def test_put_generate_is_post_generate():
    tm = Fake()
    tm.script = [_out("hi", {"type": "length"})]
    put = call_json(_app(tm), "PUT", "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}})
    post = call_json(_app(tm), "POST", "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}})
    assert put[0] == 200 and put[1]["text"] == "hi"
    assert put[1]["meta_info"]["finish_reason"] == post[1]["meta_info"]["finish_reason"]
    assert [o.text for o in tm.requests] == ["x", "x"]


def test_root_and_ping_answer_while_serving_and_503_when_not():
    tm = Fake()
    app = _app(tm)
    assert call_json(app, "GET", "/") == (200, "SGLang is running")
    assert call(app, "HEAD", "/")[0] == 200
    assert call(app, "GET", "/ping") == (200, b"")
    tm.accepting, tm.dead_reason = False, "scheduler process exited"
    status, body = call_json(app, "GET", "/ping")
    assert status == 503 and "scheduler process exited" in body["error"]["message"]


# ----------------------------------------------------------------------------- /ready
def test_ready_probes_once_until_a_generation_came_back():
    tm = Fake()
    tm.script = [_out("!", {"type": "length"})]
    app = _app(tm)
    assert call_json(app, "GET", "/ready") == (200, {"status": "ready"})
    assert len(tm.requests) == 1 and tm.requests[0].rid.startswith("HEALTH_CHECK_")
    tm.has_served = True  # what the real manager records when the probe's output arrives
    assert call_json(app, "GET", "/ready") == (200, {"status": "ready"})
    assert len(tm.requests) == 1  # served already: no second probe


def test_ready_is_503_while_the_pipeline_does_not_answer(monkeypatch):
    monkeypatch.setattr(health_routes, "HEALTH_GENERATE_TIMEOUT_S", 0.05)
    tm = Fake()
    tm.hang = True
    status, body = call_json(_app(tm), "GET", "/ready")
    assert status == 503 and "not ready" in body["error"]["message"] and "did not finish" in body["error"]["message"]
    assert tm.closed_generations == 1  # the timed-out probe is aborted


async def _get(app, path: str) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": [],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    msgs, sent = [], False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()

    async def send(m):
        msgs.append(m)

    await app(scope, receive, send)
    return msgs[0]["status"]


def test_concurrent_ready_calls_share_one_probe():
    tm = Fake()
    tm.script = [_out("!", {"type": "length"})]
    app = _app(tm)
    gate_open = []

    async def run():
        gate = asyncio.Event()
        gen = tm.generate_tokenized

        async def gated(tokenized, payload=None):
            await gate.wait()  # the probe stays in flight until every /ready call is waiting on it
            async for out in gen(tokenized, payload):
                yield out

        tm.generate_tokenized = gated
        calls = [asyncio.ensure_future(_get(app, "/ready")) for _ in range(3)]
        for _ in range(50):  # every call reaches the shared probe, which waits at the gate
            await asyncio.sleep(0)
        assert not any(c.done() for c in calls)
        gate_open.append(len(tm.requests))
        gate.set()
        return await asyncio.gather(*calls)

    assert asyncio.run(run()) == [200, 200, 200]
    assert gate_open == [1] and len(tm.requests) == 1
    tm.accepting = False
    assert call_json(app, "GET", "/ready")[0] == 503


# ----------------------------------------------------------------------------- tokenize / detokenize
@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_tokenize_shapes(prefix):
    tm = Fake()
    app = _app(tm)
    status, body = call_json(app, "POST", prefix + "/tokenize", {"model": "m", "prompt": "abc"})
    assert status == 200 and body == {"tokens": [3, 7], "count": 2, "max_model_len": 4096}
    status, body = call_json(app, "POST", prefix + "/tokenize", {"prompt": ["ab", "abcd"], "add_special_tokens": False})
    assert status == 200 and body == {"tokens": [[2], [4]], "count": [1, 1], "max_model_len": 4096}
    assert tm.tokenize_calls == [(["abc"], True), (["ab", "abcd"], False)]


@pytest.mark.parametrize("prefix", ["", "/v1"])
def test_detokenize_shapes(prefix):
    app = _app(Fake())
    assert call_json(app, "POST", prefix + "/detokenize", {"tokens": [1, 2]}) == (200, {"text": "1|2"})
    assert call_json(app, "POST", prefix + "/detokenize", {"tokens": [[1], [2, 3]], "skip_special_tokens": False}) == \
        (200, {"text": ["1+", "2|3+"]})
    assert call_json(app, "POST", prefix + "/detokenize", {"tokens": []}) == (200, {"text": ""})


@pytest.mark.parametrize("path, body, word", [
    ("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", b"{", "JSON"),
    ("/detokenize", {"tokens": ["a"]}, "tokens"), ("/detokenize", {"tokens": [True]}, "tokens"),
    ("/detokenize", {"text": "x"}, "tokens"),
    # more ids than the context length: refused before validating them (the fake's context is 4096)
    ("/detokenize", {"tokens": ["a"] * 4097}, "(4097 tokens) is longer than the model's context length (4096 tokens)"),
    ("/detokenize", {"tokens": [[1], [1] * 4097]}, "(4097 tokens)"),
])
def test_tokenizer_routes_refuse_bad_bodies_naming_the_field(path, body, word):
    status, out = call_json(_app(Fake()), "POST", path, body)
    assert status == 400 and word in out["error"]["message"], out


# ----------------------------------------------------------------------------- profiling
@pytest.fixture
def profiler_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_TORCH_PROFILER_DIR", str(tmp_path))
    return os.path.realpath(tmp_path)


def test_start_profile_defaults_and_fields_reach_the_schedulers(profiler_dir):
    tm = Fake()
    app = _app(tm)
    status, text = call(app, "GET", "/start_profile")
    assert status == 200 and text.startswith(b"Start profiling.\n") and b"-TP-<rank>.trace.json.gz" in text
    req = tm.profile_reqs[-1]
    # the launch directory and a bounded step count, never "until /stop_profile"
    assert (req.action, req.output_dir, req.num_steps, req.activities) == ("start", profiler_dir, 64, ["CPU", "GPU"])
    assert req.profile_id and float(req.profile_id) > 0
    status, _ = call(app, "POST", "/start_profile", {"output_dir": "x", "num_steps": 3, "activities": ["CPU"],
                                                      "record_shapes": True, "start_step": None})
    req = tm.profile_reqs[-1]
    assert status == 200 and (req.output_dir, req.num_steps, req.activities, req.record_shapes) == (
        os.path.join(profiler_dir, "x"), 3, ["CPU"], True)
    status, text = call(app, "POST", "/stop_profile")
    assert status == 200 and text.startswith(b"Stop profiling.") and tm.profile_reqs[-1].action == "stop"


@pytest.mark.parametrize("body, word", [
    ({"num_steps": 0}, "num_steps"), ({"num_steps": True}, "num_steps"), ({"activities": ["MEM"]}, "MEM"),
    ({"activities": []}, "activities"), ({"start_step": 4}, "start_step"), ({"merge_profiles": True}, "merge_profiles"),
    ({"output_dir": 3}, "output_dir"), ({"with_stack": "yes"}, "with_stack"), ({"bogus": 1}, "bogus"),
    ({"output_dir": "/etc"}, "SGLANG_TORCH_PROFILER_DIR"), ({"output_dir": "../up"}, "SGLANG_TORCH_PROFILER_DIR"),
    ({"num_steps": 257}, "maximum of 256 forward steps (SGLANG_PROFILE_MAX_STEPS)"),
])
def test_start_profile_refuses_what_it_cannot_do(body, word, profiler_dir):
    tm = Fake()
    status, out = call_json(_app(tm), "POST", "/start_profile", body)
    assert status == 400 and word in out["error"]["message"], out
    assert tm.profile_reqs == []


def test_profile_refusals_from_the_scheduler_are_400_with_its_reason():
    tm = Fake()
    tm.profile_reply = ProfileReqOutput(False, "profiling is not in progress; call /start_profile first")
    status, out = call_json(_app(tm), "POST", "/stop_profile")
    assert status == 400 and "not in progress" in out["error"]["message"]


# ----------------------------------------------------------------------------- info, limits
def test_server_info_reports_the_version():
    status, info = call_json(_app(Fake()), "GET", "/get_server_info")
    assert status == 200 and info["version"] == __version__


def test_body_over_the_cap_is_413_payload_too_large():
    tm = Fake()
    status, out = call_json(_app(tm, max_request_body_mb=0.001), "POST", "/generate", {"text": "x" * 5000})
    assert status == 413 and out["error"]["message"].startswith("Payload Too Large: ")
    assert tm.requests == []
