"""Upstream's native parsing routes, over the same parsers the chat endpoint uses:

- `POST /parse_function_call` `{"text", "tools", "tool_call_parser"}` -> `{"normal_text", "calls":
  [{"tool_index", "name", "parameters"}]}` (parameters: the arguments' JSON text);
- `POST /separate_reasoning` `{"text", "reasoning_parser"}` -> `{"reasoning_text", "text"}`.

A parser left out is the server's (`--tool-call-parser` or the chat template's format,
`--reasoning-parser`); an unknown one or a malformed body is a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.managers.field_policy import check_fields
from sglang.srt.function_call.function_call_parser import FunctionCallParser, resolve_tool_call_parser
from sglang.srt.function_call.tool_constraint import ToolChoiceError, function_of
from sglang.srt.errors import GenerateError
from sglang.srt.parser.reasoning_parser import ReasoningParser


def _fields(data: dict[str, Any], allowed: tuple[str, ...]) -> None:
    problem = check_fields(data, allowed, {})
    if problem:
        raise GenerateError(problem)
    if not isinstance(data.get("text"), str):
        raise GenerateError("text must be a string")


def _name(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise GenerateError(f"{key} must be a string")
    return value


def parse_function_call(data: dict[str, Any], server_args: Any, chat_template: str | None) -> dict[str, Any]:
    _fields(data, ("text", "tools", "tool_call_parser"))
    tools = data.get("tools") or []
    if not isinstance(tools, list):
        raise GenerateError("tools must be a list of tool objects")
    try:
        for i, tool in enumerate(tools):
            function_of(tool, f"tools[{i}]")
        name = resolve_tool_call_parser(_name(data, "tool_call_parser")
                                        or getattr(server_args, "tool_call_parser", None), chat_template)
    except (ToolChoiceError, ValueError) as e:
        raise GenerateError(str(e).replace("--tool-call-parser", "tool_call_parser")) from None
    if name is None:
        raise GenerateError("tool_call_parser is needed: this server's chat template has no tool-call format")
    normal, calls = FunctionCallParser(tools or None, name).parse_non_stream(data["text"])
    return {"normal_text": normal, "calls": [c.to_dict() for c in calls]}


def separate_reasoning(data: dict[str, Any], server_args: Any) -> dict[str, Any]:
    _fields(data, ("text", "reasoning_parser"))
    name = _name(data, "reasoning_parser") or getattr(server_args, "reasoning_parser", None)
    if name is None:
        raise GenerateError("reasoning_parser is needed: this server runs without --reasoning-parser")
    try:
        parser = ReasoningParser(name)
    except ValueError as e:
        raise GenerateError(f"reasoning_parser: {e}") from None
    reasoning, text = parser.parse_non_stream(data["text"])
    return {"reasoning_text": reasoning or "", "text": text or ""}
