"""The qwen25 tool-call parser: one-shot parsing, and streaming that gives the same calls and content for
every way the output can be cut into pieces (every single cut point, every piece size, random cuts)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.function_call.function_call_parser import FunctionCallParser, resolve_tool_call_parser

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "add"}},
]
TWO_CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris\\"", '
             '"days": [1, {"x": "]"}]}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n')
OUTPUTS = [
    TWO_CALLS,
    "no calls at all, trailing space kept \n",
    '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>',
    'text <tool_call>\n{"name": "unknown_fn", "arguments": {}}\n</tool_call> after',
    '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 2}"}\n</tool_call>',  # arguments given as a string
    '<tool_call>{"arguments": {"b": 3}, "name": "add"}</tool_call>',  # arguments before name
    "almost a tag: <tool_ca",
    "<tool_call>\n{not json}\n</tool_call>done",
]


def one_shot(text: str, tools=TOOLS):
    return FunctionCallParser(tools, "qwen25").parse_non_stream(text)


def streamed(pieces: list[str], tools=TOOLS):
    """(content, calls) from streaming: the pieces of each call merged by index, as a client does."""
    parser = FunctionCallParser(tools, "qwen25")
    content, calls = "", {}
    steps = [parser.parse_stream_chunk(p) for p in pieces] + [parser.finish()]
    for text, items in steps:
        content += text
        for item in items:
            if item.name is not None:
                assert item.tool_index not in calls, "a call's name is sent once, first"
                calls[item.tool_index] = [item.name, ""]
            calls[item.tool_index][1] += item.parameters
    return content, [tuple(calls[i]) for i in sorted(calls)]


def as_pairs(calls):
    return [(c.name, c.parameters) for c in calls]


def test_two_calls_one_shot():
    content, calls = one_shot(TWO_CALLS)
    assert content == "Let me check."
    assert [c.tool_index for c in calls] == [0, 1]
    assert calls[0].name == "get_weather" and json.loads(calls[0].parameters) == {"city": 'Pa}ris"', "days": [1, {"x": "]"}]}
    assert calls[0].parameters == '{"city": "Pa}ris\\"", "days": [1, {"x": "]"}]}'  # the model's own text
    assert (calls[1].name, calls[1].parameters) == ("add", '{"a": 1}')


def test_what_is_not_a_call():
    assert one_shot("no calls at all, trailing space kept \n") == ("no calls at all, trailing space kept \n", [])
    content, calls = one_shot('text <tool_call>\n{"name": "unknown_fn", "arguments": {}}\n</tool_call> after')
    assert (content, calls) == ("textafter", [])  # a function the request did not offer is dropped
    assert one_shot("<tool_call>\n{not json}\n</tool_call>done") == ("done", [])
    unclosed = 'cut <tool_call>\n{"name": "add", "argu'
    assert one_shot(unclosed) == (unclosed, [])  # the length limit cut it: left in the content
    _, calls = one_shot('<tool_call>{"name": "other", "arguments": {}}</tool_call>', tools=None)
    assert as_pairs(calls) == [("other", "{}")]  # no tools given (/parse_function_call): any name


def test_argument_forms():
    _, calls = one_shot('<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 2}"}\n</tool_call>')
    assert as_pairs(calls) == [("add", '{"a": 2}')]
    _, calls = one_shot('<tool_call>{"arguments": {"b": 3}, "name": "add"}</tool_call>')
    assert as_pairs(calls) == [("add", '{"b": 3}')]
    _, calls = one_shot('<tool_call>{"name": "add"}</tool_call>')
    assert as_pairs(calls) == [("add", "{}")]


@pytest.mark.parametrize("text", OUTPUTS)
def test_every_cut_point_gives_the_one_shot_result(text):
    content, calls = one_shot(text)
    want = (content, as_pairs(calls))
    for cut in range(len(text) + 1):
        assert streamed([text[:cut], text[cut:]]) == want, cut
    for size in (1, 2, 3, 5, 8):
        assert streamed([text[i:i + size] for i in range(0, len(text), size)]) == want, size


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(TWO_CALLS)), max_size=12))
def test_random_cuts(cuts):
    bounds = [0, *sorted(cuts), len(TWO_CALLS)]
    content, calls = one_shot(TWO_CALLS)
    assert streamed([TWO_CALLS[a:b] for a, b in zip(bounds, bounds[1:])]) == (content, as_pairs(calls))


def test_stream_sends_the_name_first_then_argument_pieces():
    parser = FunctionCallParser(TOOLS, "qwen25")
    text, items = parser.parse_stream_chunk('Hi <tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert text == "Hi"
    assert [(i.tool_index, i.name, i.parameters) for i in items] == [(0, "get_weather", ""), (0, None, '{"ci')]
    text, items = parser.parse_stream_chunk('ty": "Rome"}}\n</tool_call>')
    assert text == "" and [(i.name, i.parameters) for i in items] == [(None, 'ty": "Rome"}')]


def test_parser_pick():
    assert resolve_tool_call_parser("qwen", None) == "qwen"
    assert resolve_tool_call_parser(None, "... <tool_call> ...") == "qwen25"
    assert resolve_tool_call_parser("auto", "... <tool_call> ...") == "qwen25"
    assert resolve_tool_call_parser(None, "{{ messages }}") is None
    with pytest.raises(ValueError, match="llama3"):
        resolve_tool_call_parser("llama3", None)
    with pytest.raises(ValueError, match="unknown tool_call_parser"):
        FunctionCallParser(TOOLS, "mistral")
