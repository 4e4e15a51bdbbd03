"""/parse_function_call and /separate_reasoning bodies -> upstream's response shapes, the server's
parsers as defaults, and 400s naming what is wrong."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang.srt.entrypoints.parse_routes import parse_function_call, separate_reasoning
from sglang.srt.errors import GenerateError

ARGS = SimpleNamespace(tool_call_parser=None, reasoning_parser="qwen3-thinking")
CALL = 'x <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'


def test_shapes_and_defaults():
    assert parse_function_call({"text": CALL}, ARGS, "<tool_call>") == {
        "normal_text": "x", "calls": [{"tool_index": 0, "name": "f", "parameters": '{"a": 1}'}]}
    tools = [{"type": "function", "function": {"name": "g"}}]
    assert parse_function_call({"text": CALL, "tools": tools, "tool_call_parser": "qwen"}, ARGS, None)["calls"] == []
    assert separate_reasoning({"text": "r</think>t"}, ARGS) == {"reasoning_text": "r", "text": "t"}
    assert separate_reasoning({"text": "r", "reasoning_parser": "qwen3"}, ARGS) == {"reasoning_text": "", "text": "r"}


@pytest.mark.parametrize("call, message", [
    (lambda: parse_function_call({"text": CALL}, ARGS, None), "tool_call_parser is needed"),
    (lambda: parse_function_call({"text": CALL, "tool_call_parser": "mistral"}, ARGS, None), "tool_call_parser mistral"),
    (lambda: parse_function_call({"text": 3}, ARGS, "<tool_call>"), "text must be a string"),
    (lambda: parse_function_call({"text": "", "tols": []}, ARGS, "<tool_call>"), "supplied: tols"),
    (lambda: separate_reasoning({"text": "x"}, SimpleNamespace(reasoning_parser=None)), "reasoning_parser is needed"),
    (lambda: separate_reasoning({"text": "x", "reasoning_parser": "r1"}, ARGS), "reasoning_parser: unknown"),
])
def test_refusals(call, message):
    with pytest.raises(GenerateError, match=message):
        call()
