"""OpenAI bodies' output constraints -> the engine's sampling parameters: response_format (text,
json_object, json_schema), top-level json_schema / regex / ebnf, vLLM's guided_* on chat and
completions; two constraints or a malformed one is a 400 naming it; what reaches the engine verifies."""

from __future__ import annotations

import json

import pytest

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.entrypoints.openai.serving_base import sampling_from_request
from sglang.srt.errors import GenerateError
from sglang.srt.managers.request_validation import make_sampling_params

MSG = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _chat(**body):
    req = ChatCompletionRequest.model_validate({"messages": MSG, **body})
    assert req.unsupported() is None
    return sampling_from_request(req, None)


def _completion(**body):
    req = CompletionRequest.model_validate({"prompt": "x", **body})
    assert req.unsupported() is None
    return sampling_from_request(req, 16)


@pytest.mark.parametrize("convert", [_chat, _completion], ids=["chat", "completions"])
@pytest.mark.parametrize("body, key", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}),
     ("json_schema", SCHEMA)),
    (dict(response_format={"type": "json_object"}), ("json_schema", {"type": "object"})),
    (dict(json_schema=json.dumps(SCHEMA)), ("json_schema", SCHEMA)),
    (dict(guided_json=SCHEMA), ("json_schema", SCHEMA)),
    (dict(regex="[0-9]+"), ("regex", "[0-9]+")),
    (dict(guided_regex="[0-9]+"), ("regex", "[0-9]+")),
    (dict(guided_choice=["yes", "no"]), ("regex", "(yes|no)")),
    (dict(ebnf='root ::= "a"'), ("ebnf", 'root ::= "a"')),
    (dict(guided_grammar='root ::= "a"'), ("ebnf", 'root ::= "a"')),
])
def test_constraint_reaches_the_sampling_params(convert, body, key):
    params = convert(**body)
    kind, value = key
    got = params[kind]
    assert (json.loads(got) == value) if kind == "json_schema" else got == value
    params.pop("n")
    sp, _ = make_sampling_params(params)
    assert sp.grammar_key()[0] == kind


def test_text_format_and_no_constraint_leave_params_plain():
    for params in (_chat(response_format={"type": "text"}), _chat(), _completion()):
        assert not {"json_schema", "regex", "ebnf"} & set(params)


@pytest.mark.parametrize("body, message", [
    (dict(regex="a", guided_choice=["b"]), "at most one output constraint per request: got regex and guided_choice"),
    (dict(response_format={"type": "json_object"}, ebnf='root ::= "a"'), "got response_format json_object and ebnf"),
    (dict(response_format={"type": "xml"}), "response_format type 'xml' is not supported"),
    (dict(guided_json="{not json"), "guided_json is not valid JSON"),
])
def test_refusals_name_the_fields(body, message):
    with pytest.raises(GenerateError) as e:
        _chat(**body)
    assert e.value.status_code == 400 and message in e.value.message
