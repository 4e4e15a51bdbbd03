"""Grammars one client could use against the others (docs/reliability.md, "Grammars"), each sent beside
an ordinary /generate and /health probes (hostile.py): huge grammar texts, grammars that compile past
the time limit, a prompt too long for the context with a grammar, schemas with no possible output or
an allOf xgrammar would not enforce. Every one is a 400 naming the problem or the limit, the ordinary
request finishes, /health answers. Grammars compile on the scheduler only (once per rank); the size
limit and the allOf check are the tokenizer side's. Also --constrained-json-disable-any-whitespace with tools and
structural tags, which it used to make a 400."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import wait_until
from hostile import HOSTILE_TIMEOUT_S, beside_ordinary

# a test dependency (pyproject's test extra); the GPU image lacks it and its suite collects this module
jsonschema = pytest.importorskip("jsonschema")

COMPILE_LIMIT_S = 2  # the server's SGLANG_GRAMMAR_COMPILE_TIMEOUT_S; real grammars here compile in ms
MAX_BYTES = 1 << 20  # the server's SGLANG_GRAMMAR_MAX_BYTES: room for a grammar slow by construction
# 16,000 chained rules (~0.56 MB of EBNF): ~12 s to compile here under xgrammar 0.2.9 (cost grows faster
# than its size), 6x the limit; a release that compiles everything fast cannot make it quick by 6x
SLOW_RULES = 16000
CONTEXT = 512
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 999}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": ADD}}]
MSGS = [{"role": "user", "content": "Add 2 and 3."}]
SMALL = {"text": "Code:", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "regex": "[0-9]{4}"}}


@pytest.fixture(scope="module")
def gl_server(launch_server):
    return launch_server("--constrained-json-disable-any-whitespace", "--context-length", str(CONTEXT),
                         env={"SGLANG_GRAMMAR_COMPILE_TIMEOUT_S": str(COMPILE_LIMIT_S),
                              "SGLANG_GRAMMAR_MAX_BYTES": str(MAX_BYTES)})


def _post(url: str, path: str, body: dict) -> requests.Response:
    return requests.post(url + path, json=body, timeout=HOSTILE_TIMEOUT_S)


def _generate(url: str, **sampling) -> requests.Response:
    return _post(url, "/generate", {"text": "Answer:", "sampling_params": {"max_new_tokens": 16, **sampling}})


def _message(r: requests.Response) -> str:
    body = r.json()
    err = body.get("error", body)
    return err.get("message", "") if isinstance(err, dict) else str(err)


def _grammar_cache(url: str) -> dict:
    """The scheduler's grammar cache: the only place a grammar compiles (the tokenizer side compiles
    nothing; its checks are the size limit and the JSON parse)."""
    info = requests.get(url + "/get_server_info", timeout=HOSTILE_TIMEOUT_S).json()
    assert "grammar_check_cache" not in info  # no second compile site
    return info["grammar_cache"]


def _compiling(url: str) -> int:
    """Compiles running on the scheduler, within the limit or past it."""
    stats = _grammar_cache(url)
    return stats["compiling"] + stats["overrunning"]


def _both(fn, args: list) -> list:
    with ThreadPoolExecutor(len(args)) as pool:
        return list(pool.map(fn, args))


def test_huge_regexes_are_refused_before_compiling(gl_server):
    """Two 1.5 MB regexes had taken both compile threads past the time limit: every constrained request
    was a 400 for minutes. Now both are refused at once, naming the cap, and a small one compiles."""
    url = gl_server.url
    huge = [c * 1572864 for c in "ab"]  # 1.5 MB each; a literal compiles in ~20 us per byte
    answers, _ = beside_ordinary(url, lambda: _both(lambda rx: _generate(url, regex=rx), huge))
    for r in answers:
        assert r.status_code == 400 and _message(r).endswith(
            f"regex is 1572864 bytes, more than the {MAX_BYTES}-byte limit (SGLANG_GRAMMAR_MAX_BYTES)"), r.text
    small = _post(url, "/generate", SMALL)
    assert small.status_code == 200 and re.fullmatch("[0-9]{4}", small.json()["text"]), small.text


def test_slow_compiles_do_not_hold_back_a_small_constrained_request(gl_server):
    """Grammars that compile for seconds run past the limit: each a 400 naming it; a small constrained
    request sent while they compile is answered (it is the ordinary request here). The slow grammars are
    slow by construction (a long chain of rules, each state's token mask built), not by a library's
    weakness: a bounded-string schema that took seconds under xgrammar 0.2.8 compiles in 30 ms under 0.2.9."""
    url = gl_server.url

    def chain(tag: str) -> str:
        rules = [f'r{i} ::= "{tag}{i}" r{i + 1} | "e{i}"' for i in range(SLOW_RULES)]
        return "\n".join([*rules, f'r{SLOW_RULES} ::= "z"', "root ::= r0"])

    slow = [chain("a"), chain("b")]
    assert all(len(g) < MAX_BYTES for g in slow)
    overruns = _grammar_cache(url)["overruns"]
    answers, _ = beside_ordinary(url, lambda: _both(lambda g: _generate(url, ebnf=g), slow),
                                 in_flight=lambda: _compiling(url) >= 2, ordinary_body=SMALL)
    for r in answers:
        assert r.status_code == 400 and _message(r) == (
            f"the ebnf did not compile within {COMPILE_LIMIT_S} s (SGLANG_GRAMMAR_COMPILE_TIMEOUT_S); "
            "simplify it"), r.text
    assert _grammar_cache(url)["overruns"] == overruns + 2  # each compiled once, on the scheduler only
    misses = _grammar_cache(url)["misses"]
    again = _generate(url, ebnf=slow[0])  # the verdict is kept: refused without compiling again
    assert again.status_code == 400 and "did not compile within" in _message(again)
    assert _grammar_cache(url)["misses"] == misses


def test_a_prompt_too_long_for_the_context_is_refused_before_its_grammar_compiles(gl_server):
    url = gl_server.url
    misses = _grammar_cache(url)["misses"]
    body = {"text": "hello " * (2 * CONTEXT), "sampling_params": {"max_new_tokens": 4, "regex": "[a-f]{3}x"}}
    r, _ = beside_ordinary(url, lambda: _post(url, "/generate", body))
    assert r.status_code == 400 and "is longer than the model's context length (512 tokens)" in _message(r), r.text
    assert _grammar_cache(url)["misses"] == misses  # refused before it was sent: nothing compiled for it


def test_schemas_without_any_output_are_a_400(gl_server):
    """{"$ref": "#"} (also as a tool's parameters) had been a 500 ("sampled token 0 does not fit")."""
    url = gl_server.url
    ref_tools = [{"type": "function", "function": {"name": "loop", "parameters": {"$ref": "#"}}}]

    def hostile():
        direct = _generate(url, json_schema='{"$ref": "#"}')
        tool = _post(url, "/v1/chat/completions", {"model": "default", "messages": MSGS, "tools": ref_tools,
                                                     "tool_choice": "required", "max_tokens": 32})
        return direct, tool

    (direct, tool), _ = beside_ordinary(url, hostile)
    assert direct.status_code == 400 and _message(direct).startswith("invalid json_schema: it admits no output"), \
        direct.text
    assert tool.status_code == 400 and "admits no output" in _message(tool), tool.text


def test_a_grammar_that_fails_on_the_scheduler_is_a_400_streamed_or_not(gl_server):
    """The scheduler's compile is the grammar's check: an invalid regex is a 400 naming the problem on
    /generate and on a streamed chat completion (held until the compile's verdict), n > 1 included,
    and the server keeps serving."""
    url = gl_server.url
    r = _generate(url, regex="a(b")
    assert r.status_code == 400 and _message(r).startswith("invalid regex:"), r.text
    body = {"model": "default", "messages": MSGS, "max_tokens": 8, "stream": True, "n": 2, "regex": "a(b"}
    streamed = _post(url, "/v1/chat/completions", body)
    assert streamed.status_code == 400 and _message(streamed) == _message(r), streamed.text
    small = _post(url, "/generate", SMALL)
    assert small.status_code == 200 and re.fullmatch("[0-9]{4}", small.json()["text"]), small.text


def test_all_of_that_xgrammar_would_not_enforce_is_a_400(gl_server):
    url = gl_server.url
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"allOf": [{"type": "string"},
                                                                                    {"type": "integer"}]}}}
    body = {"model": "default", "messages": MSGS, "response_format": fmt, "max_tokens": 16}
    r, _ = beside_ordinary(url, lambda: _post(url, "/v1/chat/completions", body))
    assert r.status_code == 400 and "allOf with 2 schemas (at $) is not supported" in _message(r), r.text


