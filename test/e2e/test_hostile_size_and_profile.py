"""One client against the rest (docs/reliability.md, "Request size, profiling and replicas"): each hostile
request runs beside an ordinary /generate and /health probes (hostile.beside_ordinary), is refused with a
4xx naming its limit or ends within its bound, and leaves nothing behind."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import requests

from conftest import wait_until
from hostile import HOSTILE_TIMEOUT_S, beside_ordinary
from sglang.srt.environ import envs

# the server inherits this process's environment (conftest.ServerProcess), so both read the same directory
PROFILER_DIR = Path(envs.SGLANG_TORCH_PROFILER_DIR.get()).resolve()


def _post(url: str, path: str, body: dict) -> requests.Response:
    return requests.post(url + path, json=body, timeout=HOSTILE_TIMEOUT_S)


def test_start_profile_writes_nowhere_outside_the_launch_directory(server):
    name = f"sglang-profile-{uuid.uuid4().hex[:8]}"
    for target in (f"/etc/{name}", f"../{name}", str(PROFILER_DIR.parent / name)):
        r, _ = beside_ordinary(server.url, lambda: _post(server.url, "/start_profile", {"output_dir": target}))
        assert r.status_code == 400 and "SGLANG_TORCH_PROFILER_DIR" in r.json()["error"]["message"], r.text
        assert not (PROFILER_DIR.parent / name).exists() and not Path("/etc", name).exists()
    r = _post(server.url, "/stop_profile", {})
    assert r.status_code == 400 and "not in progress" in r.json()["error"]["message"]  # nothing was started


def test_a_profile_without_num_steps_stops_by_itself(server):
    out_dir = PROFILER_DIR / f"sglang-e2e-{uuid.uuid4().hex[:8]}"
    steps = envs.SGLANG_PROFILE_NUM_STEPS.get()

    def hostile() -> requests.Response:
        r = _post(server.url, "/start_profile", {"output_dir": out_dir.name, "activities": ["CPU"]})
        assert r.status_code == 200, r.text
        # more forward steps than the default records: a prefill and one decode step per further token
        return _post(server.url, "/generate", {"text": "profiled", "sampling_params": {
            "max_new_tokens": steps + 8, "ignore_eos": True}})

    try:
        r, _ = beside_ordinary(server.url, hostile)
        assert r.status_code == 200, r.text
        # the last recorded step stops the profile and writes the trace, with nobody calling /stop_profile
        wait_until(lambda: list(out_dir.glob("*-TP-0.trace.json.gz")), HOSTILE_TIMEOUT_S, what="the trace")
        r = _post(server.url, "/stop_profile", {})
        assert r.status_code == 400 and "not in progress" in r.json()["error"]["message"], r.text
        r = _post(server.url, "/start_profile", {"num_steps": envs.SGLANG_PROFILE_MAX_STEPS.get() + 1})
        assert r.status_code == 400 and "SGLANG_PROFILE_MAX_STEPS" in r.json()["error"]["message"], r.text
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


# Nearly the test server's 4 MiB body limit of text (16 MiB took 13.8 s and kept 1.4 GiB in the tokenizer
# process, holding the tokenizer lock, on a server with a larger limit)
HUGE_TEXT = ("The quick brown fox jumps over the lazy dog. " * (2**22 // 45))


def _limit_message(r: requests.Response) -> str:
    assert r.status_code == 400, r.text[:300]
    msg = r.json()["error"]["message"]
    assert "characters" in msg and "SGLANG_MAX_PROMPT_CHARS_PER_TOKEN" in msg, msg
    return msg


def test_text_too_long_for_any_tokenization_is_refused_before_tokenizing(server):
    from sglang.srt.utils.process_tree import rss_bytes

    context = requests.get(server.url + "/model_info", timeout=30).json()["context_length"]
    limit = context * envs.SGLANG_MAX_PROMPT_CHARS_PER_TOKEN.get()
    before = rss_bytes(server.proc.pid, "RssAnon")
    r, _ = beside_ordinary(server.url, lambda: _post(server.url, "/tokenize", {"prompt": HUGE_TEXT}))
    assert f"at most {limit} characters" in _limit_message(r)
    # the text was never tokenized: the tokenizer process keeps little of the body it parsed
    assert rss_bytes(server.proc.pid, "RssAnon") - before < 128 * 2**20  # tokenizing it kept ~350 MiB
    over = "word " * (limit // 5 + 1)
    for path, body in (("/generate", {"text": over, "sampling_params": {"max_new_tokens": 2}}),
                       ("/v1/completions", {"model": "m", "prompt": over, "max_tokens": 2}),
                       ("/v1/chat/completions", {"model": "m", "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": over}]}),
                       ("/tokenize", {"prompt": ["short", over]})):
        r, _ = beside_ordinary(server.url, lambda: _post(server.url, path, body))
        _limit_message(r)
    r, _ = beside_ordinary(server.url, lambda: _post(server.url, "/detokenize", {"tokens": [13] * (context + 1)}))
    assert r.status_code == 400 and f"({context} tokens)" in r.json()["error"]["message"], r.text[:300]
    # just under the bound the text is tokenized as before (it may then be too long in tokens)
    r = _post(server.url, "/tokenize", {"prompt": "x" * limit})
    assert r.status_code == 200 and r.json()["count"] >= 1
