"""Constrained output through the launched server and the openai client, on the random-weight tiny model:
its free output is noise (checked below), so only the grammar can make it valid JSON, match a regex or
an EBNF grammar. JSON schema, json_object, regex, EBNF and guided_choice on chat, completions and
/generate, greedy and sampled, streamed and n > 1; invalid grammars, two constraints and
--grammar-backend none are 400s naming the problem."""

from __future__ import annotations

import json
import re

import pytest
import requests

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 99},
        "tag": {"type": "string", "minLength": 1, "maxLength": 6},
        "sizes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1,
                  "maxItems": 3},
    },
    "required": ["color", "count", "tag", "sizes"],
    "additionalProperties": False,
}
MSGS = [{"role": "user", "content": "Describe the widget as JSON."}]
REGEX = r"[A-Z][a-z]{2,5}-[0-9]{3}"
EBNF = 'root ::= "answer: " ("yes" | "no" | "maybe") "."'
MAX_TOKENS = 200  # far above what the grammars need: a complete grammar, not the limit, ends each output


def loads(text: str):
    """json.loads allowing raw control characters in strings: xgrammar 0.2.8 lets a string with
    minLength/maxLength contain them (its rule for bounded strings excludes only quote, backslash, CR
    and LF), which strict JSON forbids; everything else is strict JSON."""
    return json.loads(text, strict=False)


def check_schema(obj) -> None:
    """SCHEMA's rules, checked by hand."""
    assert isinstance(obj, dict) and set(obj) == {"color", "count", "tag", "sizes"}, obj
    assert obj["color"] in ("red", "green", "blue")
    assert isinstance(obj["count"], int) and not isinstance(obj["count"], bool) and 1 <= obj["count"] <= 99
    assert isinstance(obj["tag"], str) and 1 <= len(obj["tag"]) <= 6
    assert isinstance(obj["sizes"], list) and 1 <= len(obj["sizes"]) <= 3
    assert all(isinstance(x, int) and 0 <= x <= 9 for x in obj["sizes"])


@pytest.fixture(scope="module")
def so_server(launch_server):
    # whitespace runs capped: the random model would otherwise pad JSON with whitespace up to the limit
    return launch_server("--constrained-json-max-whitespace-cnt", "2")


@pytest.fixture(scope="module")
def oai(so_server):
    import openai

    return openai.OpenAI(base_url=so_server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _chat(oai, **kw):
    kw.setdefault("max_tokens", MAX_TOKENS)
    kw.setdefault("temperature", 0)
    return oai.chat.completions.create(model="default", messages=MSGS, **kw)


def test_free_output_is_not_json(oai):
    text = _chat(oai, max_tokens=40).choices[0].message.content
    with pytest.raises(ValueError):
        json.loads(text)


@pytest.mark.parametrize("temperature, seed", [(0, None), (1.0, 5), (1.0, 11)])
def test_json_schema_response_format(oai, temperature, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "widget", "schema": SCHEMA, "strict": True}}
    resp = _chat(oai, response_format=fmt, temperature=temperature, seed=seed)
    choice = resp.choices[0]
    check_schema(loads(choice.message.content))
    assert choice.finish_reason == "stop" and resp.usage.completion_tokens < MAX_TOKENS


def test_n_copies_each_follow_the_schema(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "widget", "schema": SCHEMA}}
    resp = _chat(oai, response_format=fmt, temperature=1.0, seed=3, n=3)
    texts = [c.message.content for c in resp.choices]
    for choice in resp.choices:
        assert choice.finish_reason == "stop", choice
        check_schema(loads(choice.message.content))
    assert len(set(texts)) > 1  # each copy samples its own output under its own matcher


def test_json_object(oai, model_dir):
    """Any JSON object: the random model fills free-form strings until the limit, so the output is either a
    complete object (stop) or a prefix of one (length), checked by xgrammar's JSON grammar."""
    import xgrammar as xg
    from transformers import AutoTokenizer

    info = xg.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(str(model_dir)))
    json_prefix = xg.GrammarMatcher(xg.GrammarCompiler(info).compile_builtin_json_grammar())
    for seed in (3, 4):
        choice = _chat(oai, response_format={"type": "json_object"}, temperature=1.0, seed=seed, max_tokens=48).choices[0]
        text = choice.message.content
        assert text.lstrip().startswith("{"), text
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            json_prefix.reset()
            assert choice.finish_reason == "length" and json_prefix.accept_string(text), text


def test_streamed_json_schema(oai):
    stream = _chat(oai, stream=True, temperature=1.0, seed=2,
                   response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}})
    parts, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    check_schema(loads("".join(parts)))
    assert finish == "stop"


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_regex_chat_and_completions(oai, temperature):
    out = _chat(oai, temperature=temperature, seed=1, extra_body={"regex": REGEX}).choices[0]
    assert re.fullmatch(REGEX, out.message.content) and out.finish_reason == "stop"
    comp = oai.completions.create(model="default", prompt="Code:", max_tokens=MAX_TOKENS, temperature=temperature,
                                  seed=4, extra_body={"guided_regex": REGEX}).choices[0]
    assert re.fullmatch(REGEX, comp.text) and comp.finish_reason == "stop"