def _compact(args: str) -> bool:
    """No whitespace outside strings but the separators' (compile_json_schema(any_whitespace=False))."""
    outside = re.sub(r'"(?:\\.|[^"\\])*"', '""', args)
    return not re.search(r"\s", re.sub(r"[,:] ", "", outside))


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_compact_json_flag_with_tools(gl_server, tool_choice):
    """--constrained-json-disable-any-whitespace had made every tool_choice required / named a 400."""
    url = gl_server.url
    body = {"model": "default", "messages": MSGS, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 120,
            "temperature": 0}
    r = _post(url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    for call in choice["message"]["tool_calls"]:
        args = call["function"]["arguments"]
        assert call["function"]["name"] == "add" and _compact(args), args
        jsonschema.validate(json.loads(args), ADD)


def test_compact_json_flag_with_strict_tools_and_structural_tags(gl_server):
    url = gl_server.url
    strict = [{"type": "function", "function": {"name": "add", "parameters": ADD, "strict": True}}]
    r = _post(url, "/v1/chat/completions", {"model": "default", "messages": MSGS, "tools": strict, "max_tokens": 16})
    assert r.status_code == 200, r.text
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<n>", "end": "</n>",
                                                "content": {"type": "json_schema", "json_schema": ADD}}}
    r = _post(url, "/v1/chat/completions", {"model": "default", "messages": MSGS, "response_format": tag,
                                            "max_tokens": 60, "temperature": 0})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["message"]["content"]
    m = re.fullmatch(r"<n>(.*)</n>", text, re.S)
    assert m and _compact(m.group(1)), text
    jsonschema.validate(json.loads(m.group(1)), ADD)
    wait_until(lambda: requests.get(url + "/health", timeout=5).status_code == 200, 30, what="/health")
