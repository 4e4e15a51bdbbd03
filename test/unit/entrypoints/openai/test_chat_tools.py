"""Chat requests with tools and reasoning -> what the engine receives (tools for the template, the call
grammar for `required` / a named function), the 400s naming what cannot be honoured, and each choice's
output -> content, reasoning_content and tool_calls (OpenAI's shapes, finish reason tool_calls)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import orjson
import pytest

from sglang.srt.entrypoints.openai.chat_output import ChatOutputOptions, ChatOutputProcessor
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.errors import GenerateError

MSG = [{"role": "user", "content": "weather?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add"}}]
QWEN_TEMPLATE = "{% if tools %}<tool_call>{% endif %}"


def serving(tool_call_parser=None, reasoning_parser=None, template=QWEN_TEMPLATE) -> OpenAIServingChat:
    tm = SimpleNamespace(server_args=SimpleNamespace(tool_call_parser=tool_call_parser,
                                                     reasoning_parser=reasoning_parser),
                         builder=SimpleNamespace(tokenizer=SimpleNamespace(chat_template=template)))
    return OpenAIServingChat(tm, "default")


def convert(srv: OpenAIServingChat, **body):
    req = srv._parse(orjson.dumps({"messages": MSG, **body}))
    return srv._convert_to_internal_request(req, 0.0)


def refusal(srv: OpenAIServingChat, **body) -> str:
    with pytest.raises(GenerateError) as e:
        convert(srv, **body)
    return e.value.message


def test_tools_reach_the_template_and_auto_constrains_nothing():
    obj = convert(serving(), tools=TOOLS)
    assert obj.tools == TOOLS and "structural_tag" not in obj.sampling_params
    assert convert(serving(), tools=TOOLS, tool_choice="none").tools is None  # none: not offered at all


@pytest.mark.parametrize("choice, parallel, names, stop_after_first", [
    ("required", True, ["get_weather", "add"], False),
    ("required", False, ["get_weather", "add"], True),
    ({"type": "function", "function": {"name": "add"}}, True, ["add"], True),
])
def test_required_and_named_choices_become_the_call_grammar(choice, parallel, names, stop_after_first):
    obj = convert(serving(), tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel)
    fmt = json.loads(obj.sampling_params["structural_tag"])["format"]
    assert [t["begin"] for t in fmt["tags"]] == [f'<tool_call>\n{{"name": "{n}", "arguments": ' for n in names]
    assert fmt["at_least_one"] and fmt["stop_after_first"] == stop_after_first
    assert fmt["tags"][0]["end"] == "}\n</tool_call>"


def test_a_strict_function_under_auto_constrains_the_calls_that_begin():
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    fmt = json.loads(convert(serving(), tools=strict).sampling_params["structural_tag"])["format"]
    assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<tool_call>"] and len(fmt["tags"]) == 2
    assert "cannot be combined" in refusal(serving(), tools=strict, regex="a+")


def test_refusals_name_the_field():
    assert "tools are not supported with this model's chat template" in refusal(serving(template="{{ x }}"), tools=TOOLS)
    assert convert(serving("qwen25", template="{{ x }}"), tools=TOOLS).tools == TOOLS  # the flag names the format
    assert "tool_choice 'required' needs tools" in refusal(serving(), tool_choice="required")
    assert "Tool 'nope' not found in tools list" in refusal(  # upstream's wording, which its tests check
        serving(), tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    bad_params = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "unknown_type"}}}}}]
    assert "invalid 'parameters' schema of function 'f': unknown type 'unknown_type' at $.properties.x" in refusal(
        serving(), tools=bad_params, tool_choice="required")
    assert "cannot be combined with another output constraint (regex)" in refusal(
        serving(), tools=TOOLS, tool_choice="required", regex="a+")
    assert refusal(serving(), parallel_tool_calls=False) == "parallel_tool_calls false needs tools"
    assert "continue_final_message needs the last message" in refusal(serving(), continue_final_message=True)
    assert "only tools of type 'function'" in refusal(serving(), tools=[{"type": "retrieval"}])


def test_reasoning_switches_off_without_a_parser_ask_for_nothing():
    """Upstream answers 200: `false` asks that nothing be separated, which a parserless server already does."""
    for field in ("separate_reasoning", "stream_reasoning"):
        assert convert(serving(), **{field: False}).messages == MSG


def test_a_property_named_type_is_data_not_a_bad_type():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"type": {"type": "string"}, "kind": {"type": ["string", "null"]}}}}}]
    assert "structural_tag" in convert(serving(), tools=tools, tool_choice="required").sampling_params


def test_history_with_tool_calls_and_results():
    history = [*MSG, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    srv = serving()
    obj = srv._convert_to_internal_request(srv._parse(orjson.dumps({"messages": history, "tools": TOOLS})), 0.0)
    assert obj.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'
    assert obj.messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


def test_output_becomes_reasoning_content_and_tool_calls():
    text = '<think>\nsunny?\n</think>\n\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    opts = ChatOutputOptions(reasoning_parser="qwen3", tool_parser="qwen25", tools=TOOLS)
    proc = ChatOutputProcessor(opts)
    piece = proc.final(text)
    assert (piece.reasoning, piece.content) == ("sunny?", "Checking.") and proc.made_calls
    (call,) = piece.tool_calls
    assert call.id.startswith("call_") and len(call.id) == 29 and call.type == "function" and call.index == 0
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Rome"}')
    # streamed one character at a time: the same reasoning, content, name and arguments
    proc = ChatOutputProcessor(opts)
    pieces = [proc.delta(ch) for ch in text] + [proc.delta("", last=True)]
    assert "".join(p.reasoning or "" for p in pieces) == "sunny?"
    assert "".join(p.content or "" for p in pieces) == "Checking."
    deltas = [c for p in pieces for c in (p.tool_calls or [])]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments for d in deltas) == '{"city": "Rome"}'
    plain = ChatOutputProcessor(ChatOutputOptions()).final("as is  ")
    assert (plain.content, plain.reasoning, plain.tool_calls) == ("as is  ", None, None)


def test_template_gets_arguments_as_objects():
    from sglang.srt.managers.chat_messages import split_chat_media

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": [1]}'}}
    msgs, _, _ = split_chat_media([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == {"a": [1]}
    bad = {**call, "function": {"name": "f", "arguments": "{oops"}}
    with pytest.raises(ValueError, match=r"messages\[0\].tool_calls\[0\].function.arguments is not valid JSON"):
        split_chat_media([{"role": "assistant", "tool_calls": [bad]}])
    with pytest.raises(ValueError, match=r"messages\[0\]: only assistant messages carry tool_calls"):
        split_chat_media([{"role": "user", "content": "x", "tool_calls": [call]}])


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_false_keeps_one_call_under_auto(parallel):
    """Under tool_choice auto with no strict function nothing constrains the output to one call: with
    parallel_tool_calls false the response carries only the first, whole and streamed."""
    two = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>')
    srv = serving()
    req = srv._parse(orjson.dumps({"messages": MSG, "tools": TOOLS, "parallel_tool_calls": parallel}))
    assert "structural_tag" not in srv._convert_to_internal_request(req, 0.0).sampling_params  # auto: no grammar
    ctx = SimpleNamespace(prompts=[])
    want = ["get_weather", "add"] if parallel else ["get_weather"]
    proc = srv._output_processor(req, ctx, 0)
    piece = proc.final(two)
    assert [c.function.name for c in piece.tool_calls] == want and proc.made_calls
    assert [c.index for c in piece.tool_calls] == list(range(len(want))) and not piece.content
    proc = srv._output_processor(req, ctx, 0)
    deltas = [c for p in [proc.delta(ch) for ch in two] + [proc.delta("", last=True)] for c in (p.tool_calls or [])]
    assert [d.function.name for d in deltas if d.function.name] == want
    assert {d.index for d in deltas} == set(range(len(want)))
