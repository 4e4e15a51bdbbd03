"""Tool calls through the openai client on the random-weight tiny model, whose free output never calls a
tool (checked): with tool_choice required or a named function only the call grammar makes the output
calls to offered functions whose arguments validate (jsonschema), greedy and sampled, streamed (name
first, then argument pieces) and not; history with tool calls and results is rendered; what cannot be honoured is a 400 naming it."""

from __future__ import annotations

import json

import openai
import pytest
import requests

# a test dependency (pyproject's test extra); the GPU image lacks it and its suite collects this module
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 999}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 300  # far above what the calls need: the grammar's end, not the limit, ends each output


@pytest.fixture(scope="module")
def oai(tools_server):
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _chat(oai, **kw):
    kw.setdefault("max_tokens", MAX_TOKENS)
    kw.setdefault("temperature", 0)
    kw.setdefault("messages", MSGS)
    return oai.chat.completions.create(model="default", tools=TOOLS, **kw)


def check_calls(calls, names=SCHEMAS) -> None:
    assert calls
    for i, call in enumerate(calls):
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        assert isinstance(call.function.arguments, str)
        jsonschema.validate(json.loads(call.function.arguments, strict=False), SCHEMAS[call.function.name])


def test_free_output_calls_no_tool(oai):
    choice = _chat(oai, max_tokens=40).choices[0]  # tool_choice auto (the default with tools)
    assert choice.message.tool_calls is None and choice.finish_reason == "length" and choice.message.content


@pytest.mark.parametrize("temperature, seed", [(0, None), (1.0, 7)])
def test_required_parallel(oai, temperature, seed):
    """Parallel calls: the random model rarely picks the grammar's end over another call, so the limit may
    cut the last one; every complete call validates, the cut one stays in the content."""
    choice = _chat(oai, tool_choice="required", temperature=temperature, seed=seed, max_tokens=160).choices[0]
    check_calls(choice.message.tool_calls)
    assert len({c.id for c in choice.message.tool_calls}) == len(choice.message.tool_calls)
    assert choice.message.reasoning_content is None
    if choice.finish_reason == "length":
        assert choice.message.content.startswith("<tool_call>")
    else:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None


def test_named_function_and_one_call(oai):
    named = {"type": "function", "function": {"name": "add"}}
    for kw in (dict(tool_choice=named, temperature=1.0, seed=3), dict(tool_choice="required", parallel_tool_calls=False)):
        choice = _chat(oai, **kw).choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        check_calls(choice.message.tool_calls, ["add"] if kw["tool_choice"] is named else SCHEMAS)


def test_streamed_calls_name_first_then_arguments(tools_server):
    body = {"model": "default", "messages": MSGS, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
            "max_tokens": MAX_TOKENS, "stream": True, "parallel_tool_calls": False}
    calls, finish = {}, None
    with requests.post(tools_server.url + "/v1/chat/completions", json=body, stream=True, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta = choice["delta"]
            assert {"content", "reasoning_content", "tool_calls"} <= set(delta)  # null when empty, always there
            for tc in delta["tool_calls"] or []:
                if tc["index"] not in calls:  # a call's first delta: id, type and name
                    assert tc["id"].startswith("call_") and tc["type"] == "function" and tc["function"]["name"]
                    calls[tc["index"]] = [tc["function"]["name"], ""]
                else:
                    assert "name" not in tc["function"] and "id" not in tc
                calls[tc["index"]][1] += tc["function"]["arguments"]
            finish = choice["finish_reason"] or finish
    assert finish == "tool_calls" and sorted(calls) == list(range(len(calls)))
    for name, args in calls.values():
        jsonschema.validate(json.loads(args, strict=False), SCHEMAS[name])
    first = _chat(openai.OpenAI(base_url=tools_server.url + "/v1", api_key="none"), tool_choice="required",
                  parallel_tool_calls=False)
    assert [(c.function.name, c.function.arguments) for c in first.choices[0].message.tool_calls] == \
        [tuple(calls[i]) for i in sorted(calls)]  # the same greedy output, streamed or not


def test_history_with_tool_results(oai):
    call = _chat(oai, tool_choice="required", parallel_tool_calls=False).choices[0].message.tool_calls[0]
    history = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "22 degrees and sunny"}]
    resp = _chat(oai, messages=history, tool_choice="required", parallel_tool_calls=False)
    check_calls(resp.choices[0].message.tool_calls)
    shorter = _chat(oai, messages=history[:2], tool_choice="required", parallel_tool_calls=False)
    assert resp.usage.prompt_tokens > shorter.usage.prompt_tokens  # the tool result is in the prompt


@pytest.mark.parametrize("kw, message", [
    (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "Tool 'nope' not found in tools list"),
    (dict(tool_choice="required", response_format={"type": "json_object"}), "cannot be combined"),
    (dict(tool_choice="sometimes"), "tool_choice must be"),
])
def test_refused_with_400(oai, kw, message):
    with pytest.raises(openai.BadRequestError, match=message):
        _chat(oai, **kw)