def test_ebnf_and_guided_grammar(oai):
    out = _chat(oai, temperature=1.0, seed=9, extra_body={"ebnf": EBNF}).choices[0].message.content
    assert re.fullmatch(r"answer: (yes|no|maybe)\.", out)
    comp = oai.completions.create(model="default", prompt="Q:", max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"guided_grammar": EBNF}).choices[0].text
    assert re.fullmatch(r"answer: (yes|no|maybe)\.", comp)


def test_guided_choice(oai):
    choices = ["North America", "Europe", "Asia (East)"]
    seen = set()
    for seed in range(4):
        text = _chat(oai, temperature=1.0, seed=seed, extra_body={"guided_choice": choices}).choices[0].message.content
        assert text in choices
        seen.add(text)
    assert seen  # (which ones the random model picks is its business)


def test_json_schema_on_completions_and_generate(oai, so_server):
    comp = oai.completions.create(model="default", prompt="{", max_tokens=MAX_TOKENS, temperature=0,
                                  extra_body={"json_schema": json.dumps(SCHEMA)}).choices[0]
    check_schema(loads(comp.text))
    r = requests.post(so_server.url + "/generate", json={
        "text": "Widget:", "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0.7, "seed": 1,
                                               "json_schema": json.dumps(SCHEMA)}}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    check_schema(loads(body["text"]))
    assert body["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize("extra, problem", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     'invalid json_schema: Unsupported type "nope"'),
    ({"regex": "[0-9"}, "invalid regex"),
    ({"ebnf": "root ::= missing_rule"}, 'Rule "missing_rule" is not defined'),
    ({"regex": "a", "guided_choice": ["b"]}, "at most one output constraint per request: got regex and guided_choice"),
    ({"response_format": {"type": "xml"}}, "response_format type 'xml' is not supported"),
])
def test_bad_constraints_are_400s_naming_the_problem(oai, so_server, extra, problem):
    import openai

    body = {k: v for k, v in extra.items() if k != "response_format"}
    with pytest.raises(openai.BadRequestError) as e:
        _chat(oai, response_format=extra.get("response_format", openai.NOT_GIVEN), extra_body=body)
    assert problem in e.value.message
    assert requests.get(so_server.url + "/health", timeout=10).status_code == 200


def test_grammar_backend_none_refuses_naming_the_flag(launch_server):
    import openai

    s = launch_server("--grammar-backend", "none")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=MSGS, max_tokens=5,
                                       response_format={"type": "json_object"})
    assert "--grammar-backend none" in e.value.message
    r = requests.post(s.url + "/generate", json={"text": "x", "sampling_params": {"regex": "a+", "max_new_tokens": 4}},
                      timeout=60)
    assert r.status_code == 400 and "--grammar-backend none" in r.text
    plain = client.chat.completions.create(model="default", messages=MSGS, max_tokens=3)
    assert plain.choices[0].finish_reason == "length"
    s.close()


def test_engine_generate_with_constraints(model_dir):
    import sglang
    from conftest import TEST_DEVICE
    from sglang.srt.errors import GenerateError

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        engine = sglang.Engine(model_path=str(model_dir), dtype="float32", device=TEST_DEVICE, log_level="warning",
                               max_total_tokens=1024, constrained_json_disable_any_whitespace=True)
    try:
        outs = engine.generate(["Widget:", "Another widget:"], sampling_params={
            "max_new_tokens": MAX_TOKENS, "temperature": 1.0, "seed": 7, "json_schema": SCHEMA})
        for out in outs:
            n = iter(range(100))  # the JSON with each string replaced by a distinct short one
            skeleton = re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: f'"{next(n)}"', out["text"])
            assert skeleton == json.dumps(json.loads(skeleton)), out["text"]  # no free whitespace: ", " and ": " only
            check_schema(loads(out["text"]))
            assert out["meta_info"]["finish_reason"]["type"] == "stop"
        with pytest.raises(GenerateError, match="invalid regex"):
            engine.generate("x", sampling_params={"max_new_tokens": 4, "regex": "(unclosed"})
    finally:
        engine.shutdown()


def test_tensor_parallel_ranks_agree_on_the_grammar(launch_server):
    """TP=2: each rank compiles and masks on its own; the ranks' queues and matchers stay in step (a rank
    ahead or behind would hang the collectives or break the output)."""
    import openai

    s = launch_server("--tp-size", "2", "--constrained-json-max-whitespace-cnt", "1")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=120)
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
    resp = client.chat.completions.create(model="default", messages=MSGS, max_tokens=MAX_TOKENS, temperature=1.0,
                                          seed=5, n=2, response_format=fmt)
    for choice in resp.choices:
        check_schema(loads(choice.message.content))
        assert choice.finish_reason == "stop"
    out = client.completions.create(model="default", prompt="Code:", max_tokens=MAX_TOKENS, temperature=0,
                                    extra_body={"regex": REGEX}).choices[0].text
    assert re.fullmatch(REGEX, out)
    s.close()
