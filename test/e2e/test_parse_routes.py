"""Upstream's native parsing routes on the tool/reasoning server: /parse_function_call and
/separate_reasoning answer in upstream's shapes; an unknown parser is a 400 naming it."""

from __future__ import annotations

import requests

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def test_parse_function_call_route(tools_server):
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    r = requests.post(tools_server.url + "/parse_function_call", json={"text": text, "tools": TOOLS}, timeout=30)
    assert r.status_code == 200
    assert r.json() == {"normal_text": "Sure.", "calls": [{"tool_index": 0, "name": "add", "parameters": '{"a": 1, "b": 2}'}]}
    r = requests.post(tools_server.url + "/parse_function_call", json={"text": text, "tool_call_parser": "llama3"}, timeout=30)
    assert r.status_code == 400 and "tool_call_parser llama3" in r.json()["error"]["message"]


def test_separate_reasoning_route(tools_server):
    r = requests.post(tools_server.url + "/separate_reasoning", json={"text": "<think> a </think>\nb"}, timeout=30)
    assert r.status_code == 200 and r.json() == {"reasoning_text": "a", "text": "b"}
    r = requests.post(tools_server.url + "/separate_reasoning", json={"text": "x", "reasoning_parser": "r1"}, timeout=30)
    assert r.status_code == 400 and "reasoning_parser" in r.json()["error"]["message"]
